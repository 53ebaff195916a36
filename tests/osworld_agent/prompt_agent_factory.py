"""OSWorld's own PromptAgent (mm_agents/agent.py of desktop-env on PyPI), built as OSWorld's run.py builds
it for the screenshot observation and the pyautogui action space; nothing of it is changed. Its model is
read from GH_TEST_PROMPT_AGENT_MODEL (a `gpt...` name: PromptAgent then posts to OPENAI_BASE_URL)."""

from __future__ import annotations

import os
from typing import Any


def make() -> Any:
    from mm_agents.agent import PromptAgent

    return PromptAgent(model=os.environ["GH_TEST_PROMPT_AGENT_MODEL"], max_tokens=1500, top_p=0.9,
                       temperature=1.0, action_space="pyautogui", observation_type="screenshot",
                       max_trajectory_length=3)

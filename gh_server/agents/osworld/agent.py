"""gh-server's side of agent kind `osworld`: a command agent whose command is OSWorld's loop (loop.py).

The loop runs in the command agents' sandbox (gh_server/agents/sandbox.py: its own uid, an explicit
environment) with the configured interpreter (`python`), so the user's code never runs inside gh-server; its only way
to the machine is the machine API with the attempt's token, like every external agent's.
"""

from __future__ import annotations

import json
from pathlib import Path

from gh_server.agents.base import AgentContext, AgentOutcome
from gh_server.agents.external import CommandAgent
from gh_server.agents.sandbox import Sandbox
from gh_server.settings import AgentConfig

HERE = Path(__file__).parent


def boot_source() -> str:
    """The program `python -c` runs: computer13.py as module `computer13`, then loop.py as __main__. Given
    as source, not as paths: the sandbox's uid may not reach this checkout (nor gh-server's venv)."""
    c13 = (HERE / "computer13.py").read_text()
    loop = (HERE / "loop.py").read_text()
    return ("import sys, types\n"
            "m = sys.modules['computer13'] = types.ModuleType('computer13')\n"
            f"exec(compile({c13!r}, 'gh-osworld/computer13.py', 'exec'), m.__dict__)\n"
            f"exec(compile({loop!r}, 'gh-osworld/loop.py', 'exec'), {{'__name__': '__main__'}})\n")


class OsworldAgent:
    def __init__(self, agent_id: str, cfg: AgentConfig, sandbox: Sandbox) -> None:
        config = {"agent": cfg.agent, "python_path": cfg.python_path, "observation": cfg.observation,
                  "action_space": cfg.action_space, "max_steps": cfg.max_steps,
                  "sleep_after_execution": cfg.sleep_after_execution}
        env = {**cfg.env, "GH_OSWORLD_CONFIG": json.dumps(config)}
        self._command = CommandAgent(agent_id, [cfg.python, "-c", boot_source()], cfg.timeout, sandbox, env,
                                     cfg.pass_env)

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        return await self._command.run(ctx)

"""What the step loop needs of a model API, and what each of the three gives back.

A `Conversation` holds one attempt's context in its API's own shapes. The loop calls it in phases:
`begin` (the prompt and the first screen), then per step `call` (one model call: the SDK's request,
parsed into a `Turn`) and `act` (each action of the turn through `do`, the screen after them through
`look`, and the results put into the context in the API's shape). The API modules own the wire
shapes; the loop owns the lifecycle, the limits and the outcome.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gh_server.agents.model import actions as A
from gh_server.agents.model.actor import ActResult
from gh_server.agents.model.screen import Shot
from gh_server.agents.model.usage import CallUsage
from gh_server.settings import ModelAgentConfig, ModelTool

Do = Callable[[A.Action], Awaitable[ActResult]]
Look = Callable[[], Awaitable[Shot]]

SYSTEM = """You are a support agent operating a customer's computer to solve their problem. You see its screen \
({width}x{height} pixels; x grows to the right, y downwards) and act with the tools you are given. \
Work on the machine yourself; ask the user (ask_user) only for what only they know. Ask the operator \
(request_approval) before anything destructive or risky. When the problem is solved, stop calling tools \
and reply with your final answer to the customer. If it cannot be done, call infeasible with the reason."""

# The tools beside the computer, as plain function tools (name, description, JSON schema of the input).
EXTRA_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "ask_user": ("Ask the customer a question (they answer in words, or act on their machine for you).",
                 {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]}),
    "request_approval": ("Ask the operator's leave before doing something risky; the answer is approve or deny.",
                         {"type": "object", "properties": {"what": {"type": "string"}}, "required": ["what"]}),
    "infeasible": ("Give up: the task cannot be done. Say why.",
                   {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]}),
    "shell": ("Run a script on the machine as its administrator (sh on Linux, PowerShell on Windows) and get "
              "its exit code and output.",
              {"type": "object", "properties": {"script": {"type": "string"},
                                                "timeout": {"type": "number", "description": "seconds"}},
               "required": ["script"]}),
}


def extra_tools(cfg: ModelAgentConfig) -> dict[str, tuple[str, dict[str, Any]]]:
    return {k: v for k, v in EXTRA_TOOLS.items() if k != "shell" or ModelTool.SHELL in cfg.tools}


def extra_action(name: str, args: Any) -> A.Action:
    """A call of one of EXTRA_TOOLS as our action.

    Raises:
        InvalidAction: an unknown tool or arguments that do not fit.
    """
    if name not in EXTRA_TOOLS:
        raise A.InvalidAction(f"there is no tool {name!r}")
    if not isinstance(args, dict):
        raise A.InvalidAction(f"{name}: the arguments must be a JSON object")
    return A.parse({"type": name, **args})


def system_prompt(cfg: ModelAgentConfig, size: tuple[int, int]) -> str:
    text = SYSTEM.format(width=size[0], height=size[1])
    return text + ("\n\n" + cfg.system if cfg.system else "")


@dataclass
class Turn:
    """One model reply: its words, what it cost, and (adapter-specific) the calls it made."""

    text: str
    usage: CallUsage | None  # from the SDK's reply; None when the reply carried no usage
    calls: list[Any] = field(default_factory=list)
    problem: str | None = None  # the reply could not be read; sent back as an error, counted as invalid

    @property
    def acts(self) -> bool:
        return bool(self.calls) or self.problem is not None


@dataclass
class Acted:
    """What a turn's actions came to."""

    done: int = 0  # actions carried out
    invalid: list[str] = field(default_factory=list)  # the model's mistakes, sent back as errors
    end: A.Done | A.Infeasible | None = None


class Conversation(ABC):
    coordinates: str  # how this API's coordinates are read, recorded on the attempt

    @abstractmethod
    def begin(self, prompt: str, shot: Shot) -> None: ...

    @abstractmethod
    async def call(self) -> Turn:
        """One model call with the context so far (the SDK retries 429/5xx itself; the loop bounds it).

        Raises:
            the SDK's APIError subclasses (the loop turns them into our errors).
        """

    @abstractmethod
    async def act(self, turn: Turn, do: Do, look: Look) -> Acted:
        """Carry out the turn's calls through `do`, look at the screen after them, and put the results (errors
        for what could not be read or done) into the context for the next call."""

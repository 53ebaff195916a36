"""The agent's final answer, as every guest's check can receive it (docs/agents.md, "The answer").

The check after gets the answer in the environment variable `GH_AGENT_ANSWER` and, byte for byte, in
the file `GH_AGENT_ANSWER_FILE` (gh_runner.answer_file). The limit is chosen so that the variable fits
every guest we run checks on, whatever the characters:

- Windows: one environment variable holds at most 32,767 UTF-16 units. A character outside the
  Basic Multilingual Plane (an emoji) takes two, so 16,000 characters are at most 32,000 units, plus
  `GH_AGENT_ANSWER=` (16) and the terminating NUL: 32,017.
- Linux: one `NAME=value` string passed to execve is at most 131,072 bytes (MAX_ARG_STRLEN). A
  character is at most 4 bytes of UTF-8: 64,000 bytes, half of it, leaving room for the rest of the
  environment under the kernel's total.
- gh-execd's and qemu-ga's requests carry it as JSON or a length-prefixed field well within their
  buffers.

A NUL cannot be carried in any environment variable (C strings end there), and a check reads text:
the answer must be valid UTF-8 (a Python str that encodes strictly, so no lone surrogate). The same
rule holds for every text an agent gives that reaches a guest or a model: `ask_user` questions,
`infeasible` reasons and typed text (each checked where it is taken in).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from gh_wire.vocab import AgentFault

ANSWER_MAX_CHARS = 16_000


def text_fault(text: str, max_chars: int = ANSWER_MAX_CHARS) -> AgentFault | None:
    """What breaks the contract in `text`, or None when it may reach a check."""
    if "\x00" in text:
        return AgentFault.ANSWER_HAS_NUL
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return AgentFault.ANSWER_NOT_UTF8
    if len(text) > max_chars:
        return AgentFault.ANSWER_TOO_LONG
    return None


def decode_answer(raw: bytes) -> str | AgentFault:
    """Bytes an agent sent (a command's stdout, an HTTP body) as text, or the fault: never replaced
    characters, so what the check gets is what the agent said."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return AgentFault.ANSWER_NOT_UTF8


def describe(fault: AgentFault, text_len: int | None = None) -> str:
    """The fault as the attempt's `task_end.note` (the typed reason is `task_end.fault`)."""
    if fault is AgentFault.ANSWER_TOO_LONG:
        return f"the answer has {text_len:,} characters; the limit is {ANSWER_MAX_CHARS:,}"
    if fault is AgentFault.ANSWER_HAS_NUL:
        return "the answer holds a NUL character"
    if fault is AgentFault.ANSWER_NOT_UTF8:
        return "the answer is not valid UTF-8"
    return "the model's reply did not end within the agent's call timeout"


def _guest_text(text: str) -> str:
    """A pydantic check for text an agent sends towards a guest or a model (typed text, a script, an env
    value, a question): a 400 (machine API) or an invalid action (model agent), never a channel's error."""
    if "\x00" in text:
        raise ValueError("must not contain a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 (no lone surrogate)") from None
    return text


GuestText = Annotated[str, AfterValidator(_guest_text)]

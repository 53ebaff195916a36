"""The rubric judge and the simulated customer, through an OpenAI-compatible chat endpoint.

Both are optional in the settings. The judge sees the rubric, the customer's prompt, the agent's
final answer, the check's output and the first and last screens of the replay; the customer sees its
persona, the names (never the secret values) of its facts, the agent's question and the machine's
screen, and never the expected fix or the check. It acts through the runner, never through the model:
it types a fact's value into the focused field or accepts an admin prompt when its reply asks to.
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server.agents.base import AgentError
from gh_server.models import ReplayFrame
from gh_server.settings import ModelEndpoint
from gh_wire import protocol

if TYPE_CHECKING:
    from gh_server.dbqueue import DbQueue

JUDGE_SYSTEM = (
    "You judge whether a support agent fixed a customer's computer problem. You get the rubric (what a fix "
    "looks like), what the customer asked, the agent's final answer, the check script's output if any, and the "
    "first and last screens. Reply with only a JSON object: {\"passed\": true|false, \"reason\": \"one or two "
    "plain sentences\"}."
)
CUSTOMER_SYSTEM = (
    "You play a customer who asked a support agent for help with their computer. Answer the agent's question "
    "the way this person would, briefly. You do not know how to fix the problem. Persona: {persona}\n"
    "Facts you know (by name): {facts}. You do not know the value of a fact marked secret, but you can type it "
    "into the field that has focus on the screen, the way a person types a password.\n{steps}{admin}"
    "Reply with only a JSON object: {{\"answer\": \"what you say\", \"type_fact\": \"the name of a fact to "
    "type now, or null\", \"click_yes\": true only to accept an administrator prompt on the screen now}}."
)
DOES_STEPS = "When the agent asks you to do something on the computer, you do it if you can.\n"
HANDS_STEPS_BACK = ("When the agent asks you to do the fix or its steps yourself, you hand them back: "
                    "\"Could you do that for me?\"\n")
CLICKS_ADMIN = "When the agent asks you to accept an administrator prompt, you click Yes.\n"
NO_ADMIN = "You never accept administrator prompts: you do not know that password.\n"


@dataclass
class CustomerReply:
    answer: str
    type_fact: str | None = None  # the name of a fact to type into the focused field
    click_yes: bool = False  # accept an administrator prompt


def parse_customer_reply(text: str) -> CustomerReply:
    """The JSON asked for; a model that answered in prose still answers (with no action)."""
    m = re.search(r"\{.*\}", text, re.S)
    try:
        data = json.loads(m.group(0)) if m else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("answer"), str):
        return CustomerReply(answer=text.strip())
    fact = data.get("type_fact")
    return CustomerReply(answer=data["answer"].strip(), type_fact=fact if isinstance(fact, str) and fact else None,
                         click_yes=data.get("click_yes") is True)


# Tests and callers may swap the transport (e.g. httpx.MockTransport) at this boundary.
transport: httpx.AsyncBaseTransport | None = None


async def chat(endpoint: ModelEndpoint, messages: list[dict[str, Any]], *, json_mode: bool = False,
               usage: dict[str, float] | None = None) -> str:
    """The reply's text. `usage`, when given, gets the call's seconds and total tokens added to it (the
    evaluator's own overhead, reported apart from the agent's)."""
    started = time.monotonic()
    try:
        return await _chat(endpoint, messages, json_mode, usage)
    finally:
        if usage is not None:
            usage["seconds"] = round(usage.get("seconds", 0.0) + time.monotonic() - started, 3)
            usage["calls"] = usage.get("calls", 0) + 1


async def _chat(endpoint: ModelEndpoint, messages: list[dict[str, Any]], json_mode: bool,
                usage: dict[str, float] | None) -> str:
    body: dict[str, Any] = {"model": endpoint.model, "messages": messages, "temperature": 0}
    if json_mode:
        body["response_format"] = {"type": "json_object"}
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    url = endpoint.base_url.rstrip("/") + "/chat/completions"
    try:
        async with httpx.AsyncClient(timeout=endpoint.timeout, transport=transport) as client:
            resp = await client.post(url, json=body, headers=headers)
    except httpx.HTTPError as e:
        raise AgentError(f"the model endpoint {endpoint.base_url} failed: {type(e).__name__}") from None
    if resp.status_code >= 400:
        raise AgentError(f"the model endpoint {endpoint.base_url} answered HTTP {resp.status_code}")
    try:
        body = resp.json()
        text = str(body["choices"][0]["message"]["content"] or "")
    except (ValueError, KeyError, IndexError, TypeError):
        raise AgentError(f"the model endpoint {endpoint.base_url} sent no chat completion") from None
    tokens = (body.get("usage") or {}).get("total_tokens") if isinstance(body, dict) else None
    if usage is not None and isinstance(tokens, int):
        usage["tokens"] = usage.get("tokens", 0) + tokens
    return text


def parse_verdict(text: str) -> dict[str, Any]:
    m = re.search(r"\{.*\}", text, re.S)
    try:
        data = json.loads(m.group(0) if m else text)
    except ValueError:
        raise AgentError("the judge's reply was not the JSON verdict asked for") from None
    if not isinstance(data, dict) or not isinstance(data.get("passed"), bool):
        raise AgentError("the judge's reply has no boolean 'passed'")
    return {"passed": data["passed"], "reason": str(data.get("reason", ""))[:2000]}


def _first_last_frames(session: Session, attempt_id: str) -> list[bytes]:
    first = session.scalar(select(ReplayFrame.png).where(ReplayFrame.attempt_id == attempt_id)
                           .order_by(ReplayFrame.seq).limit(1))
    last = session.scalar(select(ReplayFrame.png).where(ReplayFrame.attempt_id == attempt_id)
                          .order_by(ReplayFrame.seq.desc()).limit(1))
    return [p for p in dict.fromkeys([first, last]) if p]


async def judge_attempt(endpoint: ModelEndpoint, dbq: DbQueue, attempt_id: str, case: dict[str, Any],
                        result: protocol.AttemptResult) -> dict[str, Any]:
    """{"passed", "reason"}, or {"error"} when the judge could not be asked (the attempt becomes an error)."""
    frames = await dbq.run(lambda s: _first_last_frames(s, attempt_id))
    rubric = (case.get("success") or {}).get("rubric")
    after = result.check_after.stdout_tail.strip()[-2000:] if result.check_after else "(no check script)"
    text = (f"Rubric: {rubric}\n\nCustomer's request: {case.get('prompt', '')}\n\n"
            f"Agent's final answer: {result.answer or '(none)'}\n\nCheck output after the task: {after}")
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    for png in frames:
        content.append({"type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}})
    usage: dict[str, float] = {}
    try:
        reply = await chat(endpoint, [{"role": "system", "content": JUDGE_SYSTEM},
                                      {"role": "user", "content": content}], json_mode=True, usage=usage)
        # Which judge (for its calibration against people's labels) and what judging cost, apart from the agent.
        return {**parse_verdict(reply), "judge_id": endpoint.model, "usage": usage}
    except AgentError as e:
        return {"error": f"rubric judge: {e}"}


async def ask_customer(endpoint: ModelEndpoint, case: dict[str, Any], question: str,
                       screen: bytes | None = None, usage: dict[str, float] | None = None) -> CustomerReply:
    customer = case.get("customer") or {}
    facts = customer.get("facts") or {}
    names = ", ".join(f"{k} (secret)" if isinstance(v, dict) else f"{k}: {v}" for k, v in facts.items()) or "none"
    system = CUSTOMER_SYSTEM.format(
        persona=customer.get("persona") or "An ordinary computer user.", facts=names,
        steps=DOES_STEPS if customer.get("does_steps", True) else HANDS_STEPS_BACK,
        admin=CLICKS_ADMIN if customer.get("clicks_admin_prompts") else NO_ADMIN)
    content: list[dict[str, Any]] = [{"type": "text", "text": f"Your request was: {case.get('prompt', '')}\n\n"
                                      f"The agent asks: {question}"}]
    if screen:
        content.append({"type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + base64.b64encode(screen).decode()}})
    reply = await chat(endpoint, [{"role": "system", "content": system}, {"role": "user", "content": content}],
                       json_mode=True, usage=usage)
    return parse_customer_reply(reply)

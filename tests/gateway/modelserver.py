"""A scripted model server at the boundary the model agent calls out to: a local HTTP server on
127.0.0.1 that answers the Messages, Responses and Chat Completions routes from a script.

Every reply is built from the SDK's own response types (`anthropic.types.beta.BetaMessage`, openai's
`Response` and `ChatCompletion`), constructed with validation and serialised with model_dump, so the
script cannot send what the real service cannot. The server records each request (path, body, headers).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from anthropic.types.beta import BetaMessage, BetaTextBlock, BetaToolUseBlock, BetaUsage
from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.completion_usage import CompletionUsage
from openai.types.responses import (
    Response,
    ResponseComputerToolCall,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)
from openai.types.responses.response_computer_tool_call import PendingSafetyCheck
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails


@dataclass
class Reply:
    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering (a slow model)
    trickle: float = 0.0  # seconds between the body's bytes: a reply that keeps coming and never ends in time


Script = Callable[[str, dict[str, Any]], Reply]


def sequence(*replies: Reply) -> Script:
    """The replies in order; past the end, the last one again."""
    left = list(replies)

    def next_reply(path: str, body: dict[str, Any]) -> Reply:
        return left.pop(0) if len(left) > 1 else left[0]
    return next_reply


def by_model(scripts: dict[str, list[Reply]]) -> Script:
    """Per model name (the request's `model`), that model's replies in order; past the end, its last one
    again. One server then plays several agents in one run, each configured with its own model name."""
    served: dict[str, int] = {}

    def next_reply(path: str, body: dict[str, Any]) -> Reply:
        model = str(body.get("model"))
        replies = scripts[model]
        n = served.get(model, 0)
        served[model] = n + 1
        return replies[min(n, len(replies) - 1)]
    return next_reply


class UntilAnswer:
    """A model that acts until the test lets it answer: each turn is `act()` until `answer_now()` is called,
    then `answer()`. A turn waits up to `pace` seconds for the go-ahead before it acts again, so the agent
    neither floods the machine nor answers late. The agent's finishing is then the test's decision, not a
    race with what the test does meanwhile (a person's takeover, a watcher's look)."""

    def __init__(self, act: Callable[[], Reply], answer: Callable[[], Reply], pace: float = 1.0) -> None:
        self._act = act
        self._answer = answer
        self._pace = pace
        self._go = threading.Event()

    def answer_now(self) -> None:
        self._go.set()

    def __call__(self, path: str, body: dict[str, Any]) -> Reply:
        return self._answer() if self._go.wait(self._pace) else self._act()


def agents_config(url: str, agents: dict[str, dict[str, Any]], key_env: str) -> dict[str, Any]:
    """A gh-server config (its `agents:`) with one model agent per entry, each named for and sending its
    own model name (see `by_model`), all at the scripted server `url`: 640x400 screens, one retry, a
    price ($3 and $15 per million tokens in and out), then the entry's own settings."""
    return {"agents": {
        name: {"kind": "model", "model": name, "base_url": url, "api_key_env": key_env, "screen": [640, 400],
               "retries": 1, "price": {"input": 3.0, "output": 15.0}, **kw}
        for name, kw in agents.items()}}


@dataclass
class Seen:
    requests: list[tuple[str, dict[str, Any], dict[str, str], float]] = field(default_factory=list)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [b for _, b, _, _ in self.requests]


@contextmanager
def model_server(script: Script) -> Iterator[tuple[str, Seen]]:
    seen = Seen()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY, as every real model server has it (uvicorn: asyncio sets it on each socket). Without
        # it the reply's body, written after its headers, waits out the client's 40 ms delayed ACK.
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("content-length", "0")))
            body = json.loads(data or b"{}")
            headers = {k.lower(): v for k, v in self.headers.items()}
            seen.requests.append((self.path, body, headers, time.monotonic()))
            reply = script(self.path, body)
            if reply.delay:
                time.sleep(reply.delay)
            out = json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            try:
                if reply.trickle:
                    for i in range(len(out)):
                        self.wfile.write(out[i:i + 1])
                        self.wfile.flush()
                        time.sleep(reply.trickle)
                else:
                    self.wfile.write(out)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its time limit): nothing to answer

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(timeout=10)


# -- Anthropic -------------------------------------------------------------------------------------

def claude(*blocks: BetaTextBlock | BetaToolUseBlock, tokens: tuple[int, int] = (100, 20), cached: int = 0) -> Reply:
    stop = "tool_use" if any(isinstance(b, BetaToolUseBlock) for b in blocks) else "end_turn"
    msg = BetaMessage(id="msg_" + str(time.monotonic_ns()), type="message", role="assistant", model="claude-test",
                      content=list(blocks), stop_reason=stop, stop_sequence=None,
                      usage=BetaUsage(input_tokens=tokens[0], output_tokens=tokens[1],
                                      cache_read_input_tokens=cached))
    return Reply(body=msg.model_dump(mode="json", exclude_none=True))


def text(t: str) -> BetaTextBlock:
    return BetaTextBlock(type="text", text=t)


_ids = iter(range(1, 1_000_000))


def member(name: str, **input: Any) -> BetaToolUseBlock:
    """A computer_toolset_20260801 member call."""
    return BetaToolUseBlock(id=f"toolu_{next(_ids)}", type="tool_use", name=name, input=input, toolset_name="computer")


def tool(name: str, **input: Any) -> BetaToolUseBlock:
    """A custom tool call (ask_user, shell, ...) or the previous version's `computer` tool."""
    return BetaToolUseBlock(id=f"toolu_{next(_ids)}", type="tool_use", name=name, input=input)


# -- OpenAI Responses ------------------------------------------------------------------------------

def response(*items: Any, tokens: tuple[int, int] = (100, 20), cached: int = 0) -> Reply:
    r = Response(id="resp_" + str(next(_ids)), object="response", created_at=0, model="gpt-test", output=list(items),
                 parallel_tool_calls=True, tool_choice="auto", tools=[], status="completed",
                 usage=ResponseUsage(input_tokens=tokens[0], output_tokens=tokens[1], total_tokens=sum(tokens),
                                     input_tokens_details=InputTokensDetails(cached_tokens=cached,
                                                                             cache_write_tokens=0),
                                     output_tokens_details=OutputTokensDetails(reasoning_tokens=0)))
    return Reply(body=r.model_dump(mode="json", exclude_none=True))


def computer_call(*actions: Any, checks: list[tuple[str, str]] = ()) -> ResponseComputerToolCall:  # type: ignore[assignment]
    n = next(_ids)
    return ResponseComputerToolCall(
        id=f"cu_{n}", call_id=f"call_{n}", type="computer_call", status="completed", actions=list(actions),
        pending_safety_checks=[PendingSafetyCheck(id=f"sc_{n}_{i}", code=c, message=m)
                               for i, (c, m) in enumerate(checks)])


def function_call(name: str, **args: Any) -> ResponseFunctionToolCall:
    n = next(_ids)
    return ResponseFunctionToolCall(id=f"fc_{n}", call_id=f"call_{n}", type="function_call", name=name,
                                    arguments=json.dumps(args), status="completed")


def said(t: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id=f"msg_{next(_ids)}", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=t, annotations=[])])


# -- Chat Completions ------------------------------------------------------------------------------

def chat(content: str | None = None, *calls: tuple[str, dict[str, Any]], tokens: tuple[int, int] = (100, 20),
         cached: int = 0) -> Reply:
    tool_calls = [ChatCompletionMessageFunctionToolCall(id=f"call_{next(_ids)}", type="function",
                                                        function=Function(name=n, arguments=json.dumps(a)))
                  for n, a in calls] or None
    c = ChatCompletion(id="chatcmpl-" + str(next(_ids)), object="chat.completion", created=0, model="open-model",
                       choices=[Choice(index=0, finish_reason="tool_calls" if tool_calls else "stop",
                                       message=ChatCompletionMessage(role="assistant", content=content,
                                                                     tool_calls=tool_calls))],
                       usage=CompletionUsage(prompt_tokens=tokens[0], completion_tokens=tokens[1],
                                             total_tokens=sum(tokens),
                                             prompt_tokens_details={"cached_tokens": cached}))  # type: ignore[arg-type]
    return Reply(body=c.model_dump(mode="json", exclude_none=True))


def api_error(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    """An error body in the shape both APIs use ({"error": {"type", "message"}})."""
    return Reply(status=status, body={"type": "error", "error": {"type": "api_error", "message": message}},
                 headers=headers or {})


def chat_raw(name: str, arguments: str) -> Reply:
    """A Chat Completions tool call whose `arguments` are sent as given (e.g. text that is not JSON)."""
    call = ChatCompletionMessageFunctionToolCall(id=f"call_{next(_ids)}", type="function",
                                                 function=Function(name=name, arguments=arguments))
    c = ChatCompletion(id="chatcmpl-" + str(next(_ids)), object="chat.completion", created=0, model="open-model",
                       choices=[Choice(index=0, finish_reason="tool_calls",
                                       message=ChatCompletionMessage(role="assistant", content=None,
                                                                     tool_calls=[call]))],
                       usage=CompletionUsage(prompt_tokens=100, completion_tokens=20, total_tokens=120))
    return Reply(body=c.model_dump(mode="json", exclude_none=True))

"""The built-in model agent's request size over a long try: bytes of each model request at chosen
steps, for each API, through the SDKs' own clients against the scripted model server.

    .venv/bin/python bench/agent_request_size.py [--steps 500] [--at 1,50,100,250,500] [--shell-bytes 2000]

Issue 51: OSWorld 2.0's tasks run up to 500 steps, and a request that grows with every step would
outgrow a model's context (and cost) long before. The agent keeps the last `keep_screens`
screenshots (3 by default) and older turns as text (gh_server/agents/model/*_api.py). This bench
drives each API's `Conversation` (the loop's own phases: `begin`, then `call` and `act` per step)
with no machine: `do` answers every action at once, `look` hands the same screen (docs/console-live.png
scaled to 1280x800: a real page, PNG as the agent sends it). The model is tests/gateway/modelserver.py,
its replies built from the SDKs' response types. Two workloads per API:

  gui     each turn a sentence, a click and a key (the common step)
  shell   each turn a sentence and a `shell` call whose output is --shell-bytes of text (the worst
          text growth an agent of ours sees: exec output is capped, docs/agents.md)

It prints the request body's bytes (JSON, as sent) at each step of --at, and the screenshots in it,
with every turn kept whole (keep_turns 10000: what the agent sent before window.py) and with the
default keep_turns (older turns condensed to a line each), side by side.
Nothing is left behind; no network beyond 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import anthropic  # noqa: E402
import openai  # noqa: E402
from gateway.modelserver import (  # noqa: E402
    Reply,
    chat,
    claude,
    computer_call,
    function_call,
    member,
    model_server,
    response,
    said,
    text,
    tool,
)
from openai.types.responses import computer_action as ca  # noqa: E402
from PIL import Image  # noqa: E402

from gh_server.agents.model import actions as A  # noqa: E402
from gh_server.agents.model.actor import ActResult  # noqa: E402
from gh_server.agents.model.anthropic_api import AnthropicConversation  # noqa: E402
from gh_server.agents.model.chat_api import ChatConversation  # noqa: E402
from gh_server.agents.model.conversation import Conversation  # noqa: E402
from gh_server.agents.model.responses_api import ResponsesConversation  # noqa: E402
from gh_server.agents.model.screen import Scale, Shot  # noqa: E402
from gh_server.settings import ModelAgentConfig, ModelApi, ModelTool  # noqa: E402

SIZE = (1280, 800)
APIS = (ModelApi.ANTHROPIC, ModelApi.OPENAI_RESPONSES, ModelApi.OPENAI_CHAT)


def screen() -> Shot:
    img = Image.open(ROOT / "docs" / "console-live.png").convert("RGB").resize(SIZE)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return Shot(png=buf.getvalue(), scale=Scale(model=SIZE, guest=SIZE))


def reply(api: ModelApi, workload: str) -> Reply:
    script = "ls -la /usr/bin | head -40"
    if api == ModelApi.ANTHROPIC:
        if workload == "shell":
            return claude(text("Listing the programs."), tool("shell", script=script))
        return claude(text("Clicking the field."), member("left_click", coordinate=[640, 400]),
                      member("key", text="shift"))
    if api == ModelApi.OPENAI_RESPONSES:
        if workload == "shell":
            return response(said("Listing the programs."), function_call("shell", script=script))
        return response(said("Clicking the field."), computer_call(
            ca.Click(type="click", button="left", x=640, y=400), ca.Keypress(type="keypress", keys=["SHIFT"])))
    if workload == "shell":
        return chat("Listing the programs.", ("shell", {"script": script}))
    return chat("Clicking the field.", ("computer", {"action": "click", "x": 640, "y": 400}),
                ("computer", {"action": "key", "keys": ["shift"]}))


def conversation(api: ModelApi, url: str, keep_turns: int) -> tuple[Conversation, Any]:
    cfg = ModelAgentConfig(id="bench", kind="model", api=api, model="bench-model", base_url=url,
                           api_key_env="BENCH_KEY", tools=[ModelTool.COMPUTER, ModelTool.SHELL], keep_turns=keep_turns)
    if api == ModelApi.ANTHROPIC:
        claude_client = anthropic.AsyncAnthropic(api_key="bench", base_url=url, max_retries=0)
        return AnthropicConversation(cfg, claude_client, SIZE), claude_client
    client = openai.AsyncOpenAI(api_key="bench", base_url=url, max_retries=0)
    if api == ModelApi.OPENAI_RESPONSES:
        return ResponsesConversation(cfg, client, SIZE, "linux"), client
    return ChatConversation(cfg, client, Scale(model=SIZE, guest=SIZE)), client


def screens_in(body: dict[str, Any], shot: Shot) -> int:
    """Full screenshots in the request (a dropped one's grey placeholder or line of text is not one)."""
    return json.dumps(body).count(shot.b64[:64])


async def run(api: ModelApi, workload: str, keep_turns: int, steps: int, at: set[int], shell_bytes: int,
              shot: Shot) -> dict[int, tuple[int, int]]:
    output = ("-rwxr-xr-x 1 root root 14336 Jan  1 00:00 program\n" * (shell_bytes // 50 + 1))[:shell_bytes]

    async def do(action: A.Action) -> ActResult:
        return ActResult(output if isinstance(action, A.Shell) else "done")

    async def look() -> Shot:
        return shot

    sizes: dict[int, tuple[int, int]] = {}
    with model_server(lambda _path, _body: reply(api, workload)) as (url, seen):
        conv, client = conversation(api, url, keep_turns)
        try:
            conv.begin("The customer's file is missing; find it.", shot)
            for step in range(1, steps + 1):
                turn = await conv.call()
                if step in at:
                    body = seen.bodies[-1]
                    sizes[step] = (len(json.dumps(body).encode()), screens_in(body, shot))
                seen.requests.clear()  # only the last body is read: 500 of them would hold ~150 MB
                await conv.act(turn, do, look)
        finally:
            await client.close()
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--at", default="1,10,50,100,250,500")
    ap.add_argument("--shell-bytes", type=int, default=2000)
    args = ap.parse_args()
    at = {int(x) for x in args.at.split(",") if int(x) <= args.steps}
    shot = screen()
    print(f"screen: {SIZE[0]}x{SIZE[1]} PNG of {len(shot.png):,} bytes ({len(shot.b64):,} as base64); "
          f"keep_screens 3; shell output {args.shell_bytes:,} bytes a step")
    cols = sorted(at)
    keeps = (10_000, ModelAgentConfig.model_fields["keep_turns"].default)
    print(f"{'api':18} {'workload':8} {'keep_turns':>10} " + " ".join(f"{'step ' + str(s):>16}" for s in cols))
    for api in APIS:
        for workload in ("gui", "shell"):
            for keep in keeps:  # every turn whole (as before window.py), then the default
                sizes = asyncio.run(run(api, workload, keep, args.steps, at, args.shell_bytes, shot))
                cells = [f"{sizes[s][0] / 1024:9,.0f} KiB/{sizes[s][1]}i" for s in cols]
                print(f"{api.value:18} {workload:8} {keep:>10} " + " ".join(f"{c:>16}" for c in cells), flush=True)
    print("(KiB of the request's JSON body; Ni: full screenshots in it; keep_turns 10000: no turn condensed)")


if __name__ == "__main__":
    main()

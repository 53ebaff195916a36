"""The model agent's own cost per step, against a zero-latency scripted model, on a real guest.

    .venv/bin/python bench/agent_step.py [--image linux-desktop] [--images-dir DIR] [--state-dir DIR] [--steps 30]
        [--screen 1280x800]

A machine of the image (linux-desktop by default: a signed-in XFCE session; linux-tiny works too) is made
with the QEMU provider and waited for until ready (the desktop's session up: minutes under TCG); the model
agent (gh_server.agents.model) runs its loop on it through a relay that serves its machine requests
straight from the provider (what the runner does, minus the websocket hop and the replay frames). The
model is a local HTTP server answering at once with SDK-typed replies: a click (on the empty desktop, at
the screen's centre) and a key (shift) per turn. Per
API, for each step (the time between two model requests, the model's own time being ~0):

  screen   the screenshot request (QEMU's PPM screen dump, encoded to PNG by gh_common/png.py)
  act      the input requests of the turn (a click, a key)
  rest     everything else: scaling and encoding the screenshot, building the request, the SDK's
           round trip on loopback, parsing the reply, bookkeeping (scale+encode alone is printed first)

printed as p50 / p90 in milliseconds, after 10 uncounted steps (a just-restored guest settles first). The
provider paces input reports POINTER_GAP_S apart (a click is two reports, press with the move and release,
and the key after it waits one gap): the third row runs anthropic again with the gap at 0, side by side,
to show what that pacing costs per step, and the last row takes libvirt's screenshot (a PNG QEMU
encodes itself: the provider's path before the PPM dump) instead of the PPM dump. The second row runs
anthropic again with VIEWERS live viewers on the same machine, side by side with the first: each an RFB
3.8 client on its own `Machine.open_screen_stream` (what the runner hands a live view), in this process's
event loop as gh-server's loop hosts its relay beside the model agents, asking for an incremental update
after each one and reading it whole, as noVNC does (raw encoding: the most bytes QEMU sends). A click and
a shift change little on the screen, so two more rows run with the screen kept moving by the guest
(bench/movers.py: random hex printed on linux-tiny's console; a window moved on linux-desktop), without
viewers and with VIEWERS: the moving itself costs the guest's CPU, the pair shows what the viewers add.
The scripted model server sets TCP_NODELAY, as real ones do (uvicorn through asyncio): without it each
reply waits out the client's 40 ms delayed ACK. The host may be shared: compare the rows of one run.
Everything it makes is named gh-bench-agentstep-* and removed at the end, even on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/movers.py
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from anthropic.types.beta import BetaMessage, BetaTextBlock, BetaToolUseBlock, BetaUsage
from movers import MOVERS, start_script, stop_script
from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function

from gh_server.agents.base import AgentContext, Machine
from gh_server.agents.model.loop import ModelAgent
from gh_server.agents.model.screen import prepare
from gh_server.settings import ModelAgentConfig
from gh_wire import protocol
from providers.base import MachineSource
from providers.qemu import QemuProvider
from providers.qemu import input as qinput

RUNNER = "bench-agentstep"
KEY_ENV = "GH_BENCH_MODEL_KEY"
VIEWERS = 8
RAW, ZRLE, DESKTOP_SIZE = 0, 16, -223


class Viewers:
    """VIEWERS RFB clients reading the machine's screen in this loop (a bench's client, not a product's)."""

    def __init__(self, machine: Any, n: int, encoding: int = RAW, pace: float = 0.0) -> None:
        self.machine = machine
        self.n = n
        # Seconds at least between one viewer's update requests (0: at once after each update, as noVNC
        # does). QEMU encodes and sends per client only on a request: pacing is what a relay could cap.
        self.pace = pace
        # RAW is the most bytes QEMU sends; ZRLE is a zlib stream like the Tight noVNC asks for (a
        # browser's cost), read here by its length alone: the bench measures the agent's step, not decoding.
        self.encoding = encoding
        self.updates = 0
        self.bytes = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Viewers:
        streams = [await self.machine.open_screen_stream(60) for _ in range(self.n)]
        ready = [asyncio.get_running_loop().create_future() for _ in streams]
        self._tasks = [asyncio.create_task(self._view(r, w, f)) for (r, w), f in zip(streams, ready, strict=True)]
        async with asyncio.timeout(60):
            await asyncio.gather(*ready)  # each has its first full frame
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _read(self, reader: asyncio.StreamReader, n: int) -> bytes:
        data = await reader.readexactly(n)
        self.bytes += n
        return data

    async def _view(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    ready: asyncio.Future[None]) -> None:
        try:
            await self._read(reader, 12)
            writer.write(b"RFB 003.008\n")
            count = (await self._read(reader, 1))[0]
            await self._read(reader, count)
            writer.write(b"\x01")  # security None
            await self._read(reader, 4)
            writer.write(b"\x01")  # ClientInit: shared
            init = await self._read(reader, 24)
            w, h = struct.unpack(">HH", init[:4])
            bpp = init[4] // 8
            await self._read(reader, struct.unpack(">I", init[20:24])[0])
            writer.write(struct.pack(">BxHii", 2, 2, self.encoding, DESKTOP_SIZE))
            incremental = 0
            asked = 0.0
            while True:
                if self.pace and (wait := asked + self.pace - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                asked = time.monotonic()
                writer.write(struct.pack(">BBHHHH", 3, incremental, 0, 0, w, h))
                await writer.drain()
                while True:  # until the update
                    kind = (await self._read(reader, 1))[0]
                    if kind == 0:
                        break
                    if kind == 1:  # colour map entries
                        await self._read(reader, 6 * struct.unpack(">xxxH", await self._read(reader, 5))[0])
                    elif kind == 3:  # server cut text
                        await self._read(reader, struct.unpack(">xxxI", await self._read(reader, 7))[0])
                    elif kind != 2:  # 2: bell
                        raise RuntimeError(f"RFB message {kind} from QEMU")
                rects = struct.unpack(">xH", await self._read(reader, 3))[0]
                for _ in range(rects):
                    _x, _y, rw, rh, enc = struct.unpack(">HHHHi", await self._read(reader, 12))
                    if enc == RAW:
                        await self._read(reader, rw * rh * bpp)
                    elif enc == ZRLE:
                        await self._read(reader, struct.unpack(">I", await self._read(reader, 4))[0])
                    elif enc == DESKTOP_SIZE:
                        w, h = rw, rh
                    else:
                        raise RuntimeError(f"RFB encoding {enc} from QEMU")
                self.updates += 1
                incremental = 1
                if not ready.done():
                    ready.set_result(None)
        except Exception as e:
            if not ready.done():
                ready.set_exception(e)
            raise
        finally:
            writer.close()


def _reply(api: str, n: int, at: tuple[int, int]) -> dict[str, Any]:
    if api == "anthropic":
        msg = BetaMessage(
            id=f"msg_{n}", type="message", role="assistant", model="bench", stop_reason="tool_use", stop_sequence=None,
            content=[BetaTextBlock(type="text", text="Clicking."),
                     BetaToolUseBlock(id=f"t{n}a", type="tool_use", name="left_click", input={"coordinate": list(at)},
                                      toolset_name="computer"),
                     BetaToolUseBlock(id=f"t{n}b", type="tool_use", name="key", input={"text": "shift"},
                                      toolset_name="computer")],
            usage=BetaUsage(input_tokens=1000, output_tokens=20))
        return msg.model_dump(mode="json", exclude_none=True)
    calls = [ChatCompletionMessageFunctionToolCall(id=f"c{n}a", type="function", function=Function(
                 name="computer", arguments=json.dumps({"action": "click", "x": at[0], "y": at[1]}))),
             ChatCompletionMessageFunctionToolCall(id=f"c{n}b", type="function", function=Function(
                 name="computer", arguments=json.dumps({"action": "key", "keys": ["shift"]})))]
    c = ChatCompletion(id=f"cc{n}", object="chat.completion", created=0, model="bench", choices=[Choice(
        index=0, finish_reason="tool_calls", message=ChatCompletionMessage(role="assistant", content="Clicking.",
                                                                          tool_calls=calls))])
    return c.model_dump(mode="json", exclude_none=True)


@contextmanager
def model(api: str, at: tuple[int, int]) -> Iterator[tuple[str, list[float]]]:
    arrivals: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY, as every real model server has it (uvicorn: asyncio sets it on each socket). Without
        # it the reply's body, written after its headers, waits out the client's 40 ms delayed ACK.
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            arrivals.append(time.monotonic())
            out = json.dumps(_reply(api, len(arrivals), at)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", arrivals
    finally:
        httpd.shutdown()
        httpd.server_close()


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))] if s else float("nan")


async def run_api(machine: Any, api: str, steps: int, screen: tuple[int, int]) -> dict[str, list[float]]:
    spans: list[tuple[str, float, float]] = []

    async def relay(_runner: str, req: protocol.MachineRequest, _timeout: float) -> protocol.MachineResponse:
        t0 = time.monotonic()
        try:
            if req.op == "screen":
                png = await machine.screenshot()
                b64 = base64.b64encode(png).decode()
                return protocol.MachineResponse(request_id=req.request_id, ok=True, png_b64=b64)
            if req.op == "input":
                await machine.send_input(req.events)
                return protocol.MachineResponse(request_id=req.request_id, ok=True)
            raise AssertionError(req.op)
        finally:
            spans.append((req.op, t0, time.monotonic()))

    with model(api, (screen[0] // 2, screen[1] // 2)) as (url, arrivals):
        cfg = ModelAgentConfig(id="bench", kind="model", api=api, model="bench", base_url=url,  # type: ignore[arg-type]
                               api_key_env=KEY_ENV, screen=screen, max_steps=steps, keep_screens=3)
        ctx = AgentContext(attempt_id="at_bench", runner_id="rn_bench", agent_id="bench", test_run_id="tr_bench",
                           case={"limits": {"minutes": 30}, "prompt": "bench"},
                           machine=Machine(relay, "rn_bench", "at_bench"), machine_api_url="", machine_api_token="")
        await ModelAgent("bench", cfg).run(ctx)
    out: dict[str, list[float]] = {"step": [], "screen": [], "act": [], "rest": []}
    for a, b in itertools.pairwise(arrivals):
        inside = [(op, s, e) for op, s, e in spans if a <= s < b]
        screen_s = sum(e - s for op, s, e in inside if op == "screen")
        act_s = sum(e - s for op, s, e in inside if op == "input")
        out["step"].append(b - a)
        out["screen"].append(screen_s)
        out["act"].append(act_s)
        out["rest"].append(b - a - screen_s - act_s)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="linux-desktop")
    ap.add_argument("--images-dir", default=os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images"))
    ap.add_argument("--state-dir", default=None,
                    help="a kept runner state dir: its warm snapshot of the image is reused (else a cold boot)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--screen", default="1280x800")
    ap.add_argument("--moving-only", action="store_true", help="only the rows with the screen kept moving")
    args = ap.parse_args()
    w, h = (int(v) for v in args.screen.split("x"))
    os.environ[KEY_ENV] = "bench-key"
    kept = args.state_dir is not None
    state = Path(args.state_dir) if kept else Path(tempfile.mkdtemp(prefix="gh-bench-agentstep-", dir="/var/tmp"))
    os.chmod(state, 0o755)  # libvirt-qemu must reach the overlays
    provider = QemuProvider(Path(args.images_dir), state, RUNNER, warm_snapshots=kept)
    await provider.start()
    machine = None
    try:
        t0 = time.monotonic()
        machine = await provider.create_machine("bench-agentstep-1", MachineSource(image=args.image), timeout=1800)
        await machine.wait_ready(1800)
        print(f"machine ready in {time.monotonic() - t0:.1f} s ({provider.accelerator}); "
              f"guest screen {len(await machine.screenshot())} bytes PNG; model screen {w}x{h}")
        print(f"{'api':<24} {'steps':>5}  {'step p50':>9} {'p90':>7}  {'screen p50':>10} {'act p50':>8} "
              f"{'rest p50':>9} {'rest p90':>9}   (ms)")
        png = await machine.screenshot()
        enc = []
        for _ in range(20):
            t = time.monotonic()
            await asyncio.to_thread(prepare, png, (w, h))
            enc.append((time.monotonic() - t) * 1000)
        print(f"scale+encode alone (in a thread): p50 {pct(enc, .5):.0f} ms, p90 {pct(enc, .9):.0f} ms")
        # Not counted: a guest just restored settles for a few seconds (its clock, the compositor's
        # redraw), which would land on whichever row ran first.
        await run_api(machine, "anthropic", 10, (w, h))
        gap = qinput.POINTER_GAP_S
        mover = list(MOVERS[args.image].values())[-1] if args.image in MOVERS else None
        # (api, pointer gap, PPM dump, viewers (< 0: asking for ZRLE instead of raw), moving, viewer pace)
        rows: list[tuple[str, float, bool, int, bool, float]] = []
        if not args.moving_only:
            rows += [("anthropic", gap, True, 0, False, 0), ("anthropic", gap, True, VIEWERS, False, 0),
                     ("openai-chat", gap, True, 0, False, 0), ("anthropic", 0.0, True, 0, False, 0),
                     ("anthropic", gap, False, 0, False, 0)]
        if mover is not None:
            rows += [("anthropic", gap, True, 0, True, 0), ("anthropic", gap, True, VIEWERS, True, 0),
                     ("anthropic", gap, True, -VIEWERS, True, 0), ("anthropic", gap, True, -VIEWERS, True, 0.1),
                     ("anthropic", gap, True, -VIEWERS, True, 0.2)]
        for api, row_gap, ppm, viewers, moving, pace in rows:
            qinput.POINTER_GAP_S = row_gap
            machine._ppm_dumps = ppm
            watching = Viewers(machine, abs(viewers), ZRLE if viewers < 0 else RAW, pace)
            if moving:
                assert mover is not None
                started = await machine.run_script(start_script(mover), timeout=60)
                assert started.exit_code == 0, started
            try:
                if viewers:
                    await watching.__aenter__()
                t_row, seen = time.monotonic(), watching.bytes
                try:
                    r = await run_api(machine, api, args.steps, (w, h))
                finally:
                    row_s, seen = time.monotonic() - t_row, watching.bytes - seen
                    if viewers:
                        await watching.__aexit__(None, None, None)
            finally:
                qinput.POINTER_GAP_S = gap
                machine._ppm_dumps = True
                if moving:
                    await machine.run_script(stop_script(), timeout=60)
            ms = {k: [v * 1000 for v in vs] for k, vs in r.items()}
            name = api if row_gap == gap else f"{api}, gap 0"
            name = name if ppm else f"{api}, libvirt's"
            name = f"{name}, moving" if moving else name
            name = f"{name}, {abs(viewers)} viewers" if viewers else name
            name = f"{name} zrle" if viewers < 0 else name
            name = f"{name} {1 / pace:.0f}/s" if pace else name
            print(f"{name:<24} {len(ms['step']):>5}  {pct(ms['step'], .5):>9.0f} {pct(ms['step'], .9):>7.0f}  "
                  f"{pct(ms['screen'], .5):>10.0f} {pct(ms['act'], .5):>8.0f} {pct(ms['rest'], .5):>9.0f} "
                  f"{pct(ms['rest'], .9):>9.0f}")
            print(f"{'':<24} mean step {statistics.mean(ms['step']):.0f} ms"
                  + (f"; the viewers read {watching.updates} updates, {seen / row_s / 1024:.1f} KiB/s in all"
                     if viewers else ""))
    finally:
        if machine is not None:
            await machine.destroy()
        await provider.reap(keep=set())
        await provider.close()
        if not kept:
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())

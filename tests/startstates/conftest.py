"""A real gh-server (uvicorn) and a real gh-runner daemon on linux-tiny, in one background thread.

The tests drive them through the official SDK (`guidinghand.Eager`, sync) from the test thread, so
the server's event loop never waits on a test. Reaching into the daemon (an `exec` on an open
machine, the versions on disk) goes through `Stack.call`, which runs a coroutine on that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from agentfiles import agent_command
from guidinghand import Eager
from kit.libvirt import LIBVIRT_URI, leak_check
from kit.scratch import traversable_tmpdir

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
START_TIMEOUT = 180.0
RUNNER_NAME = "sstest-" + secrets.token_hex(3)


def await_for(fn: Callable[[], T], *, what: str, timeout: float = 240.0, every: float = 0.5) -> T:
    """Poll `fn` until it returns something truthy (or the deadline passes, which fails the test)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


class HookReceiver:
    """A webhook endpoint on loopback that keeps every event body it gets."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        received = self.events

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def of(self, event_type: str, start_state_id: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e.get("type") == event_type
                and e.get("data", {}).get("start_state", {}).get("start_state_id") == start_state_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Stack:
    def __init__(self, images_dir: Path, image: str = "linux-tiny", agents: dict[str, Any] | None = None) -> None:
        """`agents`: more agents for the server's settings (by id), beside the gate and the note-taker."""
        self.extra_agents = dict(agents or {})
        self.tmp = traversable_tmpdir("gh-startstates-")
        # A private copy: the shared image may be rebuilt by someone else mid-test, and a saved
        # version is only valid on the exact image it was saved from.
        self.images_dir = self.tmp / "images"
        # Contents only: copied xattrs would carry libvirt's "in use" labels of the originals.
        shutil.copytree(images_dir / image, self.images_dir / image, copy_function=shutil.copyfile)
        for p in (self.images_dir, self.images_dir / image):
            p.chmod(0o755)
        self.gate_dir = self.tmp / "gate"
        self.gate_dir.mkdir()
        self.gate_dir.chmod(0o777)  # the gate agent runs with a uid of its own (gh_server.agents.sandbox)
        self.admin_key = "gh_live_" + secrets.token_urlsafe(24)
        self.base_url = ""
        self.state: Any = None
        self.daemon: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self.hooks: HookReceiver

    # -- from the test thread ------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="gh-stack", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT) or self._failure is not None:
            self.stop()
            raise RuntimeError(f"server + runner did not start: {self._failure!r}")

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=400)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def sdk(self) -> Eager:
        return Eager(api_key=self.admin_key, base_url=self.base_url, max_retries=0, timeout=120)  # type: ignore[arg-type]

    def held(self) -> set[tuple[str, int]]:
        """The start-state versions on the runner's disk."""
        return set(self.call(self.daemon.provider.held_versions()))

    def guest_exec(self, start_state_id: str, script: str) -> Any:
        """Run a script on a start state's open machine, beside the API (to see what input did)."""
        from gh_wire import protocol

        req = protocol.MachineRequest(request_id=secrets.token_hex(8), start_state_id=start_state_id, op="exec",
                                      script=script, timeout=60)
        return self.call(self.daemon.jobs.handle_request(req), timeout=90)

    def set_idle(self, seconds: float) -> None:
        self.state.extras["start_state_idle_seconds"] = seconds

    # -- on the stack's loop -------------------------------------------------------------------

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server: Any = None
        server_task: asyncio.Task[Any] | None = None
        daemon_task: asyncio.Task[Any] | None = None
        try:
            server, server_task = await self._start_server()
            token = await self._register_runner()
            daemon_task = await self._start_daemon(token)
            await self._wait_online(daemon_task)
            self._ready.set()
            await self._stop.wait()
        except BaseException as e:
            self._failure = e
            self._ready.set()
        finally:
            await self._shutdown(server, server_task, daemon_task)

    async def _start_server(self) -> tuple[Any, asyncio.Task[Any]]:
        import uvicorn

        from gh_server.app import create_app, create_state
        from gh_server.settings import AgentConfig, Settings

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        gate = agent_command(HERE / "gate_agent.py", str(self.gate_dir))
        settings = Settings(
            data_dir=self.tmp / "server", host="127.0.0.1", port=port, admin_api_key=self.admin_key,
            runner_grace_seconds=120.0, webhook_allow=["127.0.0.1"], agents={
                "gate": AgentConfig(id="gate", kind="command", command=gate, timeout=600),
                "note-taker": AgentConfig(id="note-taker", kind="command",
                                          command=agent_command(HERE / "note_agent.py"), timeout=300),
                "looker": AgentConfig(id="looker", kind="command",
                                      command=agent_command(HERE / "look_agent.py", str(self.gate_dir)), timeout=900),
                **self.extra_agents},
        )
        st = create_state(settings)
        # Long enough that no test's hand work is closed under it; the idle test lowers it.
        st.extras["start_state_idle_seconds"] = 900.0
        st.extras["start_state_housekeeping_seconds"] = 0.5
        app = await asyncio.to_thread(create_app, settings, st)
        self.state = st
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, ws="websockets")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        deadline = time.monotonic() + 60
        while not server.started:
            if task.done():
                raise RuntimeError(f"gh-server did not start: {task.exception()!r}")
            if time.monotonic() > deadline:
                raise RuntimeError("gh-server did not start within 60 s")
            await asyncio.sleep(0.05)
        self.base_url = f"http://127.0.0.1:{port}"
        return server, task

    async def _register_runner(self) -> str:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30,
                                     headers={"Authorization": f"Bearer {self.admin_key}"}) as http:
            r = await http.post("/v1/runners", json={"name": RUNNER_NAME})
            r.raise_for_status()
            return str(r.json()["token"])

    async def _start_daemon(self, token: str) -> asyncio.Task[Any]:
        from gh_runner.config import load_config
        from gh_runner.daemon import Daemon
        from gh_runner.provider_factory import make_provider

        state_dir = self.tmp / "runner-state"
        state_dir.mkdir(mode=0o755)
        cfg = load_config(flags={"server": self.base_url, "token": token, "name": RUNNER_NAME, "slots": 2,
                                 "images_dir": self.images_dir, "state_dir": state_dir,
                                 "libvirt_uri": LIBVIRT_URI}, env={})
        self.daemon = Daemon(cfg, make_provider(cfg))
        return asyncio.create_task(self.daemon.run())

    async def _wait_online(self, daemon_task: asyncio.Task[Any]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30,
                                     headers={"Authorization": f"Bearer {self.admin_key}"}) as http:
            while time.monotonic() < deadline:
                if daemon_task.done():
                    raise RuntimeError(f"the runner stopped before it connected: {daemon_task.result()!r}")
                r = await http.get("/v1/runners")
                if any(x.get("status") == "online" and x.get("images") for x in r.json().get("data", [])):
                    return
                await asyncio.sleep(0.2)
        raise RuntimeError("the runner did not come online")

    async def _shutdown(self, server: Any, server_task: asyncio.Task[Any] | None,
                        daemon_task: asyncio.Task[Any] | None) -> None:
        if self.daemon is not None and daemon_task is not None:
            self.daemon.request_stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(daemon_task), timeout=240)
            if not daemon_task.done():
                self.daemon.force_stop()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(daemon_task, timeout=120)
            # Whatever a failed test left open: the daemon's own reaper, with nothing to keep.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.daemon.provider.reap(keep=set()), timeout=240)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.daemon.provider.close(), timeout=30)
        if server is not None and server_task is not None:
            server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server_task, timeout=30)
        if self.state is not None:
            with contextlib.suppress(Exception):
                self.state.engine.dispose()


_no_domains_left_behind = leak_check(f"gh-{RUNNER_NAME}-", "the start-state tests")


@pytest.fixture(scope="module")
def stack(images_dir: Path) -> Iterator[Stack]:
    s = Stack(images_dir)
    s.start()
    s.hooks = HookReceiver()
    try:
        with s.sdk() as client:
            client.webhook.update(url=s.hooks.url, events=[])
        yield s
    finally:
        s.hooks.close()
        s.stop()


@pytest.fixture()
def gh(stack: Stack) -> Iterator[Eager]:
    client = stack.sdk()
    try:
        yield client
    finally:
        client.close()

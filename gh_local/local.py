"""`gh-runner local CASES.yaml`: run test cases on this host with an embedded control plane and runner.

One process, one event loop: gh-server's app (SQLite in a temp dir) served by uvicorn on a free
loopback port, and the runner daemon (QEMU provider) dialing it with a freshly registered runner
token. The cases go in through the same `/v1` API an eval author uses (batch create, run, poll,
results), so this is also the smallest end-to-end check of the whole system.

At the end: a table per case and agent, each agent's pass rate with its 95% confidence interval,
the JSON report and the replays (exported to disk: the embedded server ends with the process).

Exit codes: 0 every try was scored (passed or failed, whatever the agents scored); 1 a try ended in
error or did not run to an outcome, or the run could not be carried out (the runner never connected,
the control plane stopped answering): the report is still written when there is a run, and an errors
block says why each try ended in error, grouped by cause and reason; 2 a usage or configuration error
(a bad cases file, flag or --server-config, an image that is not in the images dir); 130 interrupted
(Ctrl-C): a partial report of the tries that finished is written and the path printed. Every machine
is destroyed and every overlay removed in each case.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import httpx
import pydantic

from gh_common.timeouts import within
from gh_local.casefile import CaseFile, CaseFileError, check_task_minutes, load_case_file, parse_agents, parse_repeat
from gh_local.report import (
    build_report,
    render_errors,
    render_table,
    rows_from_attempts,
    summarize_agents,
    write_report,
)
from gh_runner.poolsize import plan_pool

if TYPE_CHECKING:
    from gh_runner.config import RunnerConfig

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

RUNNER_CONNECT_TIMEOUT = 120.0  # the runner lists images and reaps before it dials
POLL_INTERVAL = 1.0
HTTP_TIMEOUT = 60.0
DEFAULT_SLOTS = 2
DEFAULT_OUTPUT_ROOT = Path("/var/tmp/gh-runner-local")


class LocalError(Exception):
    """The run could not be carried out; the message says why and what to do."""

    exit_code = 1


class LocalConfigError(LocalError):
    """The configuration cannot work (an image that is not there, settings the control plane refuses):
    a usage error, exit 2, as a bad cases file is."""

    exit_code = 2


@dataclass(frozen=True)
class Options:
    cases: Path
    agents: list[str] | None = None
    repeat: int | None = None
    report: Path | None = None
    images_dir: Path | None = None
    state_dir: Path | None = None
    libvirt_uri: str | None = None
    slots: int | None = None
    config: Path | None = None  # the runner's config file (--config): timeouts, warm snapshots, the pool
    server_settings: dict[str, Any] = field(default_factory=dict)


# What --server-config may set: the embedded control plane owns its address, keys and storage. The
# agent_* keys say how command agents are sandboxed (docs/security.md): a non-root user running
# `gh-runner local` with command agents must say agent_sandbox: none.
SERVER_CONFIG_KEYS = ("agents", "judge", "customer_model", "agent_sandbox", "agent_user", "agent_uids",
                      "max_task_minutes", "save_point_minutes", "save_points_kept")


def load_server_config(path: Path) -> dict[str, Any]:
    """The --server-config file's settings, validated as gh-server would; ValueError names what is wrong."""
    from gh_server.settings import Settings

    data = Settings.from_file(path)
    other = sorted(set(data) - set(SERVER_CONFIG_KEYS))
    if other:
        raise ValueError(f"--server-config {path}: {', '.join(other)} cannot be set for the embedded control plane "
                         f"(allowed: {', '.join(SERVER_CONFIG_KEYS)})")
    try:
        Settings(data_dir=Path("."), **data)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ValueError(f"--server-config {path}: {where}: {first.get('msg')}") from None
    return data


def options_from_args(args: Any) -> Options:
    """Read the argparse namespace cli.py built; anything missing is left to the file or defaults."""
    def get(name: str) -> Any:
        return getattr(args, name, None)

    def path(name: str) -> Path | None:
        v = get(name)
        return Path(v) if v else None

    agents = parse_agents(get("agents"), "--agents") if get("agents") else None
    repeat = parse_repeat(int(get("repeat")), "--repeat") if get("repeat") is not None else None
    slots = int(get("slots")) if get("slots") is not None else None
    server_config = path("server_config")
    return Options(cases=Path(get("cases")), agents=agents, repeat=repeat, report=path("report"),
                   images_dir=path("images_dir"), state_dir=path("state_dir"), libvirt_uri=get("libvirt_uri"),
                   slots=slots, config=path("config"),
                   server_settings=load_server_config(server_config) if server_config else {})


def runner_config(opts: Options, env: Mapping[str, str], name: str, state_dir: Path | None) -> RunnerConfig:
    """The embedded runner's config: its flags over env over the --config file over local's defaults
    (DEFAULT_SLOTS, where the runner alone would have 1). `state_dir`: a temporary one, when none was given.

    Raises:
        ConfigError: a setting is wrong; the message names it.
    """
    from gh_runner.config import load_config

    flags: dict[str, Any] = {"images_dir": opts.images_dir, "state_dir": opts.state_dir or state_dir,
                             "libvirt_uri": opts.libvirt_uri, "slots": opts.slots}
    if opts.images_dir is None and not env.get("GH_RUNNER_IMAGES_DIR") and env.get("GH_IMAGES_DIR"):
        flags["images_dir"] = Path(env["GH_IMAGES_DIR"])
    flags.update(server="http://127.0.0.1:1", token="gh_rn_placeholder", name=name)
    return load_config(flags=flags, env=env, config_file=opts.config, defaults={"slots": DEFAULT_SLOTS})


def _default_task_minutes() -> int:
    from gh_server.settings import Settings

    return int(Settings.model_fields["max_task_minutes"].default)


def main(args: Any) -> int:
    """Entry point for `gh-runner local` (dispatched by gh_runner.cli)."""
    try:
        opts = options_from_args(args)
        case_file = load_case_file(opts.cases)
        check_task_minutes(case_file, int(opts.server_settings.get("max_task_minutes") or _default_task_minutes()))
    except (CaseFileError, ValueError) as e:
        print(f"gh-runner local: {e}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(LocalRun(opts, case_file).main())


# ---------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------


class Progress:
    """A one-line bar on a terminal; a plain line per change otherwise (logs, CI)."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self.stream = stream
        self.total = total
        self._total_now = total
        self.tty = stream.isatty()
        self._last: tuple[int, ...] | None = None
        self._line: str | None = None  # the bar's text while it is on screen
        self._done = 0
        self._t0 = time.monotonic()

    def _draw_bar(self, done: int, text: str) -> None:
        width = 30
        total = self._total_now
        filled = int(width * done / total) if total else width
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}\033[K")
        self.stream.flush()

    def update(self, progress: dict[str, Any]) -> None:
        total = int(progress.get("total") or self.total)
        counts = tuple(int(progress.get(k) or 0)
                       for k in ("passed", "failed", "error", "assisted", "running", "queued"))
        passed, failed, error, assisted, running, queued = counts
        done = passed + failed + error + assisted
        elapsed = time.monotonic() - self._t0
        text = (f"{done}/{total} done  passed {passed}  failed {failed}  error {error}  assisted {assisted}  "
                f"running {running}  queued {queued}  {elapsed:,.0f}s")
        if self.tty:
            self._total_now = total
            self._draw_bar(done, text)
        elif counts != self._last:
            self.stream.write(text + "\n")
            self.stream.flush()
        self._last = counts
        if self.tty:
            self._line, self._done = text, done

    def above(self, stream: TextIO, text: str) -> None:
        """Write `text` (whole lines) to `stream` above the bar: clear the bar's line, write, redraw it.
        Without a bar on screen (not a terminal, not drawn yet, or finished) the text is written as it is."""
        if self._line is not None:
            self.stream.write("\r\033[K")
            self.stream.flush()
        stream.write(text)
        stream.flush()
        if self._line is not None:
            self._draw_bar(self._done, self._line)

    def finish(self) -> None:
        if self.tty:
            self._line = None
            self.stream.write("\n")
            self.stream.flush()


class LogsAbove:
    """A text stream for log lines that writes each whole line above the progress bar (when there is
    one), so a warning never breaks into the bar or lands at the end of its line."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.progress: Progress | None = None
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            whole, _, self._pending = self._pending.rpartition("\n")
            if self.progress is not None:
                self.progress.above(self.stream, whole + "\n")
            else:
                self.stream.write(whole + "\n")
                self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def _quiet_server_class() -> type:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn without its own SIGINT/SIGTERM handling: Ctrl-C must stop the runner (and its
        machines) before the control plane it reports to, so `LocalRun` handles the signals."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietServer


def _quiet_server(config: Any) -> Any:
    return _quiet_server_class()(config)


class RunnerName:
    """A runner name no other live `gh-runner local` on this host holds: `local-1`, `local-2`, ...

    The QEMU provider names machines after the runner and reaps, at start, every machine of its
    name that it does not know. A shared name would let one local run destroy another's machines;
    a unique random name would let a killed run's machines linger forever. A name held by an
    exclusive lock is both: a later run that gets the same name reaps what a dead one left.
    """

    def __init__(self, lock_dir: Path = DEFAULT_OUTPUT_ROOT / "locks", limit: int = 64) -> None:
        import fcntl

        lock_dir.mkdir(parents=True, exist_ok=True)
        for i in range(1, limit + 1):
            fd = os.open(lock_dir / f"local-{i}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.name = f"local-{i}"
            self._fd: int | None = fd
            return
        raise LocalError(f"{limit} gh-runner local runs are already going on this host")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


def _traversable_tmpdir(prefix: str) -> Path:
    # QEMU runs as libvirt-qemu: overlays must sit under directories it can traverse.
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    d.chmod(0o755)
    return d


class LocalRun:
    # A try that ended in error makes the run exit 1 (the errors block says why). `validate` says
    # False: finding the cases that error is its job, and its verdicts say so (--strict makes it exit 3).
    errors_fail = True

    def __init__(self, opts: Options, case_file: CaseFile, out: TextIO | None = None) -> None:
        self.opts = opts
        self.cf = case_file
        self.out = out or sys.stdout
        self.agents = opts.agents or case_file.agents or ["default"]
        self.repeat = opts.repeat or case_file.repeat or 1
        self.interrupted = False
        self._stop = asyncio.Event()
        self.server: Any = None
        self.daemon: Any = None
        self.state: Any = None
        self.run_id: str | None = None
        self._tmp: Path | None = None
        self._state_tmp: Path | None = None
        self._server_task: asyncio.Task[Any] | None = None
        self._daemon_task: asyncio.Task[Any] | None = None
        self._name: RunnerName | None = None
        self.logs = LogsAbove(sys.stderr)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        try:
            code = await self._main()
        except LocalError as e:
            self.say(f"gh-runner local: {e}")
            code = e.exit_code
        except httpx.HTTPError as e:
            self.say(f"gh-runner local: the embedded control plane stopped answering: {type(e).__name__}: {e}")
            code = EXIT_FAILED
        finally:
            # Still ours during the clean-up: a second Ctrl-C forces the runner, never skips the clean-up.
            try:
                await self._shutdown()
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
        if self.interrupted:
            self.say("gh-runner local: interrupted; every machine was destroyed")
            return EXIT_INTERRUPTED
        return code

    def _on_signal(self) -> None:
        if self.interrupted:  # a second Ctrl-C: stop the daemon at once
            if self.daemon is not None:
                self.daemon.force_stop()
            return
        self.interrupted = True
        self._stop.set()

    async def _main(self) -> int:
        from gh_runner.config import ConfigError

        self._tmp = _traversable_tmpdir("gh-runner-local-")
        state_dir = None
        if self.opts.state_dir is None and not os.environ.get("GH_RUNNER_STATE_DIR"):
            self._state_tmp = state_dir = self._tmp / "runner-state"
            self._state_tmp.mkdir(mode=0o755)
        self._name = RunnerName()
        try:
            config = runner_config(self.opts, os.environ, self._name.name, state_dir)
        except ConfigError as e:
            raise LocalConfigError(str(e)) from None

        await self._check_images(config)
        # The cases' images are hot from the start: its runner will be leased nothing else. (Names
        # of images found in the images dir: valid, so this raises nothing.)
        config = config.keeping(self._images())
        base_url, admin_key = await self._start_server()
        async with httpx.AsyncClient(base_url=base_url, timeout=HTTP_TIMEOUT,
                                     headers={"Authorization": f"Bearer {admin_key}"}) as http:
            token = await self._register_runner(http)
            await self._start_daemon(config, base_url, token)
            await self._wait_runner_online(http)
            case_ids = await self._create_cases(http)
            run = await self._create_run(http, case_ids)
            self.run_id = run["test_run_id"]
            total = int(run["progress"]["total"])
            self.say(f"run {self.run_id}: {len(case_ids)} case(s) x {len(self.agents)} agent(s) "
                     f"({', '.join(self.agents)}) x {self.repeat} tr{'y' if self.repeat == 1 else 'ies'} "
                     f"= {total} tries, runner {config.name} with {config.slots} slot(s), "
                     f"{plan_pool(config).describe()}, server {base_url}")
            run = await self._wait(http, run, total)
            if self.interrupted:
                return await self._interrupted(http, run)
            return await self._finish(http, run)

    async def _interrupted(self, http: httpx.AsyncClient, run: dict[str, Any]) -> int:
        """Ctrl-C: the tries that finished before it go to a partial report; the rest are cancelled."""
        # The finished tries first, so nothing the cancel ends is taken for a result.
        finished = [a for a in await _list_all(http, f"/v1/test_runs/{self.run_id}/attempts")
                    if a.get("finished_at") and a.get("outcome") in ("passed", "failed", "error")]
        with contextlib.suppress(Exception):
            await http.post(f"/v1/test_runs/{self.run_id}/cancel")
        if self.daemon is not None:
            self.daemon.force_stop()  # machines go while the report is written
        await self._finish(http, run, partial=finished)
        return EXIT_INTERRUPTED

    def _images(self) -> list[str]:
        """The images the cases start from."""
        return sorted({str(c["start_state"]) for c in self.cf.cases})

    async def _check_images(self, config: Any) -> None:
        from gh_runner.provider_factory import make_provider

        wanted = self._images()
        provider = make_provider(config)
        try:
            images = {i.name for i in await within(300, provider.list_images())}
        except Exception as e:
            raise LocalError(f"cannot list images in {config.images_dir}: {e}") from None
        finally:
            with contextlib.suppress(Exception):
                await within(30, provider.close())
        missing = [w for w in wanted if w not in images]
        if missing:
            have = ", ".join(sorted(images)) or "none"
            raise LocalConfigError(
                f"image(s) {', '.join(missing)} not found in {config.images_dir} (found: {have}); build them with "
                f"`image-builder/build linux-tiny --out {config.images_dir}` or pass --images-dir")

    async def _start_server(self) -> tuple[str, str]:
        import uvicorn

        from gh_server.app import HTTP_KEEP_ALIVE_S, create_app
        from gh_server.listener import listen_socket
        from gh_server.live.sockets import LiveBoundedWebSockets
        from gh_server.settings import Settings

        assert self._tmp is not None
        # Bound here and handed to uvicorn, so no other process can take the port in between.
        sock = listen_socket("127.0.0.1", 0)
        port = sock.getsockname()[1]
        admin_key = "gh_live_" + secrets.token_urlsafe(32)
        settings = Settings(data_dir=self._tmp / "server", host="127.0.0.1", port=port, admin_api_key=admin_key,
                            runner_grace_seconds=60.0, **self.opts.server_settings)
        try:
            app = await asyncio.to_thread(create_app, settings)
        except ValueError as e:  # e.g. command agents and no sandbox for them on this host (docs/security.md)
            raise LocalConfigError(f"the embedded control plane cannot start: {e}") from None
        with contextlib.suppress(ImportError):
            from gh_server import replays

            if not any(getattr(r, "path", "") == "/v1/attempts/{attempt_id}/replay" for r in app.routes):
                replays.install(app, app.state.gh)
        self.state = app.state.gh
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, ws=LiveBoundedWebSockets,
                                ws_ping_interval=None, ws_ping_timeout=None,  # dead_after is the one bound
                                timeout_keep_alive=HTTP_KEEP_ALIVE_S)
        self.server = _quiet_server(config)
        self._server_task = asyncio.create_task(self.server.serve(sockets=[sock]), name="gh-server")
        deadline = time.monotonic() + 60
        while not self.server.started:
            if self._server_task.done():
                exc = self._server_task.exception()
                raise LocalError(f"the embedded control plane did not start: {exc!r}")
            if time.monotonic() > deadline:
                raise LocalError("the embedded control plane did not start within 60 s")
            await asyncio.sleep(0.05)
        return f"http://127.0.0.1:{port}", admin_key

    async def _register_runner(self, http: httpx.AsyncClient) -> str:
        r = await http.post("/v1/runners", json={"name": self._name.name if self._name else "local"})
        if r.status_code >= 300:
            raise LocalError(f"could not register the runner: HTTP {r.status_code}: {r.text[:300]}")
        return str(r.json()["token"])

    async def _start_daemon(self, config: Any, base_url: str, token: str) -> None:
        from gh_runner.daemon import Daemon
        from gh_runner.log import configure_logging
        from gh_runner.provider_factory import make_provider

        # Only warnings: the run's own lines are the progress; they print above the bar, never into it.
        configure_logging("console", "warning", stream=self.logs)  # type: ignore[arg-type]
        cfg = type(config).model_validate({**config.model_dump(), "token": token, "server": base_url})
        provider = make_provider(cfg)
        self.daemon = Daemon(cfg, provider)
        self._daemon_task = asyncio.create_task(self.daemon.run(), name="gh-runner")

    async def _wait_runner_online(self, http: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + RUNNER_CONNECT_TIMEOUT
        while time.monotonic() < deadline and not self._stop.is_set():
            if self._daemon_task is not None and self._daemon_task.done():
                raise LocalError(f"the runner stopped before it connected (exit {self._daemon_task.result()})")
            r = await http.get("/v1/runners")
            if r.status_code == 200 and any(x.get("status") == "online" for x in r.json().get("data", [])):
                return
            await self._sleep(0.2)
        if not self._stop.is_set():
            raise LocalError(f"the runner did not connect within {RUNNER_CONNECT_TIMEOUT:.0f} s")

    async def _create_cases(self, http: httpx.AsyncClient) -> list[str]:
        r = await http.post("/v1/test_cases/batch", json={"cases": self.cf.cases})
        if r.status_code >= 300:
            raise LocalError(f"{self.cf.path}: the control plane refused the cases: {_api_error(r)}")
        return [c["test_case_id"] for c in r.json()["data"]]

    async def _create_run(self, http: httpx.AsyncClient, case_ids: list[str]) -> dict[str, Any]:
        name = self.cf.name or f"gh-runner local {self.cf.path.name}"
        body = {"test_case_ids": case_ids, "agents": self.agents, "repeat": self.repeat, "name": name}
        r = await http.post("/v1/test_runs", json=body)
        if r.status_code >= 300:
            raise LocalError(f"could not start the run: {_api_error(r)}")
        return dict(r.json())

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    def _deadline(self, total: int) -> float:
        minutes = max(int((c.get("limits") or {}).get("minutes") or 10) for c in self.cf.cases)
        slots = max(1, self.daemon.config.slots if self.daemon is not None else 1)
        per_attempt = minutes * 60 + 900  # task limit + generous machine/setup/check/teardown bounds on TCG
        return time.monotonic() + 600 + per_attempt * 3 * total / slots  # 3: an error is retried twice

    async def _wait(self, http: httpx.AsyncClient, run: dict[str, Any], total: int) -> dict[str, Any]:
        progress = Progress(self.out, total)
        self.logs.progress = progress
        deadline = self._deadline(total)
        try:
            while not self._stop.is_set():
                r = await http.get(f"/v1/test_runs/{self.run_id}")
                if r.status_code == 200:
                    run = dict(r.json())
                    progress.update(run.get("progress") or {})
                    if run.get("status") in ("completed", "cancelled"):
                        return run
                if self._daemon_task is not None and self._daemon_task.done():
                    raise LocalError("the runner stopped in the middle of the run")
                if time.monotonic() > deadline:
                    raise LocalError("the run did not finish in time; see the runner's warnings above")
                await self._sleep(POLL_INTERVAL)
        finally:
            self.logs.progress = None
            progress.finish()
        return run

    async def _finish(self, http: httpx.AsyncClient, run: dict[str, Any],
                      partial: list[dict[str, Any]] | None = None) -> int:
        """Write the report and the page, print the table and the errors; the exit code. `partial`:
        the tries that finished before Ctrl-C, reported alone (and said to be partial)."""
        assert self.run_id is not None
        if partial is None:
            results_r = await http.get(f"/v1/test_runs/{self.run_id}/results")
            results = results_r.json() if results_r.status_code == 200 else None
            listed = await _list_all(http, f"/v1/test_runs/{self.run_id}/attempts")
        else:
            results, listed = None, partial  # the server's totals would count the cancelled tries
        # Results count the last attempt of each try; the retried ones go to the report on their own.
        attempts = [a for a in listed if a.get("is_last", True)]
        # Replays go to a folder named after the run, so two runs reported into one folder never mix.
        if self.opts.report is not None:
            report_path, replays_dir = self.opts.report, self.opts.report.parent / f"{self.run_id}-replays"
        else:
            report_path = DEFAULT_OUTPUT_ROOT / self.run_id / "report.json"
            replays_dir = report_path.parent / "replays"
        keep = {str(a["attempt_id"]) for a in listed} if partial is not None else None
        all_attempts = await asyncio.to_thread(self._export_replays, replays_dir, keep,
                                               report_path.with_suffix(".html"))
        for a in attempts:
            page = replays_dir / str(a["attempt_id"]) / "index.html"
            a["replay_path"] = str(page) if page.is_file() else None
        rows = rows_from_attempts(attempts, self.cf.keys)
        summaries = summarize_agents(rows, self.agents)
        report = build_report(run, results, attempts, all_attempts, case_order=self.cf.keys,
                              replays=str(replays_dir), partial=partial is not None)
        await asyncio.to_thread(write_report, report_path, report)
        page = await asyncio.to_thread(self._write_page, report_path.with_suffix(".html"), replays_dir)
        self.say("")
        self.say(render_table(rows, summaries))
        errors = render_errors(attempts)
        if errors:
            self.say("")
            self.say(errors)
        self.say("")
        self.say(f"report:  {report_path}")
        self.say(f"page:    {page}")
        self.say(f"replays: {replays_dir}/<attempt_id>/index.html")
        if partial is not None:
            self.say(f"gh-runner local: interrupted: a partial report of the {len(attempts)} tr"
                     f"{'y' if len(attempts) == 1 else 'ies'} that finished is in {report_path}; the others "
                     "were cancelled")
            return EXIT_INTERRUPTED
        unfinished = [a for a in attempts if a.get("outcome") not in ("passed", "failed", "error")]
        if run.get("status") != "completed" or unfinished:
            self.say(f"gh-runner local: the run ended {run.get('status')} with {len(unfinished)} "
                     "tr(ies) that did not run to an outcome")
            return EXIT_FAILED
        errored = [a for a in attempts if a.get("outcome") == "error"]
        if errored and self.errors_fail:
            self.say(f"gh-runner local: {len(errored)} of {len(attempts)} tr"
                     f"{'y' if len(attempts) == 1 else 'ies'} ended in error (see errors above); exit 1")
            return EXIT_FAILED
        return EXIT_OK

    def _write_page(self, page: Path, replays_dir: Path) -> Path:
        """report.html: the results page (gh_server/report_page.py), its replay links relative to it."""
        from gh_server import models, report_page

        def replay(attempt_id: str) -> str | None:
            target = replays_dir / attempt_id / "index.html"
            return os.path.relpath(target, page.parent) if target.is_file() else None

        with self.state.db() as s:
            run = s.get(models.TestRun, self.run_id)
            assert run is not None
            text = report_page.render(report_page.page_data(s, run, replay, lambda _rid: None))
        page.write_text(text, encoding="utf-8")
        return page

    def _export_replays(self, replays_dir: Path, keep: set[str] | None = None,
                        run_page: Path | None = None) -> list[dict[str, Any]]:
        """Every attempt of the run (or those in `keep`), retries included, with its replay written to disk."""
        from sqlalchemy import select

        from gh_server import models
        from gh_server.replays import export_replay

        out: list[dict[str, Any]] = []
        replays_dir.mkdir(parents=True, exist_ok=True)
        with self.state.db() as s:
            rows = s.scalars(select(models.Attempt).where(models.Attempt.test_run_id == self.run_id)
                             .order_by(models.Attempt.created_at)).all()
            for row in rows:
                if keep is not None and row.id not in keep:
                    continue
                export_replay(s, row.id, replays_dir, run_page)
                rc = s.get(models.RunCase, row.run_case_id)
                out.append(_attempt_dict(row, (rc.case or {}).get("key") if rc is not None else None))
        return out

    async def _shutdown(self) -> None:
        """Stop the runner (its attempts destroy their machines), reap anything left, stop the server,
        and remove the temp dir. Runs on every exit path."""
        if self.daemon is not None and self._daemon_task is not None:
            if self.interrupted or not self._daemon_task.done():
                if self.interrupted:
                    self.daemon.force_stop()
                else:
                    self.daemon.request_stop()
            with contextlib.suppress(Exception):
                await within(300, asyncio.shield(self._daemon_task))
            if not self._daemon_task.done():
                self.daemon.force_stop()
                with contextlib.suppress(Exception):
                    await within(120, self._daemon_task)
            await self._reap_leftovers()
        if self.server is not None and self._server_task is not None:
            self.server.should_exit = True
            with contextlib.suppress(Exception):
                await within(30, self._server_task)
        if self.state is not None:
            with contextlib.suppress(Exception):
                self.state.engine.dispose()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        if self._name is not None:
            self._name.release()

    async def _reap_leftovers(self) -> None:
        # Belt and braces after a forced stop: a fresh provider finds this runner's domains and overlays.
        from gh_runner.provider_factory import make_provider

        try:
            provider = make_provider(self.daemon.config)
            try:
                left = await within(300, provider.reap(keep=set()))
                if left:
                    self.say(f"gh-runner local: removed {len(left)} leftover machine(s)")
            finally:
                await within(30, provider.close())
        except Exception as e:
            self.say(f"gh-runner local: could not check for leftover machines: {e}")


def _attempt_dict(row: Any, key: str | None) -> dict[str, Any]:
    from gh_server import serialize

    def ts(t: Any) -> str | None:
        return t.isoformat().replace("+00:00", "Z") if t is not None else None

    return {"attempt_id": row.id, "test_case_id": row.test_case_id, "key": key, "agent_id": row.agent_id,
            "try": row.try_number, "retry_of": row.retry_of, "status": row.status, "outcome": row.outcome,
            "assisted": bool(row.assisted), "error": row.error, "error_cause": serialize.error_cause(row),
            "check": row.check, "metrics": row.metrics, "runner_id": row.runner_id,
            "started_at": ts(row.started_at), "finished_at": ts(row.finished_at)}


def _api_error(r: httpx.Response) -> str:
    try:
        err = r.json().get("error") or {}
        msg = str(err.get("message") or r.text)
        param = err.get("param")
        return f"{msg} ({param})" if param and str(param) not in msg else msg
    except ValueError:
        return f"HTTP {r.status_code}: {r.text[:300]}"


async def _list_all(http: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(1000):
        params: dict[str, Any] = {"limit": 100}
        if cursor:
            params["cursor"] = cursor
        r = await http.get(url, params=params)
        if r.status_code != 200:
            raise LocalError(f"could not list {url}: {_api_error(r)}")
        body = r.json()
        out.extend(body.get("data") or [])
        cursor = body.get("next_cursor")
        if not body.get("has_more") or not cursor:
            break
    return out

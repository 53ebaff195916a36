"""`gh-runner local` as an operator runs it: a small cases file on the real linux-tiny guest, the
embedded control plane and runner in one process, the table, the JSON report and the replays; a
bad file; and Ctrl-C in the middle of a run, which must leave no machine behind."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from agentfiles import agent_command
from kit.libvirt import domains
from kit.scratch import scratch_dir

from gh_local.local import LogsAbove, Progress, RunnerName
from gh_local.report import group_errors, render_errors

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "linux-basics.yaml"
GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")


@pytest.fixture()
def work() -> Iterator[Path]:
    with scratch_dir("gh-local-test-") as d:
        yield d


def _cases_file(work: Path, keys: list[str], **top: object) -> Path:
    data = yaml.safe_load(EXAMPLES.read_text())
    data["cases"] = [c for c in data["cases"] if c["key"] in keys]
    data.update(top)
    path = work / "cases.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _local(args: list[str], images_dir: Path, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([GH_RUNNER, "local", *args, "--images-dir", str(images_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]


def _local_on_a_terminal(args: list[str], images_dir: Path, work: Path, timeout: float) -> tuple[int, str, str]:
    """`gh-runner local` with its stdout on a pseudo-terminal; (exit code, what the terminal showed, stderr)."""
    import pty

    master, slave = pty.openpty()
    err_path = work / "stderr.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen([GH_RUNNER, "local", *args, "--images-dir", str(images_dir)],
                                stdout=slave, stderr=err, stdin=subprocess.DEVNULL, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal's last writer
                break
            if not chunk:
                break
            chunks.append(chunk)
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    return rc, b"".join(chunks).decode(errors="replace"), err_path.read_text()


def _floats(value: object) -> Iterator[float]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, list):
        for v in value:
            yield from _floats(v)


def _runner_name(out: str) -> str:
    m = re.search(r"runner (local-\d+) with", out)
    assert m, out
    return m.group(1)


def test_runner_names_are_held_until_released(work: Path) -> None:
    a = RunnerName(work / "locks")
    b = RunnerName(work / "locks")
    assert (a.name, b.name) == ("local-1", "local-2")
    a.release()
    c = RunnerName(work / "locks")
    assert c.name == "local-1"  # a name is reused once its holder is gone: it then reaps its leftovers
    b.release()
    c.release()


def test_progress_is_a_bar_on_a_tty_and_lines_otherwise() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    plain = io.StringIO()
    p = Progress(plain, 4)
    p.update({"total": 4, "passed": 1, "queued": 3})
    p.update({"total": 4, "passed": 1, "queued": 3})  # unchanged: no new line
    p.update({"total": 4, "passed": 1, "failed": 1, "queued": 2})
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("2/4 done  passed 1  failed 1")
    tty = Tty()
    p = Progress(tty, 4)
    p.update({"total": 4, "passed": 2, "running": 2})
    p.finish()
    assert tty.getvalue().startswith("\r[###############...............] 2/4 done")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_lines_print_above_the_progress_bar() -> None:
    screen = _Tty()  # stdout and stderr on one terminal, as an operator runs it
    p = Progress(screen, 4)
    logs = LogsAbove(screen)
    logs.write("before the bar\n")  # no bar yet: written as it is
    logs.progress = p
    p.update({"total": 4, "passed": 1, "running": 1, "queued": 2})
    logs.write("a warn")  # a line in pieces is held until it is whole
    logs.write("ing\n")
    p.finish()
    logs.progress = None
    out = screen.getvalue()
    bar = out[out.index("\r["):].split("\033[K")[0]
    # The bar is cleared, the line written on its own line, and the bar drawn again below it.
    assert out == f"before the bar\n{bar}\033[K\r\033[Ka warning\n{bar}\033[K\n", repr(out)


def test_errors_are_grouped_by_cause_and_reason() -> None:
    def attempt(key: str, agent: str, n: int, outcome: str, error: str | None = None,
                cause: str | None = None) -> dict[str, object]:
        return {"attempt_id": f"at_{key}{agent}{n}", "key": key, "agent_id": agent, "try": n, "outcome": outcome,
                "error": error, "error_cause": cause}

    attempts = [
        attempt("A", "noop", 1, "error", "the machine did not boot", "infrastructure"),
        attempt("A", "noop", 2, "error", "check before printed 'true', not True or False", "case"),
        attempt("B", "noop", 1, "error", "check before printed 'true', not True or False", "case"),
        attempt("B", "noop", 2, "passed"),
        attempt("C", "noop", 1, "error", "setup exited 3"),
    ]
    groups = group_errors(attempts)
    assert [(g["cause"], g["count"]) for g in groups] == [("case", 2), ("infrastructure", 1), (None, 1)]
    text = render_errors(attempts)
    lines = text.splitlines()
    assert lines[0] == "errors: 4 of 5 tries (not counted against any agent):"
    assert lines[1].startswith("  your case") and lines[1].endswith(": 2")
    assert lines[2] == "    2x check before printed 'true', not True or False"
    assert lines[3] == "       A/noop try 2, B/noop try 1"
    assert lines[4].startswith("  ours (machine") and "the machine did not boot" in lines[5]
    assert render_errors([attempt("B", "noop", 1, "failed")]) == ""


def test_bad_cases_file_exits_2_naming_case_and_field(work: Path, images_dir: Path) -> None:
    path = _cases_file(work, ["PRM-01"])
    data = yaml.safe_load(path.read_text())
    data["cases"][0]["limits"] = {"minutes": 99}
    path.write_text(yaml.safe_dump(data))
    proc = _local([str(path)], images_dir)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    assert "case 'PRM-01' (cases[0]): field limits.minutes" in err
    assert "runner local-" not in out  # refused before anything started


def test_missing_image_is_a_configuration_error(work: Path) -> None:
    empty = work / "images"
    empty.mkdir(mode=0o755)
    for images in (empty, work / "no-such-dir"):
        proc = _local([str(_cases_file(work, ["PRM-01"]))], images)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, (out, err)  # as a bad cases file is: exit 2 for usage and configuration
        assert f"image(s) linux-tiny not found in {images}" in out
        assert "image-builder/build linux-tiny" in out


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd is PID 1 here: the sandbox is there")
def test_command_agent_without_its_sandbox_is_refused_plainly(work: Path, images_dir: Path) -> None:
    config = work / "server.yaml"
    config.write_text("agent_sandbox: systemd\nagents: {mine: {kind: command, command: [/bin/true]}}\n")
    proc = _local([str(_cases_file(work, ["PRM-01"], agents=["mine"])), "--server-config", str(config)], images_dir)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, (out, err)
    assert "the embedded control plane cannot start: agent_sandbox systemd: systemd is not PID 1" in out
    assert "Traceback" not in err


def test_bad_server_config_exits_2_naming_the_setting(work: Path, images_dir: Path) -> None:
    cases = _cases_file(work, ["PRM-01"])
    for text, expected in (("port: 9000\n", "port cannot be set for the embedded control plane"),
                           ("agents: {mine: {kind: telepathy}}\n", "agents.mine.kind"),
                           ("agents: {mine: {kind: command}}\n", "kind command needs a non-empty `command`")):
        config = work / "server.yaml"
        config.write_text(text)
        proc = _local([str(cases), "--server-config", str(config)], images_dir)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (out, err)
        assert expected in err, err
        assert "runner local-" not in out


@pytest.mark.timeout(900)
def test_runner_config_file_is_read(work: Path, images_dir: Path) -> None:
    """--config is the runner's config file, as for the daemon (examples/desktop-runner.yaml gives a desktop's
    first boot its time): its settings are the run's, and a wrong one stops the run naming the file."""
    config = work / "runner.yaml"
    config.write_text("timeouts: {ready: -5}\n")
    proc = _local([str(_cases_file(work, ["PRM-01"])), "--config", str(config)], images_dir)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    assert f"config file {config}" in out + err and "timeouts.ready" in out + err, (out, err)
    assert "runner local-" not in out
    config.write_text("warm_snapshots: false\nslots: 1\n")  # the file's slots, not local's default of 2
    proc = _local([str(_cases_file(work, ["PRM-01"], agents=["noop"], repeat=1)), "--config", str(config)],
                  images_dir)
    out, err = proc.communicate(timeout=800)
    assert proc.returncode == 0, (out[-3000:], err[-3000:])
    assert "hot pool off (warm snapshots are off" in out, out
    assert "with 1 slot(s)" in out, out
    assert domains(f"gh-{_runner_name(out)}-") == []


@pytest.mark.timeout(900)
def test_own_agent_from_server_config(work: Path, images_dir: Path) -> None:
    config = work / "server.yaml"
    config.write_text(yaml.safe_dump({"agents": {"mine": {
        "kind": "command", "command": agent_command(Path(__file__).parent / "agents" / "slow_fixer.py",
                                                    "--quick")}}}))
    # On a terminal, as an operator runs it: the progress is one line redrawn in place.
    rc, out, err = _local_on_a_terminal(
        [str(_cases_file(work, ["PRM-01"], agents=["mine"], repeat=1)), "--server-config", str(config)],
        images_dir, work, timeout=800)
    assert rc == 0, (out[-3000:], err[-3000:])
    progress = out[:out.index("case ")]
    redraws = progress.count("\r[")
    assert redraws >= 2, progress
    assert progress.count(" done  passed") == redraws, progress  # every progress text is a redraw of the bar
    assert "\033[K" in progress
    out = out.replace("\r\n", "\n")  # the terminal's line discipline turns \n into \r\n
    table = out[out.index("case "):]
    assert table.splitlines()[2].split()[:6] == ["PRM-01", "mine", "1", "1", "0", "0"]
    assert domains(f"gh-{_runner_name(out)}-") == []


@pytest.mark.timeout(1200)
def test_local_runs_cases_and_reports(work: Path, images_dir: Path) -> None:
    path = _cases_file(work, ["PRM-01", "ASK-01"], agents=["noop"], repeat=1)
    report = work / "out" / "report.json"
    # As an operator runs it, with no state dir given (the suite's other runs share one, tests/conftest.py):
    # the runner's state is in a temporary dir of local's own, gone after the run.
    env = {k: v for k, v in os.environ.items() if k != "GH_RUNNER_STATE_DIR"}
    temps_before = set(Path("/var/tmp").glob("gh-runner-local-*"))
    proc = _local([str(path), "--agents", "noop,reference", "--report", str(report)], images_dir, env=env)
    out, err = proc.communicate(timeout=1100)
    assert proc.returncode == 0, (out[-3000:], err[-3000:])
    assert set(Path("/var/tmp").glob("gh-runner-local-*")) <= temps_before
    assert "4 tries" in out  # flags won over the file's agents
    table = out[out.index("case "):]
    rows = {tuple(line.split()[:2]): line.split()[2:6] for line in table.splitlines()[2:6]}
    assert rows[("PRM-01", "noop")] == ["1", "0", "1", "0"]
    assert rows[("PRM-01", "reference")] == ["1", "1", "0", "0"]
    assert rows[("ASK-01", "reference")] == ["1", "1", "0", "0"]
    assert "reference  100%  (95% CI" in out and "noop       0%" in out
    data = json.loads(report.read_text())
    assert data["agents"]["reference"]["pass_rate"] == 1.0
    assert len(data["attempts"]) == 4
    # Every number in the report is rounded (no 5.9495000000000005).
    floats = list(_floats(data))
    assert floats and all(round(f, 3) == f for f in floats), [f for f in floats if round(f, 3) != f][:5]
    # The replays sit beside the report in a folder named after the run: two runs never mix.
    run_id = data["test_run_id"]
    replays = report.parent / f"{run_id}-replays"
    # The runner boots the image once for its warm snapshot and attempts restore from it: lazily, or
    # from the hot pool `local` keeps by default (gh_runner/poolsize.py); one that would wait for the build past its
    # deadline boots cold instead.
    origins = {a["metrics"]["machine_origin"] for a in data["attempts"]}
    assert origins & {"lazy", "pooled"} and origins <= {"lazy", "pooled", "cold"}, origins
    assert all(a["metrics"]["phase_seconds"]["machine"] > 0 for a in data["attempts"])
    for a in data["attempts"]:
        page = Path(a["replay_path"])
        assert page.is_file() and (page.parent / "frames").is_dir()
        assert page.parent.parent == replays
        assert "replay-data" in page.read_text()
    assert f"report:  {report}" in out
    assert domains(f"gh-{_runner_name(out)}-") == []


@pytest.mark.timeout(900)
def test_a_try_ending_in_error_exits_1_with_the_errors_block_and_the_report(work: Path, images_dir: Path) -> None:
    path = _cases_file(work, ["PRM-01"], agents=["noop"], repeat=1)
    data = yaml.safe_load(path.read_text())
    data["cases"][0]["success"]["check_script"] = "echo true\n"  # lower case: not a verdict
    path.write_text(yaml.safe_dump(data))
    report = work / "out" / "report.json"
    proc = _local([str(path), "--report", str(report)], images_dir)
    out, err = proc.communicate(timeout=800)
    assert proc.returncode == 1, (out[-3000:], err[-3000:])
    block = out[out.index("errors: 1 of 1 try"):]
    assert block.splitlines()[1].startswith("  your case"), block  # the author's check, not the platform
    assert "PRM-01/noop try 1" in block and "true" in block.splitlines()[2], block
    assert "1 of 1 try ended in error" in out
    saved = json.loads(report.read_text())  # the report is still written
    assert saved["attempts"][0]["outcome"] == "error" and saved["errors"][0]["count"] == 1
    assert saved["attempts"][0]["error_cause"] == "case" and saved["errors"][0]["cause"] == "case"
    # The same fault on a fresh machine: retried once, not twice (2 machines for the try, not 3).
    assert len(saved["retried_attempts"]) == 1
    assert domains(f"gh-{_runner_name(out)}-") == []


@pytest.mark.timeout(900)
def test_ctrl_c_stops_the_run_and_destroys_every_machine(work: Path, images_dir: Path) -> None:
    path = _cases_file(work, ["PRM-01", "FIL-01", "CFG-01"], agents=["noop"], repeat=10)
    proc = _local([str(path), "--report", str(work / "r.json")], images_dir, start_new_session=True)
    stdout = proc.stdout
    assert stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        name = None
        while time.monotonic() < deadline:  # Ctrl-C once a try finished and a machine of this run exists
            seen = "".join(lines)
            if name is None and re.search(r"runner local-\d+ with", seen):
                name = _runner_name(seen)
            done = [int(m) for m in re.findall(r"^(\d+)/30 done", seen, re.M)]
            if name is not None and done and 1 <= done[-1] < 30 and domains(f"gh-{name}-"):
                break
            if proc.poll() is not None:
                pytest.fail(f"gh-runner local ended early: {seen}")
            time.sleep(0.2)
        else:
            pytest.fail(f"no machine of this run showed up: {''.join(lines)}")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=300)
        reader.join(timeout=30)
        out = "".join(lines)
        assert proc.returncode == 130, out
        assert "interrupted; every machine was destroyed" in out
        assert domains(f"gh-{name}-") == []
        # The tries that finished before Ctrl-C are in a partial report, and the output says so.
        m = re.search(r"a partial report of the (\d+) tr(?:y|ies) that finished is in (\S+);", out)
        assert m, out
        saved = json.loads(Path(m.group(2)).read_text())
        assert saved["partial"] is True and len(saved["attempts"]) == int(m.group(1)) >= 1
        assert all(a["outcome"] in ("passed", "failed", "error") for a in saved["attempts"])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)

"""Logging (redaction, attempt id binding, formats) and the journal on disk."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog

from gh_runner.journal import Journal, JournalError
from gh_runner.log import bind_attempt, configure_logging, get_logger, redactor
from gh_wire.protocol import AttemptResult

TOKEN = "gh_rn_verysecret_0011223344"


@pytest.fixture
def json_log() -> io.StringIO:
    buf = io.StringIO()
    configure_logging("json", "debug", stream=buf)
    yield buf
    structlog.reset_defaults()


def _lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def test_redaction_drops_tokens_and_secret_values(json_log: io.StringIO) -> None:
    redactor.add("hunter2-password-value")
    log = get_logger()
    log.info("dialing with " + TOKEN, token=TOKEN, headers={"Authorization": "Bearer abc.def"},
             note="typed hunter2-password-value into the box", nested=[{"api_key": "k"}, "Bearer xyz123"])
    try:
        raise RuntimeError(f"server said no to {TOKEN}")
    except RuntimeError:
        log.exception("failed")
    text = json_log.getvalue()
    assert TOKEN not in text and "hunter2-password-value" not in text and "abc.def" not in text
    assert "xyz123" not in text and '"k"' not in text
    first, second = _lines(json_log)
    assert first["event"] == "dialing with [redacted]"
    assert first["token"] == "[redacted]" and first["note"] == "typed [redacted] into the box"
    assert "RuntimeError: server said no to [redacted]" in str(second["exception"])
    redactor.discard(["hunter2-password-value"])
    log.info("hunter2-password-value again")
    assert _lines(json_log)[-1]["event"] == "hunter2-password-value again"


async def test_attempt_id_is_bound_on_every_line_of_its_task(json_log: io.StringIO) -> None:
    log = get_logger("x")

    async def attempt(aid: str) -> None:
        bind_attempt(aid)
        log.info("phase", phase="setup")
        await asyncio.sleep(0)
        structlog.get_logger("other.module").info("from somewhere else")

    await asyncio.gather(attempt("at_1"), attempt("at_2"))
    log.info("daemon line")
    lines = _lines(json_log)
    assert sorted(str(ln.get("attempt_id")) for ln in lines[:4]) == ["at_1", "at_1", "at_2", "at_2"]
    assert "attempt_id" not in lines[-1]
    assert all("timestamp" in ln and "level" in ln for ln in lines)


def test_console_format_is_plain_text() -> None:
    buf = io.StringIO()
    configure_logging("console", "info", stream=buf)
    try:
        get_logger().debug("hidden")
        get_logger().info("shown", token=TOKEN)
    finally:
        structlog.reset_defaults()
    out = buf.getvalue()
    assert "shown" in out and "hidden" not in out and TOKEN not in out and not out.startswith("{")


def _result(aid: str, outcome: str = "passed") -> AttemptResult:
    return AttemptResult(attempt_id=aid, outcome=outcome, finished_at=datetime.now(UTC))  # type: ignore[arg-type]


def test_a_result_acknowledged_while_the_journal_lists_them_is_left_out(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner acknowledges (removes) results on its journal thread while another reader lists them:
    a file gone between the listing and its read is not pending, and no error."""
    j = Journal(tmp_path / "state")
    j.open()
    for aid in ("at_1", "at_2", "at_3"):
        j.finish(_result(aid))
    real_glob = Path.glob

    def glob_then_ack(self: Path, pattern: str) -> Any:
        listed = list(real_glob(self, pattern))
        j.ack("at_1")  # between the listing and the looks at each file
        return iter(listed)

    monkeypatch.setattr(Path, "glob", glob_then_ack)
    assert sorted(r.attempt_id for r in j.pending_results()) == ["at_2", "at_3"]


def test_journal_lifecycle(tmp_path: Path) -> None:
    j = Journal(tmp_path / "state")
    j.open()
    assert stat.S_IMODE(os.stat(j.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o711  # QEMU must traverse it, nobody list it
    rec = j.record_inflight("at_1", "at_1", "tr_1")
    j.update_phase(rec, "checking", "check_before")
    assert [(r.attempt_id, r.phase) for r in Journal(tmp_path / "state").inflight()] == [("at_1", "check_before")]
    j.finish(_result("at_1"))
    assert j.inflight() == [] and [r.attempt_id for r in j.pending_results()] == ["at_1"]
    assert stat.S_IMODE(os.stat(j.results_dir / "at_1.json").st_mode) == 0o600
    assert j.ack("at_1") is True and j.ack("at_1") is False  # idempotent
    assert j.pending_results() == []
    with pytest.raises(JournalError):
        j.record_inflight("../evil", "x")
    assert j.ack("../evil") is False


def test_journal_recovery_keeps_results_and_quarantines_garbage(tmp_path: Path) -> None:
    j = Journal(tmp_path / "state")
    j.open()
    j.record_inflight("at_done", "at_done")
    (j.results_dir / "at_done.json").write_text(_result("at_done").model_dump_json())  # crash between the two
    j.record_inflight("at_cut", "at_cut")
    (j.results_dir / "at_bad.json").write_text("{not json")
    (j.inflight_dir / ".at_x.json.1.2.tmp").write_text("half")
    j2 = Journal(tmp_path / "state")
    j2.open()
    made = j2.recover()
    assert [r.attempt_id for r in made] == ["at_cut"] and made[0].outcome == "error"
    assert "interrupted" in (made[0].error or "")
    assert sorted(r.attempt_id for r in j2.pending_results()) == ["at_cut", "at_done"]
    assert j2.inflight() == []
    assert any("at_bad.json" in p for p in j2.problems)
    assert len(list(j2.corrupt_dir.iterdir())) == 1
    assert not list(j2.inflight_dir.glob(".*.tmp"))


def test_journal_write_loops_over_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write may write less than asked (the kernel says so for signals and near-full disks)."""
    import gh_runner.journal as journal_mod

    real_write = os.write

    def short_write(fd: int, data: Any) -> int:
        return real_write(fd, bytes(data[:7]))  # never more than 7 bytes at a time

    j = Journal(tmp_path / "state")
    j.open()
    result = _result("at_short").model_copy(update={"answer": "a" * 5000})
    monkeypatch.setattr(journal_mod.os, "write", short_write)
    j.finish(result)
    monkeypatch.undo()
    assert [r.answer for r in j.pending_results()] == ["a" * 5000]


def test_journal_reports_a_full_disk_and_leaves_no_temp_file(tmp_path: Path) -> None:
    """A real 64 KiB tmpfs: the result does not fit, the write says "disk full", nothing half-written stays."""
    import subprocess

    from gh_runner.journal import DiskFull

    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True, timeout=30)
    try:
        j = Journal(mnt / "state")
        j.open()
        j.finish(_result("at_fits"))
        big = _result("at_big").model_copy(update={"answer": "b" * (256 * 1024)})
        with pytest.raises(DiskFull, match="disk full") as caught:
            j.finish(big)
        assert caught.value.errno == errno.ENOSPC  # still an OSError for callers that catch those
        assert not list(j.results_dir.glob(".*.tmp")) and not (j.results_dir / "at_big.json").exists()
        assert [r.attempt_id for r in j.pending_results()] == ["at_fits"]
    finally:
        subprocess.run(["umount", str(mnt)], check=True, timeout=30)


def test_a_full_disk_drops_the_in_flight_record_with_the_failed_result(tmp_path: Path) -> None:
    """A real 64 KiB tmpfs, full: the result cannot be journaled, and the attempt's in-flight record
    goes anyway, so the next start does not report the finished attempt as "interrupted"."""
    import subprocess

    from gh_runner.journal import DiskFull

    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True, timeout=30)
    try:
        j = Journal(mnt / "state")
        j.open()
        j.record_inflight("at_full", "at_full")
        big = _result("at_full").model_copy(update={"answer": "b" * (256 * 1024)})
        with pytest.raises(DiskFull):
            j.finish(big)
        assert j.inflight() == []
        assert Journal(mnt / "state").recover() == []  # the next start: nothing "interrupted"
    finally:
        subprocess.run(["umount", str(mnt)], check=True, timeout=30)

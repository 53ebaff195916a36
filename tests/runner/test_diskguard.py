"""The runner refuses leases when its state dir is short of disk (a real, tiny tmpfs), with a
reserve that scales down on a small filesystem (so a small state dir still runs)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gh_wire.protocol import LeaseRefusal, TaskEnd

from .peer import Peer, make_lease


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], check=True, timeout=30)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True, timeout=30)


async def test_lease_is_refused_with_a_typed_reason_when_the_disk_is_low(peer: Peer, start_daemon: Any,
                                                                         tiny_fs: Path) -> None:
    await start_daemon(peer.url, state_dir=tiny_fs / "state", disk_reserve_mib=4)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_room"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_room")
    # A guest's overlay (or anything else) fills the disk to below the reserve.
    (tiny_fs / "filler").write_bytes(b"\0" * (62 * 1024 * 1024))
    await peer.send(make_lease("at_full"))
    r = await peer.wait_type("lease_refuse", where=lambda m: m.attempt_id == "at_full")
    assert r.code == LeaseRefusal.DISK_LOW
    assert "MiB free under" in r.reason and "below the 4 MiB the runner keeps in reserve (disk_reserve_mib)" in r.reason
    (tiny_fs / "filler").unlink()
    await peer.send(make_lease("at_again"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_again")


async def test_a_small_state_dir_runs_with_the_reserve_scaled_down(peer: Peer, start_daemon: Any,
                                                                   tiny_fs: Path) -> None:
    """The default reserve (2048 MiB) on a 64 MiB filesystem: a tenth of it (6 MiB) is kept, so leases
    are taken until that tenth is reached, and the refusal says the reserve was scaled."""
    await start_daemon(peer.url, state_dir=tiny_fs / "state")
    await peer.wait_type("hello")
    await peer.send(make_lease("at_small"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_small")
    (tiny_fs / "filler").write_bytes(b"\0" * (60 * 1024 * 1024))
    await peer.send(make_lease("at_small_full"))
    r = await peer.wait_type("lease_refuse", where=lambda m: m.attempt_id == "at_small_full")
    assert r.code == LeaseRefusal.DISK_LOW
    assert "below the 6 MiB the runner keeps in reserve (disk_reserve_mib, scaled down to 10%" in r.reason


async def test_a_result_that_cannot_be_journaled_is_said_as_that(peer: Peer, start_daemon: Any, tiny_fs: Path) -> None:
    """A real full tmpfs: the result's journal write fails. The log says so (not "result journaled"), the
    result still goes out, and no in-flight record is left to come back as "interrupted"."""
    import io
    import json

    import structlog

    from gh_runner.log import configure_logging

    buf = io.StringIO()
    configure_logging("json", "info", stream=buf)
    try:
        r = await start_daemon(peer.url, state_dir=tiny_fs / "state", disk_reserve_mib=0)
        await peer.wait_type("hello")
        await peer.send(make_lease("at_nospace"))
        await peer.wait_type("attempt_status", where=lambda m: m.attempt_id == "at_nospace" and m.status == "running")
        with contextlib.suppress(OSError), (tiny_fs / "filler").open("wb", buffering=0) as f:
            while True:
                f.write(b"\0" * (1 << 16))
        await peer.send(TaskEnd(attempt_id="at_nospace", answer="done"))
        got = await peer.wait_type("attempt_result", where=lambda m: m.result.attempt_id == "at_nospace")
        assert got.result.outcome == "passed"
        assert list(r.daemon.journal.inflight_dir.glob("*.json")) == []
        events = [json.loads(line) for line in buf.getvalue().splitlines() if line.strip().startswith("{")]
        said = [str(e.get("event")) for e in events if e.get("attempt_id") == "at_nospace"]
        assert any(s.startswith("result NOT journaled (the disk is full)") for s in said), said
        assert "result journaled, sending" not in said
    finally:
        (tiny_fs / "filler").unlink(missing_ok=True)
        structlog.reset_defaults()

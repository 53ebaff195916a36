"""The runner refuses leases when its state dir is short of disk (a real, tiny tmpfs)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gh_wire.protocol import LeaseRefusal

from .peer import Peer, make_lease


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True, timeout=30)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True, timeout=30)


async def test_lease_is_refused_with_a_typed_reason_when_the_disk_is_low(peer: Peer, start_daemon: Any,
                                                                         tiny_fs: Path) -> None:
    await start_daemon(peer.url, state_dir=tiny_fs / "state", disk_reserve_mib=8)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_room"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_room")
    # A guest's overlay (or anything else) fills the disk to below the reserve.
    (tiny_fs / "filler").write_bytes(b"\0" * (10 * 1024 * 1024))
    await peer.send(make_lease("at_full"))
    r = await peer.wait_type("lease_refuse", where=lambda m: m.attempt_id == "at_full")
    assert r.code == LeaseRefusal.DISK_LOW
    assert "MiB free under" in r.reason and "below the 8 MiB" in r.reason
    (tiny_fs / "filler").unlink()
    await peer.send(make_lease("at_again"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_again")

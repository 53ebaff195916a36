"""The runner's journal: what must survive a crash, on disk under `<state-dir>/journal/`.

- `inflight/<attempt_id>.json`: written when a lease is accepted, before `lease_accept` is sent
  (atomically, not fsync'd: see `record_inflight`); removed when the attempt ends, whether or not
  its result could be journaled (see `finish`). A runner that restarts and finds one knows the
  attempt was interrupted: it turns it into an `error` result with a reason and reaps the
  machine (the machine id is the attempt id).
- `results/<attempt_id>.json`: every finished attempt's result, written and fsync'd before it is
  sent; removed only when the server acknowledges it (`result_ack`). Sent again after every
  reconnect and on a timer until then, so delivery is at-least-once; the server applies a result
  once per attempt id.

Every write is atomic (temp file, rename); results are also fsync'd, file and directory. A file that cannot be
parsed is moved to `corrupt/` and reported, never silently dropped or fatal.

The calls block on the disk briefly (small files; fsync only for what must survive a power cut).
"""

from __future__ import annotations

import errno
import json
import os
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from gh_runner.admission import is_safe_id
from gh_wire.protocol import AttemptResult


class JournalError(Exception):
    pass


@dataclass
class InflightRecord:
    attempt_id: str
    machine_id: str
    accepted_at: str
    test_run_id: str | None = None
    status: str = "preparing"
    phase: str = "accepted"
    phase_at: str | None = None  # when the attempt entered `phase` (ISO 8601): the hello reports it


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DiskFull(JournalError, OSError):
    """The journal could not be written because the disk (or the filesystem's quota) is full."""

    def __init__(self, path: Path, written: int, wanted: int) -> None:
        OSError.__init__(self, errno.ENOSPC, f"disk full writing {path.name}: {written} of {wanted} bytes written; "
                                             f"free space under {path.parent}")
        self.path = path


def _write_all(fd: int, data: bytes, path: Path) -> None:
    """os.write until every byte is written: a write may be short (a full disk, a signal), and a short
    write fsync'd and renamed would journal a truncated result as if it were whole."""
    view = memoryview(data)
    done = 0
    while done < len(data):
        try:
            n = os.write(fd, view[done:])
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(path, done, len(data)) from None
            raise
        if n <= 0:  # no progress and no error: treat as full rather than spin
            raise DiskFull(path, done, len(data))
        done += n


def _write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Write `data` to a temp file, then rename it over `path`; on any failure the temp file is
    removed and `path` is untouched. Raises DiskFull when the disk is full, OSError otherwise."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            _write_all(fd, data, path)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, DiskFull) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(path, 0, len(data)) from None  # ENOSPC from fsync or close (delayed allocation)
        raise
    if durable:
        _fsync_dir(path.parent)


class Journal:
    def __init__(self, state_dir: Path) -> None:
        self.root = Path(state_dir) / "journal"
        self.inflight_dir = self.root / "inflight"
        self.results_dir = self.root / "results"
        self.corrupt_dir = self.root / "corrupt"
        # Files that could not be read (moved aside), for the daemon to log: the journal does not log.
        self.problems: list[str] = []

    def open(self) -> None:
        # The state dir itself stays traversable (never readable): the provider keeps disks under it
        # that QEMU (another user under qemu:///system) must reach. The journal is private.
        if not self.root.parent.exists():
            self.root.parent.mkdir(parents=True)
            os.chmod(self.root.parent, 0o711)  # traversable (QEMU reaches disks below), not listable
        for d in (self.root, self.inflight_dir, self.results_dir):
            d.mkdir(mode=0o700, exist_ok=True)
        # Temp files from a write interrupted by a crash never became a record.
        for d in (self.inflight_dir, self.results_dir):
            for tmp in d.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)

    def _path(self, directory: Path, attempt_id: str) -> Path:
        if not is_safe_id(attempt_id):
            raise JournalError(f"attempt id {attempt_id[:80]!r} is not a safe file name")
        return directory / f"{attempt_id}.json"

    # -- in-flight ---------------------------------------------------------------------------

    def record_inflight(self, attempt_id: str, machine_id: str, test_run_id: str | None = None) -> InflightRecord:
        """Not fsync'd: it must survive the runner process dying (the page cache does that); a power
        cut that loses it is covered by the server, which errors leased attempts a reconnecting
        runner does not list as in flight, and by reaping every unknown machine at start-up."""
        rec = InflightRecord(attempt_id=attempt_id, machine_id=machine_id, test_run_id=test_run_id,
                             accepted_at=datetime.now(UTC).isoformat())
        _write_atomic(self._path(self.inflight_dir, attempt_id), json.dumps(asdict(rec)).encode(), durable=False)
        return rec

    def drop_inflight(self, attempt_id: str) -> None:
        """Forget an accepted attempt that never started (it was refused after its record was written)."""
        (self.inflight_dir / f"{attempt_id}.json").unlink(missing_ok=True)

    def update_phase(self, rec: InflightRecord, status: str, phase: str, at: datetime | None = None) -> None:
        """Not fsync'd: the phase makes a crash report precise, and the record (in memory and here) is
        what the next hello reports, so a status sent while the link was down still reaches the server."""
        rec.status, rec.phase = status, phase
        rec.phase_at = (at or datetime.now(UTC)).isoformat()
        path = self._path(self.inflight_dir, rec.attempt_id)
        if path.exists():
            _write_atomic(path, json.dumps(asdict(rec)).encode(), durable=False)

    def inflight(self) -> list[InflightRecord]:
        out = []
        for path in sorted(self.inflight_dir.glob("*.json")):
            try:
                data = json.loads(path.read_bytes())
                out.append(InflightRecord(**data))
            except (ValueError, TypeError):
                self._quarantine(path)
        return out

    # -- results -----------------------------------------------------------------------------

    def finish(self, result: AttemptResult) -> None:
        """Journal the result durably, then drop the in-flight record (a crash between leaves both:
        `recover` keeps the result and drops the record).

        The record is dropped even when the result cannot be written (a full disk: raises DiskFull):
        the attempt is over either way, and a record left behind would come back at the next start
        as a spurious "interrupted" error. The caller still holds the result and sends it; a crash
        before it is acknowledged is covered by the server, which errors a leased attempt that a
        reconnecting runner neither lists in flight nor reports."""
        try:
            _write_atomic(self._path(self.results_dir, result.attempt_id), result.model_dump_json().encode())
        finally:
            self._path(self.inflight_dir, result.attempt_id).unlink(missing_ok=True)

    def ack(self, attempt_id: str) -> bool:
        """Forget an acknowledged result. Idempotent; returns whether there was one."""
        if not is_safe_id(attempt_id):
            return False
        path = self._path(self.results_dir, attempt_id)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        # No fsync: an ack lost to a power cut only means the result is sent again, and the server
        # applies a result once per attempt id.
        return True

    def has_result(self, attempt_id: str) -> bool:
        return is_safe_id(attempt_id) and self._path(self.results_dir, attempt_id).exists()

    def pending_results(self) -> list[AttemptResult]:
        """The results not yet acknowledged, oldest first. A result acknowledged (its file removed)
        while this looks is simply not among them."""
        found = []
        for path in self.results_dir.glob("*.json"):
            try:
                found.append((path.stat().st_mtime, path))
            except FileNotFoundError:
                continue
        out = []
        for _, path in sorted(found):
            try:
                out.append(AttemptResult.model_validate_json(path.read_bytes()))
            except FileNotFoundError:
                continue
            except (ValidationError, ValueError):
                self._quarantine(path)
        return out

    # -- restart -----------------------------------------------------------------------------

    def recover(self) -> list[AttemptResult]:
        """Turn attempts a previous process left in flight into error results (journaled).

        Returns the new results; their machines are the caller's to reap.
        """
        made = []
        for rec in self.inflight():
            if self.has_result(rec.attempt_id):
                self._path(self.inflight_dir, rec.attempt_id).unlink(missing_ok=True)
                continue
            now = datetime.now(UTC)
            result = AttemptResult(
                attempt_id=rec.attempt_id,
                outcome="error",
                error=(f"interrupted: the runner stopped (crash or restart) while the attempt was "
                       f"{rec.status} (phase {rec.phase}); its machine was destroyed"),
                error_phase=rec.phase,
                interrupted=True,
                started_at=datetime.fromisoformat(rec.accepted_at) if rec.accepted_at else None,
                finished_at=now,
            )
            self.finish(result)
            made.append(result)
        return made

    def _quarantine(self, path: Path) -> None:
        self.corrupt_dir.mkdir(mode=0o700, exist_ok=True)
        dest = self.corrupt_dir / f"{path.name}.{int(datetime.now(UTC).timestamp())}"
        os.replace(path, dest)
        self.problems.append(f"journal file {path.name} could not be read; moved to {dest}")

"""`gh-runner export REPORT|--run ID --format atif|osworld --out DIR`: a run's trajectories in the field's
formats (gh_server/trajectories.py says what each holds).

REPORT is what `gh-runner local` wrote (its report.json, or the directory holding it): each attempt's
replay is read from the exported replay page beside it (`replays/<attempt_id>/index.html`, whose data is
the server's `replay_data`, already redacted) with its frames. `--run ID` asks a gh-server for
`GET /v1/test_runs/{id}/export` (`--server URL`, the API key from EAGER_API_KEY as the SDK reads it) and
unpacks the stream into DIR as it arrives.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from gh_server import trajectories as traj

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DATA_OPEN = '<script type="application/json" id="replay-data">'
HTTP_TIMEOUT = httpx.Timeout(60.0, connect=10.0)  # per read: a long run's stream keeps arriving


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"gh-runner export: {message}", file=sys.stderr)
    return code


def read_replay_page(page: Path) -> dict[str, Any]:
    """The replay's data as the page embeds it (gh_server/replays.py `render_page`)."""
    text = page.read_text(encoding="utf-8")
    start = text.find(DATA_OPEN)
    end = text.find("</script>", start)
    if start < 0 or end < 0:
        raise ValueError(f"{page} holds no replay data")
    data = json.loads(text[start + len(DATA_OPEN):end])
    if not isinstance(data, dict):
        raise ValueError(f"{page} holds no replay data")
    return data


def report_replays(report_path: Path) -> Iterator[tuple[dict[str, Any], traj.FramePng]]:
    """Every attempt of a `gh-runner local` report that has a replay, with its frames' loader."""
    report = json.loads(report_path.read_text(encoding="utf-8"))
    counted = [(a, True) for a in report.get("attempts") or []]
    retried = [(a, False) for a in report.get("retried_attempts") or []]
    for entry, is_last in counted + retried:
        page = entry.get("replay_path")
        if not page:
            continue
        page_path = Path(page) if Path(page).is_absolute() else report_path.parent / page
        data = read_replay_page(page_path)
        # A report's attempt says what it came to even when its page predates these fields.
        for k in ("score", "checkpoints"):
            data.setdefault(k, entry.get(k))
        data.setdefault("is_last", is_last)
        frames_dir = page_path.parent / "frames"

        def png(seq: int, frames_dir: Path = frames_dir) -> bytes:
            return (frames_dir / f"{seq}.png").read_bytes()

        yield data, png


def _from_report(source: Path, fmt: traj.ExportFormat, out: Path) -> int:
    report = source / "report.json" if source.is_dir() else source
    if not report.is_file():
        return _fail(f"{source}: no report.json (give the report `gh-runner local` wrote, or its directory)")
    try:
        n = traj.write_files(traj.export_files(fmt, report_replays(report)), out)
    except (OSError, ValueError) as e:
        return _fail(f"{report}: {e}", EXIT_FAILED)
    print(f"wrote {n} files to {out}")
    return EXIT_OK


def _from_server(run_id: str, fmt: traj.ExportFormat, out: Path, server: str, key: str) -> int:
    url = f"{server.rstrip('/')}/v1/test_runs/{run_id}/export"
    out.mkdir(parents=True, exist_ok=True)
    try:
        with httpx.Client(timeout=HTTP_TIMEOUT) as http, http.stream(
                "GET", url, params={"format": fmt.value}, headers={"Authorization": f"Bearer {key}"}) as r:
            if r.status_code != 200:
                r.read()
                try:
                    message = r.json()["error"]["message"]
                except Exception:
                    message = r.text[:300]
                return _fail(f"{url}: {r.status_code} {message}", EXIT_FAILED)
            stream = _Reader(r.iter_bytes())
            with tarfile.open(fileobj=stream, mode="r|gz") as tar:  # type: ignore[call-overload]
                n = 0
                for member in tar:
                    if not member.isfile():
                        continue
                    f = tar.extractfile(member)
                    assert f is not None
                    # The server's root directory (`{run}-{format}/`) is dropped: DIR is the root.
                    name = member.name.split("/", 1)[1] if "/" in member.name else member.name
                    n += traj.write_files([(name, f.read())], out)
    except httpx.HTTPError as e:
        return _fail(f"{url}: {type(e).__name__}: {e}", EXIT_FAILED)
    except (tarfile.TarError, ValueError, OSError) as e:
        return _fail(f"{url}: the export could not be unpacked: {e}", EXIT_FAILED)
    print(f"wrote {n} files to {out}")
    return EXIT_OK


class _Reader:
    """A byte iterator as the read-only file tarfile's stream mode reads."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buf) < size:
            try:
                self._buf += next(self._chunks)
            except StopIteration:
                break
        if size < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:size], self._buf[size:]
        return out


def main(args: argparse.Namespace) -> int:
    try:
        fmt = traj.ExportFormat(args.format)
    except ValueError:
        return _fail(f"--format must be atif or osworld, not {args.format!r}")
    if (args.source is None) == (args.run is None):
        return _fail("give a report (REPORT) or --run ID, one of them")
    if args.run is not None:
        server = args.server or os.environ.get("GH_SERVER_URL")
        key = os.environ.get("EAGER_API_KEY")
        if not server or not key:
            return _fail("--run needs --server URL (or GH_SERVER_URL) and an API key in EAGER_API_KEY")
        return _from_server(args.run, fmt, args.out, server, key)
    return _from_report(args.source, fmt, args.out)

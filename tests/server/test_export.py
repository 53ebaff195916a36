"""GET /v1/test_runs/{id}/export through the real API (SQLite and PostgreSQL): the tar.gz holds each
attempt's ATIF trajectory with its screenshots from the replay store, or OSWorld's layout; what the replay
redacts stays redacted (a secret fact the agent echoed); an assisted try is said to be one; a member's key
opens it, no key does not, an unknown format is refused."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from export import recorded
from export.atif_check import atif_errors

from gh_local.report import build_report, write_report
from gh_server import replays
from gh_server.models import Attempt, ReplayFrame

from .conftest import Server
from .test_test_runs import _attempts, _case, _finish

SECRET = "hunter2-Secret"
T0 = datetime(2026, 12, 5, 10, 0, 0, tzinfo=UTC)


def _run(server: Server, key: str = "EX-1") -> tuple[str, str]:
    _case(server, key, customer={"facts": {"password": {"secret": SECRET}}}, category="os")
    rid = server.admin.test_runs.create(test_case_ids=[key], agents=["noop"], repeat=1)["test_run_id"]
    (a,) = _attempts(server, rid)
    _finish(server, a.id, "passed")
    frames = recorded.replay()["frames"]
    # The agent's words echo the secret: the replay shows •••, and so must the export.
    frames[2]["event"]["note"]["text"] = f"Typing {SECRET} now."
    with server.state.db.begin() as s:
        row = s.get(Attempt, a.id)
        assert row is not None
        row.started_at, row.finished_at = T0, T0 + timedelta(seconds=20)
        row.answer, row.score = f"done; the password was {SECRET}", 1.0
        row.assisted, row.takeovers = True, recorded.replay()["takeovers"]
        row.metrics = {**(row.metrics or {}), "model": recorded.replay()["metrics"]["model"]}
        for f in frames:
            s.add(ReplayFrame(attempt_id=a.id, seq=f["seq"], at=T0 + timedelta(seconds=f["t"]), label=f["label"],
                              event=f["event"], png=recorded.png(f["seq"])))
    return rid, a.id


def _get(server: Server, rid: str, fmt: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{server.base_url}/v1/test_runs/{rid}/export", params={"format": fmt}, headers=headers,
                     timeout=30)


def _untar(body: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def test_export_streams_atif_and_osworld_redacted(server: Server) -> None:
    rid, aid = _run(server)
    r = _get(server, rid, "atif", server.member_key)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/gzip"
    files = _untar(r.content)
    root = f"{rid}-atif/{aid}/"
    t = json.loads(files[root + "trajectory.json"])
    assert atif_errors(t, {k.removeprefix(root): v for k, v in files.items() if k.startswith(root)}) == []
    assert len([k for k in files if k.endswith(".png")]) == 6
    assert files[root + "screenshots/00002.png"] == recorded.png(2)
    assert t["extra"]["gh"]["assisted"] is True and "assisted" in t["notes"]
    assert t["final_metrics"]["total_prompt_tokens"] == 1200
    assert t["steps"][3]["message"] == "Typing ••• now."
    assert SECRET.encode() not in r.content and SECRET.encode() not in b"".join(files.values())

    r = _get(server, rid, "osworld", server.admin_key)
    assert r.status_code == 200, r.text
    files = _untar(r.content)
    task = f"{rid}-osworld/gh_machine_api/screenshot/noop/os/EX-1/"
    assert {k.removeprefix(task) for k in files if k.endswith((".jsonl", ".json", ".txt"))} == {
        "traj.jsonl", "gh_attempt.json"}  # assisted: no result.txt, so show_result.py does not count it
    assert json.loads(files[task + "gh_attempt.json"])["assisted"] is True
    assert len(files[task + "traj.jsonl"].decode().splitlines()) == 3
    assert SECRET.encode() not in b"".join(files.values())


def test_export_refuses_no_key_an_unknown_format_and_an_unknown_run(server: Server) -> None:
    rid, _ = _run(server, "EX-2")
    assert _get(server, rid, "atif", None).status_code == 401
    bad = _get(server, rid, "parquet", server.admin_key)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request"
    missing = _get(server, "tr_nope", "atif", server.admin_key)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"


def _gh_runner(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("gh-runner")), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_cli_exports_a_local_report_and_a_server_run_alike(server: Server, tmp_path: Path) -> None:
    """`gh-runner export` over a report as `gh-runner local` writes it (its replay pages, exported by the
    same gh_server/replays.py `export_replay`, and report.json by gh_local/report.py), and with --run ID
    from this server: the same files either way."""
    rid, aid = _run(server, "EX-3")
    report_dir = tmp_path / "report"
    with server.state.db() as s:
        page = replays.export_replay(s, aid, report_dir / "replays", report_dir / "report.html")
    assert page is not None
    entry = {"attempt_id": aid, "key": "EX-3", "agent_id": "noop", "try": 1, "outcome": "passed", "score": 1.0,
             "assisted": True, "replay_path": str(page)}
    write_report(report_dir / "report.json", build_report({"test_run_id": rid, "agents": ["noop"]}, None, [entry]))

    from_report, from_server = tmp_path / "a", tmp_path / "b"
    done = _gh_runner("export", str(report_dir), "--format", "osworld", "--out", str(from_report))
    assert done.returncode == 0, done.stderr
    done = _gh_runner("export", "--run", rid, "--server", server.base_url, "--format", "osworld",
                      "--out", str(from_server), env={"EAGER_API_KEY": server.member_key})
    assert done.returncode == 0, done.stderr

    def tree(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    a, b = tree(from_report), tree(from_server)
    assert sorted(a) == sorted(b) and len([k for k in a if k.endswith(".png")]) == 3
    assert a == b
    assert SECRET.encode() not in b"".join(a.values())

    done = _gh_runner("export", str(report_dir), "--format", "atif", "--out", str(tmp_path / "c"))
    assert done.returncode == 0, done.stderr
    t = json.loads((tmp_path / "c" / aid / "trajectory.json").read_text())
    shots = {str(p.relative_to(tmp_path / "c" / aid)): p.read_bytes() for p in (tmp_path / "c" / aid).rglob("*.png")}
    assert atif_errors(t, shots) == [] and len(shots) == 6

    bad = _gh_runner("export", str(tmp_path / "nothing"), "--format", "atif", "--out", str(tmp_path / "d"))
    assert bad.returncode == 2 and "no report.json" in bad.stderr
    nokey = _gh_runner("export", "--run", rid, "--server", server.base_url, "--format", "atif",
                       "--out", str(tmp_path / "e"), env={"EAGER_API_KEY": "gh_live_wrong"})
    assert nokey.returncode == 1 and "401" in nokey.stderr

"""Attempt replays: the page behind an attempt's `replay_url`, its frames, and offline export.

Note for the API engineer (how `replay_url` is made and checked)
-----------------------------------------------------------------
A browser cannot send a Bearer header, so `replay_url` carries a signed, short-lived token scoped
to one attempt: `{base}/v1/attempts/{id}/replay?token={exp}.{sig}` where `sig` is
HMAC-SHA256(key, "replay:{attempt_id}:{exp}") in urlsafe base64. Build it with
`replay_url(settings, base_url, attempt_id)` each time an attempt is serialized (the TTL starts
then). The routes here accept that token, an `Authorization: Bearer` API key (checked
against `api_keys.key_hash`, sha256 of the whole key, not revoked), or the console's session cookie
(gh_server/console_sessions.py; these routes only read, so no CSRF token: the console's watch page
loads frames by their plain URL). The signing key is
`settings.replay_secret` when the settings have one; otherwise a random key kept in
`{data_dir}/replay-signing-key` (mode 0600, shared by every gh-server process on that data dir);
otherwise one per process.

What the page shows: the frames on a timeline with the input event before each, the phases (from
`metrics.phase_seconds`), the check outputs before and after, the answer, the error and the
outcome; for an assisted attempt, each takeover as a span of the timeline (who, from when to when,
how it ended) and the person's steps in it (`takeovers`: counts, named keys and clicks; how many
characters were typed, never which: the record does not hold them). Secrets never reach it: the
runner already redacts typed secrets (`gh_runner.replay`), and everything rendered here is passed
once more through the frozen case's secret facts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server import console_sessions, models

STATIC_DIR = Path(__file__).parent / "static"
ASSETS = ("replay.js", "replay.css")
DEFAULT_TTL = 24 * 3600.0  # long enough to read a night's run in the morning, short enough to expire
REDACTED = "•••"
PHASE_ORDER = ("machine", "ready", "setup", "check_before", "first_screen", "task", "check_after",
               "last_screen", "teardown")

router = APIRouter()


# ---------------------------------------------------------------------------------------------
# Signed tokens
# ---------------------------------------------------------------------------------------------

_process_key = secrets.token_bytes(32)


def signing_key(settings: Any) -> bytes:
    explicit = getattr(settings, "replay_secret", None)
    if explicit:
        value = explicit.get_secret_value() if hasattr(explicit, "get_secret_value") else str(explicit)
        return hashlib.sha256(value.encode()).digest()
    data_dir = getattr(settings, "data_dir", None)
    if data_dir:
        path = Path(data_dir) / "replay-signing-key"
        try:
            return _key_file(path)
        except OSError:
            pass
    return _process_key


def _key_file(path: Path) -> bytes:
    try:
        data = path.read_bytes()
        if len(data) >= 32:
            return data[:32]
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    try:
        os.link(tmp, path)  # first writer wins; everyone then reads the same key
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_bytes()[:32]


def _sig(key: bytes, attempt_id: str, exp: int) -> str:
    mac = hmac.new(key, f"replay:{attempt_id}:{exp}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def sign_token(key: bytes, attempt_id: str, ttl: float = DEFAULT_TTL, now: float | None = None) -> str:
    exp = int((time.time() if now is None else now) + ttl)
    return f"{exp}.{_sig(key, attempt_id, exp)}"


def verify_token(key: bytes, attempt_id: str, token: str, now: float | None = None) -> bool:
    exp_s, _, sig = token.partition(".")
    if not exp_s.isdigit() or not sig:
        return False
    exp = int(exp_s)
    if exp < (time.time() if now is None else now):
        return False
    return hmac.compare_digest(sig, _sig(key, attempt_id, exp))


def replay_url(settings: Any, base_url: str, attempt_id: str, ttl: float = DEFAULT_TTL) -> str:
    """The attempt's `replay_url`: the page, with a token that opens it in a browser."""
    token = sign_token(signing_key(settings), attempt_id, ttl)
    return f"{base_url.rstrip('/')}/v1/attempts/{attempt_id}/replay?token={token}"


# ---------------------------------------------------------------------------------------------
# What the page shows
# ---------------------------------------------------------------------------------------------


def secret_values(case: dict[str, Any] | None) -> list[str]:
    """The frozen case's secret facts (`{"secret": "..."}`), longest first."""
    found: set[str] = set()
    customer = (case or {}).get("customer") or {}
    facts = customer.get("facts") if isinstance(customer, dict) else None
    if isinstance(facts, dict):
        for value in facts.values():
            if isinstance(value, dict) and isinstance(value.get("secret"), str) and value["secret"]:
                found.add(value["secret"])
    return sorted(found, key=len, reverse=True)


def redact(value: Any, secrets_: Iterable[str]) -> Any:
    """`value` (any JSON) with every occurrence of a secret replaced."""
    secrets_ = list(secrets_)
    if not secrets_:
        return value
    if isinstance(value, str):
        for s in secrets_:
            value = value.replace(s, REDACTED)
        return value
    if isinstance(value, dict):
        return {k: redact(v, secrets_) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secrets_) for v in value]
    return value


def _iso(t: datetime | None) -> str | None:
    return t.isoformat().replace("+00:00", "Z") if t is not None else None


def _phases(metrics: dict[str, Any] | None) -> list[dict[str, Any]]:
    seconds = (metrics or {}).get("phase_seconds") or {}
    if not isinstance(seconds, dict):
        return []
    names = [p for p in PHASE_ORDER if p in seconds] + sorted(p for p in seconds if p not in PHASE_ORDER)
    out, start = [], 0.0
    for name in names:
        try:
            dur = max(0.0, float(seconds[name]))
        except (TypeError, ValueError):
            continue
        out.append({"name": name, "start": round(start, 3), "seconds": round(dur, 3)})
        start += dur
    return out


def _since(t0: datetime | None, iso: Any) -> float | None:
    """Seconds from the attempt's start to an ISO-8601 time (as `takeovers` records them)."""
    if t0 is None or not isinstance(iso, str) or not iso:
        return None
    try:
        at = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None or t0.tzinfo is None:  # a naive time is UTC (as SQLite hands them back)
        at = at.astimezone(UTC).replace(tzinfo=None) if at.tzinfo else at
        t0 = t0.astimezone(UTC).replace(tzinfo=None) if t0.tzinfo else t0
    return round((at - t0).total_seconds(), 3)


# What a person's step keeps, by kind: never a typed character, only how many.
_HUMAN_STEP_FIELDS = {"typed": ("count",), "paste": ("count",), "key": ("keys",), "click": ("x", "y", "button")}


def _takeovers(t0: datetime | None, takeovers: Any) -> list[dict[str, Any]]:
    """Each hold as a span of the timeline, its person's steps placed on it."""
    out: list[dict[str, Any]] = []
    for hold in takeovers if isinstance(takeovers, list) else []:
        if not isinstance(hold, dict):
            continue
        steps = []
        for ev in hold.get("events") or []:
            kind = ev.get("kind") if isinstance(ev, dict) else None
            if kind not in _HUMAN_STEP_FIELDS:
                continue
            steps.append({"at": ev.get("at"), "t": _since(t0, ev.get("at")), "kind": kind,
                          **{f: ev.get(f) for f in _HUMAN_STEP_FIELDS[kind]}})
        counts = hold.get("counts")
        counts = counts if isinstance(counts, dict) else {}
        out.append({
            "by": hold.get("by"), "started_at": hold.get("started_at"), "ended_at": hold.get("ended_at"),
            "start": _since(t0, hold.get("started_at")), "end": _since(t0, hold.get("ended_at")),
            "ended_by": hold.get("ended_by"), "held_seconds": hold.get("held_seconds"),
            "counts": {k: int(counts.get(k) or 0) for k in ("keys", "clicks", "typed")},
            "events": steps, "events_dropped": int(hold.get("events_dropped") or 0),
        })
    return out


def replay_data(session: Session, attempt_id: str, frame_url: str,
                run_url: str | None = None) -> dict[str, Any] | None:
    """Everything the page renders, redacted; None for an unknown attempt.

    `frame_url` is a format string with `{seq}` (a route with its token, or a file name offline);
    `run_url` the link back to the run's results page.
    """
    att = session.get(models.Attempt, attempt_id)
    if att is None:
        return None
    rc = session.get(models.RunCase, att.run_case_id)
    case = rc.case if rc is not None else {}
    hidden = secret_values(case)
    rows = session.execute(
        select(models.ReplayFrame.seq, models.ReplayFrame.at, models.ReplayFrame.label, models.ReplayFrame.event)
        .where(models.ReplayFrame.attempt_id == attempt_id)
        .order_by(models.ReplayFrame.seq)
    ).all()
    t0 = att.started_at or (rows[0].at if rows else None)
    frames = []
    for seq, at, label, event in rows:
        frames.append({
            "seq": seq, "at": _iso(at), "t": round((at - t0).total_seconds(), 3) if t0 is not None else 0.0,
            "label": label, "event": event, "src": frame_url.format(seq=seq),
        })
    data = {
        "attempt_id": att.id,
        "test_run_id": att.test_run_id,
        "run_url": run_url,
        "key": case.get("key"),
        "name": case.get("name"),
        "prompt": case.get("prompt"),
        "agent_id": att.agent_id,
        "try": att.try_number,
        "retry_of": att.retry_of,
        "is_last": bool(att.is_last),  # the attempt that counts for its try (a retried one does not)
        "category": case.get("category"),
        "tags": case.get("tags"),
        "status": att.status,
        "outcome": att.outcome,
        "score": att.score,
        "checkpoints": att.checkpoints,
        "error": att.error,
        "check": att.check,
        "answer": att.answer,
        "metrics": att.metrics,
        "phases": _phases(att.metrics),
        "machine": (att.metrics or {}).get("machine_origin"),
        # A person took the machine over: its outcome is the check's, never the agent's pass.
        "assisted": bool(att.assisted),
        "takeovers": _takeovers(t0, att.takeovers),
        "started_at": _iso(att.started_at),
        "finished_at": _iso(att.finished_at),
        "frames": frames,
    }
    return dict(redact(data, hidden))


def _embed_json(data: Any) -> str:
    # Inside <script>: "<" escaped so no string can close the tag or open a comment.
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(data: dict[str, Any], asset_prefix: str) -> str:
    template = (STATIC_DIR / "replay.html").read_text(encoding="utf-8")
    title = f"Replay {data.get('key') or ''} {data.get('agent_id')} try {data.get('try')}".strip()
    return (template
            .replace("{{title}}", html.escape(title))
            .replace("{{assets}}", html.escape(asset_prefix, quote=True))
            .replace("{{data}}", _embed_json(data)))


def export_replay(session: Session, attempt_id: str, out_dir: Path, run_page: Path | None = None) -> Path | None:
    """Write a self-contained replay (page, assets, frames) under `out_dir/<attempt_id>/`; the
    page opens from disk with no server, and links back to `run_page` (the run's report.html) when
    given. Returns the page's path, None for an unknown attempt."""
    target = out_dir / attempt_id
    run_url = os.path.relpath(run_page, target) if run_page is not None else None
    data = replay_data(session, attempt_id, "frames/{seq}.png", run_url)
    if data is None:
        return None
    (target / "frames").mkdir(parents=True, exist_ok=True)
    pngs = session.execute(
        select(models.ReplayFrame.seq, models.ReplayFrame.png).where(models.ReplayFrame.attempt_id == attempt_id)
    ).all()
    for seq, png in pngs:
        (target / "frames" / f"{seq}.png").write_bytes(png)
    assets = out_dir / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    for name in ASSETS:
        shutil.copyfile(STATIC_DIR / name, assets / name)
    page = target / "index.html"
    page.write_text(render_page(data, "../assets/"), encoding="utf-8")
    return page


# ---------------------------------------------------------------------------------------------
# Routes
# ---------------------------------------------------------------------------------------------


def _authorize(request: Request, attempt_id: str) -> str | None:
    """The token to pass on to frame URLs (None when the caller used an API key); 401 otherwise."""
    state = request.app.state.gh
    token = request.query_params.get("token")
    if token and verify_token(signing_key(state.settings), attempt_id, token):
        return token
    auth = request.headers.get("authorization", "")
    cookie = console_sessions.cookie_secret(request)
    if cookie and not auth:
        with state.db() as session:
            if console_sessions.lookup(session, cookie) is not None:
                return None
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        digest = hashlib.sha256(auth[7:].strip().encode()).hexdigest()
        with state.db() as session:
            key = session.execute(
                select(models.ApiKey).where(models.ApiKey.key_hash == digest, models.ApiKey.revoked_at.is_(None))
            ).scalar_one_or_none()
        if key is not None:
            return None
    raise HTTPException(status_code=401, detail="this replay link is invalid or has expired; "
                        "get a fresh replay_url from GET /v1/attempts/{attempt_id}")


def _error(status: int, etype: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": etype, "message": message}}, status_code=status)


@router.get("/v1/attempts/{attempt_id}/replay", include_in_schema=False)
async def replay_page(attempt_id: str, request: Request) -> Response:
    try:
        token = _authorize(request, attempt_id)
    except HTTPException as e:
        return _error(401, "authentication", str(e.detail))
    suffix = f"?token={token}" if token else ""
    state = request.app.state.gh

    def load() -> dict[str, Any] | None:
        with state.db() as session:
            att = session.get(models.Attempt, attempt_id)
            run_url = None
            if att is not None and att.test_run_id:
                # The run's page opens with a token of its own (as report_url gives), or with the same key.
                run_token = sign_token(signing_key(state.settings), "report:" + att.test_run_id)
                run_url = f"/v1/test_runs/{att.test_run_id}/report?token={run_token}"
            return replay_data(session, attempt_id, f"/v1/attempts/{attempt_id}/replay/frames/{{seq}}{suffix}",
                               run_url)

    from starlette.concurrency import run_in_threadpool

    data = await run_in_threadpool(load)
    if data is None:
        return _error(404, "not_found", f"no attempt {attempt_id!r}")
    return HTMLResponse(render_page(data, "/v1/replay-assets/"),
                        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})


@router.get("/v1/attempts/{attempt_id}/replay/frames/{seq}", include_in_schema=False)
async def replay_frame(attempt_id: str, seq: int, request: Request) -> Response:
    try:
        _authorize(request, attempt_id)
    except HTTPException as e:
        return _error(401, "authentication", str(e.detail))
    state = request.app.state.gh

    def load() -> bytes | None:
        with state.db() as session:
            row = session.get(models.ReplayFrame, (attempt_id, seq))
            return row.png if row is not None else None

    from starlette.concurrency import run_in_threadpool

    png = await run_in_threadpool(load)
    if png is None:
        return _error(404, "not_found", f"no frame {seq} in attempt {attempt_id!r}")
    return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})


@router.get("/v1/replay-assets/{name}", include_in_schema=False)
async def replay_asset(name: str) -> Response:
    # Public: the page's code and style hold no data.
    if name not in ASSETS:
        return _error(404, "not_found", f"no asset {name!r}")
    media = "text/javascript" if name.endswith(".js") else "text/css"
    return Response((STATIC_DIR / name).read_bytes(), media_type=media, headers={"Cache-Control": "max-age=300"})


def install(app: Any, state: Any) -> None:
    """Plug the replay routes into a gh-server app (called by `create_app`)."""
    app.include_router(router)

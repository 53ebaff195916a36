"""/v1/start_states: the runners' images and the org's saved machines.

The database half lives here: rows, versions, status moves, and `runner_jobs` rows (build, open, save,
close, delete) for the runner that holds the disk. A job is sent at once when that runner is connected to
this process (`state.gateway`); otherwise the gateway delivers queued jobs when the runner (re)connects.
Screen and input go through `state.gateway.machine_request` to the open machine's runner.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

import pydantic
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gh_server import serialize
from gh_server.api.common import DB, Admin, Member, Page, PageParams, like, page_body, paginate, state_of
from gh_server.api.schemas import InputBody, SavePointStartState, StartStateCreate, StartStateUpdate
from gh_server.auth import Principal, require_member
from gh_server.errors import ApiError, conflict, invalid, not_found
from gh_server.live import inputs as live_inputs
from gh_server.models import Attempt, Runner, RunnerJob, StartState, StartStateVersion, TestCase, new_id, utcnow
from gh_server.start_state_jobs import dispatch_jobs as _dispatch
from gh_server.start_state_jobs import holders
from gh_server.start_state_jobs import new_job as _job
from gh_server.start_states import from_save_point, runner_for_image
from gh_wire import protocol

router = APIRouter(tags=["Start states"])

MACHINE_TIMEOUT = 60.0


def get_state(session: Session, ident: str) -> StartState:
    row = session.get(StartState, ident)
    if row is None:
        if ident in images(session):
            raise conflict(
                f"{ident!r} is an image the runners advertise, not a start state: it can be read, not changed. "
                f'Make a start state from it (POST /v1/start_states {{"from": "{ident}"}}) and use that.',
                code="image",
            )
        raise not_found("start state", ident)
    return row


# A decision the product documentation leaves open ("anyone in the org can read start states"): the
# screen of an open machine is not the start state's record but the live machine an admin is setting up
# by hand, with whatever they type or open on it (a password at the sign-in screen, a licence key).
# Watching it is part of changing the start state, so it takes the role that changes one.
SCREEN_NEEDS_ADMIN = (
    "Reading an open machine's screen needs an admin API key: it is the live machine an admin is setting up, "
    "and shows whatever they type or open on it (passwords at a sign-in screen too). Member keys can list and "
    "retrieve start states."
)


async def require_screen_reader(principal: Principal = Depends(require_member)) -> Principal:
    if not principal.is_admin:
        raise ApiError(403, SCREEN_NEEDS_ADMIN)
    return principal


def images(session: Session) -> dict[str, dict[str, Any]]:
    """Every image a (not revoked) runner advertises: name -> {os, labels, version}."""
    out: dict[str, dict[str, Any]] = {}
    for imgs, labels in session.execute(select(Runner.images, Runner.labels).where(Runner.revoked_at.is_(None))):
        for img in imgs or []:
            if not isinstance(img, dict) or not img.get("name"):
                continue
            entry = out.setdefault(img["name"], {"os": img.get("os", ""), "labels": [], "version": img.get("version")})
            for lab in labels or []:
                if lab not in entry["labels"]:
                    entry["labels"].append(lab)
    return out


def _source_of(session: Session, ss: StartState) -> dict[str, Any]:
    return {"kind": "state", "image": ss.image, "start_state_id": ss.id, "version": ss.version}


@router.get("/v1/start_states", summary="Runners' images first (first page), then the org's start states")
def list_start_states(
    kind: str | None = Query(default=None),
    q: str | None = Query(default=None, max_length=200),
    _p: Principal = Member,
    page: PageParams = Page,
    s: Session = DB,
) -> dict[str, Any]:
    if kind not in (None, "image", "state"):
        raise invalid("kind", "must be image or state")
    data: list[dict[str, Any]] = []
    imgs = images(s)
    img_names = sorted(n for n in imgs if not q or q.lower() in n.lower())
    if kind != "state" and page.cursor is None:
        data.extend(serialize.image(n, imgs[n]["os"], imgs[n]["labels"], imgs[n]["version"]) for n in img_names)
    if kind == "image":
        body = page_body(data, False, None, len(img_names) if "total_count" in page.include else None)
        return body
    stmt = select(StartState)
    if q:
        pat = like(q)
        stmt = stmt.where(
            or_(
                StartState.name.ilike(pat, escape="\\"),
                StartState.description.ilike(pat, escape="\\"),
                StartState.id == q,
            )
        )
    rows, has_more, nxt, total = paginate(s, stmt, StartState.created_at, StartState.id, page)
    data.extend(serialize.start_state(r, os_name=imgs.get(r.image, {}).get("os", "")) for r in rows)
    if total is not None and kind is None:
        total += len(img_names)
    return page_body(data, has_more, nxt, total)


@router.post("/v1/start_states", summary="Make a start state from an image or another start state")
async def create_start_state(body: StartStateCreate, request: Request, _p: Principal = Admin) -> dict[str, Any]:
    st = state_of(request)

    def work() -> tuple[dict[str, Any], list[str]]:
        with st.db.begin() as s:
            src = body.from_
            parent: StartState | None = None
            if src.startswith("ss_"):
                parent = s.get(StartState, src)
                if parent is None:
                    raise invalid("from", f"no start state {src!r}")
                if parent.version < 1:
                    raise invalid("from", f"start state {src} has no saved version yet")
                image = parent.image
                source = _source_of(s, parent)
                holder = s.scalar(
                    select(StartStateVersion.runner_id).where(
                        StartStateVersion.start_state_id == parent.id, StartStateVersion.version == parent.version
                    )
                )
                runner_id = holder or parent.runner_id
                runner = s.get(Runner, runner_id) if runner_id else None
            else:
                image = src
                source = {"kind": "image", "image": image}
                runner = runner_for_image(s, st, image)
                if runner is None:
                    raise invalid("from", f"no runner advertises the image {image!r}")
                runner_id = runner.id
            method = "script" if body.script else "instruction" if body.instruction else "hand"
            now = utcnow()
            ss = StartState(
                id=new_id("ss_"),
                name=body.name,
                description=body.description or "",
                from_=src,
                image=image,
                method=method,
                script=body.script,
                instruction=body.instruction,
                agent_id=(body.agent_id or "default") if method == "instruction" else body.agent_id,
                status="open" if method == "hand" else "building",
                version=0,
                runner_id=runner_id,
                runner_labels=list(runner.labels or []) if runner is not None else [],
                opened_at=now if method == "hand" else None,
                metadata_=dict(body.metadata or {}),
                created_at=now,
                updated_at=now,
            )
            s.add(ss)
            s.flush()
            op = "build" if method == "script" else "open"
            job = _job(s, ss.id, op, runner_id, source=source, script=body.script, version=1 if op == "build" else None)
            return serialize.start_state(ss), [job.id]

    out, jobs = await run_in_threadpool(work)
    await _dispatch(st, jobs)
    return out


@router.post("/v1/attempts/{attempt_id}/save_points/{save_point_id}/start_state",
             summary="Make a start state from one of an attempt's save points (tries then start at its step)")
async def start_state_from_save_point(attempt_id: str, save_point_id: str, request: Request,
                                      body: SavePointStartState | None = None, _p: Principal = Admin) -> dict[str, Any]:
    st = state_of(request)

    def work() -> dict[str, Any]:
        with st.db.begin() as s:
            attempt = s.get(Attempt, attempt_id)
            if attempt is None:
                raise not_found("attempt", attempt_id)
            ss = from_save_point(s, attempt, save_point_id, body.name if body is not None else None)
            return serialize.start_state(ss, os_name=images(s).get(ss.image, {}).get("os", ""))

    return await run_in_threadpool(work)


@router.get("/v1/start_states/{start_state_id}", summary="Retrieve a start state")
def retrieve_start_state(start_state_id: str, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    row = s.get(StartState, start_state_id)
    if row is None:
        # list shows images with their name as start_state_id, so retrieve (and the SDK's wait) takes it too.
        imgs = images(s)
        img = imgs.get(start_state_id)
        if img is None:
            raise not_found("start state", start_state_id)
        return serialize.image(start_state_id, img["os"], img["labels"], img["version"])
    body = serialize.start_state(row, os_name=images(s).get(row.image, {}).get("os", ""))
    body["inputs"] = live_inputs.listed(s, row.id)  # what people sent it through live views (never the keys)
    return body


@router.get("/v1/start_states/{start_state_id}/versions", summary="A start state's saved versions, newest first")
def list_start_state_versions(start_state_id: str, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    row = get_state(s, start_state_id)
    rows = s.scalars(select(StartStateVersion).where(StartStateVersion.start_state_id == row.id,
                                                     StartStateVersion.deleted_at.is_(None))
                     .order_by(StartStateVersion.version.desc())).all()
    data = [{"object": "start_state_version", "start_state_id": v.start_state_id, "version": v.version,
             "current": v.version == row.version, "runner_id": v.runner_id, "size_bytes": v.size_bytes,
             "registry_ref": v.registry_ref, "created_at": serialize.ts(v.created_at)} for v in rows]
    return page_body(data, False, None, None)


@router.patch("/v1/start_states/{start_state_id}", summary="Change name, description or metadata")
def update_start_state(
    start_state_id: str, body: StartStateUpdate, s: Session = DB, _p: Principal = Admin
) -> dict[str, Any]:
    ss = get_state(s, start_state_id)
    sent = body.model_fields_set
    if "name" in sent:
        if body.name is None:
            raise invalid("name", "cannot be null")
        ss.name = body.name
    if "description" in sent:
        ss.description = body.description or ""
    if "metadata" in sent:
        ss.metadata_ = dict(body.metadata or {})
    ss.updated_at = utcnow()
    s.commit()
    return serialize.start_state(ss)


@router.delete("/v1/start_states/{start_state_id}", summary="Delete a start state and its saved disks")
async def delete_start_state(start_state_id: str, request: Request, _p: Principal = Admin) -> dict[str, Any]:
    st = state_of(request)

    def work() -> list[str]:
        with st.db.begin() as s:
            ss = get_state(s, start_state_id)
            users = list(s.scalars(select(TestCase.id).where(TestCase.start_state == ss.id).order_by(TestCase.id)))
            if users:
                raise conflict(
                    f"Start state {ss.id} is used by {len(users)} test case(s); change their start_state first.",
                    code="in_use",
                    test_case_ids=users,
                )
            from gh_server.start_state_jobs import cases_running_on

            running = cases_running_on(s, ss.id)
            if running:
                raise conflict(
                    f"Start state {ss.id} is used by {len(running)} case(s) of runs still in progress; "
                    "wait for them or cancel them first.",
                    code="in_use",
                    test_case_ids=running,
                )
            savers = s.scalars(select(StartStateVersion.runner_id).where(StartStateVersion.start_state_id == ss.id))
            # Those that saved a version, and those that pulled one from the registry.
            runner_ids = holders(s, ss.id, None, known=[*savers, ss.runner_id])
            jobs = [_job(s, ss.id, "delete", rid).id for rid in runner_ids]
            s.delete(ss)
            return jobs

    jobs = await run_in_threadpool(work)
    await _dispatch(st, jobs)
    return {"object": "start_state", "start_state_id": start_state_id, "deleted": True}


async def _transition(request: Request, start_state_id: str, op: str) -> dict[str, Any]:
    st = state_of(request)

    def work() -> tuple[dict[str, Any], list[str]]:
        with st.db.begin() as s:
            ss = get_state(s, start_state_id)
            if op == "open":
                if ss.status != "ready" or ss.version < 1:
                    raise conflict(
                        f"Start state {ss.id} is {ss.status}: only a ready one can be opened.", status=ss.status
                    )
                ss.status, ss.opened_at, ss.last_input_at = "open", utcnow(), None
                job = _job(s, ss.id, "open", ss.runner_id, source=_source_of(s, ss), version=ss.version)
            elif op == "save":
                if ss.status != "open":
                    raise conflict(
                        f"Start state {ss.id} is {ss.status}: only an open one can be saved.", status=ss.status
                    )
                ss.status = "saving"
                job = _job(s, ss.id, "save", ss.runner_id, version=ss.version + 1)
            else:
                if ss.status != "open":
                    raise conflict(
                        f"Start state {ss.id} is {ss.status}: only an open one can be closed.", status=ss.status
                    )
                job = _job(s, ss.id, "close", ss.runner_id)
                if ss.version < 1:
                    # Made by hand and never saved: closing discards it (docs/start-states.md).
                    out = serialize.start_state(ss)
                    s.delete(ss)
                    out["status"] = "ready"
                    out["deleted"] = True
                    return out, [job.id]
                ss.status = "ready"
            ss.updated_at = utcnow()
            return serialize.start_state(ss), [job.id]

    out, jobs = await run_in_threadpool(work)
    await _dispatch(st, jobs)
    return out


@router.post("/v1/start_states/{start_state_id}/open", summary="Boot a machine from the current version")
async def open_start_state(start_state_id: str, request: Request, _p: Principal = Admin) -> dict[str, Any]:
    return await _transition(request, start_state_id, "open")


@router.post("/v1/start_states/{start_state_id}/save", summary="Keep the open machine as the next version")
async def save_start_state(start_state_id: str, request: Request, _p: Principal = Admin) -> dict[str, Any]:
    return await _transition(request, start_state_id, "save")


@router.post("/v1/start_states/{start_state_id}/close", summary="Discard the open machine's changes")
async def close_start_state(start_state_id: str, request: Request, _p: Principal = Admin) -> dict[str, Any]:
    return await _transition(request, start_state_id, "close")


async def _machine(request: Request, start_state_id: str, req: dict[str, Any]) -> protocol.MachineResponse:
    st = state_of(request)

    def load() -> tuple[str | None, str | None]:
        with st.db() as s:
            ss = get_state(s, start_state_id)
            if ss.status != "open":
                raise conflict(f"Start state {ss.id} is {ss.status}: open it first.", status=ss.status)
            job_id = s.scalar(
                select(RunnerJob.id)
                .where(RunnerJob.start_state_id == ss.id, RunnerJob.op.in_(("open", "build")))
                .order_by(RunnerJob.created_at.desc())
                .limit(1)
            )
            return ss.runner_id, job_id

    runner_id, job_id = await run_in_threadpool(load)
    if runner_id is None or st.gateway is None or not st.gateway.connected(runner_id):
        raise conflict(f"The runner that holds start state {start_state_id} is not connected.", code="not_connected")
    try:
        msg = protocol.MachineRequest(
            request_id=uuid.uuid4().hex, job_id=job_id, start_state_id=start_state_id, timeout=MACHINE_TIMEOUT, **req
        )
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith(("function", "tagged")))
        raise invalid(loc or "events", str(first.get("msg", "invalid"))) from None
    resp = await st.gateway.machine_request(runner_id, msg, MACHINE_TIMEOUT + 5)
    if not resp.ok:
        raise conflict(f"The machine refused: {resp.error or 'no reason given'}", code="machine_error")
    return resp


@router.get(
    "/v1/start_states/{start_state_id}/screen",
    summary="The open machine's screen as PNG",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}}},
)
async def start_state_screen(
    start_state_id: str, request: Request, _p: Principal = Depends(require_screen_reader)
) -> Response:
    resp = await _machine(request, start_state_id, {"op": "screen"})
    try:
        png = base64.b64decode(resp.png_b64 or "", validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(502, "The runner sent a screen that is not base64 PNG.", type="server_error") from None
    return Response(content=png, media_type="image/png")


@router.post("/v1/start_states/{start_state_id}/input", summary="Clicks, typing and keys for the open machine")
async def start_state_input(
    start_state_id: str, body: InputBody, request: Request, _p: Principal = Admin
) -> dict[str, Any]:
    await _machine(request, start_state_id, {"op": "input", "events": body.events})
    st = state_of(request)

    def touch() -> None:
        with st.db.begin() as s:
            ss = s.get(StartState, start_state_id)
            if ss is not None:
                ss.last_input_at = utcnow()

    await run_in_threadpool(touch)
    return {"object": "input", "ok": True, "count": len(body.events)}

"""/v1/test_cases: create, retrieve (id or key), PATCH, delete, list, batch upsert by key."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from gh_server import serialize
from gh_server.api.common import (
    DB,
    Admin,
    MaxTaskMinutes,
    Member,
    Page,
    PageParams,
    check_task_minutes,
    like,
    page_body,
    paginate,
)
from gh_server.api.merge import merge_nested
from gh_server.api.schemas import TestCaseBatchBody, TestCaseCreate, TestCaseFields, checkpoints_fault
from gh_server.auth import Principal
from gh_server.errors import conflict, invalid, not_found
from gh_server.models import Runner, StartState, TestCase, TestCaseTag, TestSet, TestSetCase, new_id, utcnow

router = APIRouter(tags=["Test cases"])

# Fields PATCH may set to null (the others must have a value).
NULLABLE = {"key", "setup_script", "customer", "category", "tags", "metadata"}
# What a nested field cleared with null goes back to (a new case starts from these).
LIMITS_DEFAULTS: dict[str, Any] = {"minutes": 10, "steps": None}
OPERATOR_DEFAULTS: dict[str, Any] = {"approvals": "approve"}
SUCCESS_DEFAULTS: dict[str, Any] = {"check_script": None, "rubric": None, "checkpoints": None}


def resolve_case(session: Session, ident: str) -> TestCase:
    row = session.get(TestCase, ident) if ident.startswith("tc_") else None
    if row is None:
        row = session.scalar(select(TestCase).where(TestCase.key == ident))
    if row is None:
        raise not_found("test case", ident)
    return row


def known_images(session: Session) -> set[str]:
    """Every image a runner has advertised (each runner's last hello, revoked ones too) or a start state
    was made from."""
    known = {str(i.get("name")) for imgs in session.scalars(select(Runner.images)) for i in (imgs or [])
             if isinstance(i, dict) and i.get("name")}
    return known | set(session.scalars(select(StartState.image).distinct()))


def _check_start_state(session: Session, value: str, param: str, allow_unknown_image: bool = False) -> None:
    if value.startswith("ss_"):
        if session.get(StartState, value) is None:
            raise invalid(param, f"no start state {value!r}")
        return
    if allow_unknown_image:
        return
    # Until a runner has advertised anything there is nothing to check against (cases may come first).
    known = known_images(session)
    if known and value not in known:
        raise invalid(param, f"no runner has advertised the image {value!r} (known images: "
                             f"{', '.join(sorted(known))}); fix the name, or send allow_unknown_image: true when a "
                             "runner with that image is coming")


def apply_fields(session: Session, row: TestCase, body: TestCaseFields, param_prefix: str = "", *,
                 max_minutes: int) -> None:
    """Sets the fields the client sent (only those), keeping the tag rows in step. `max_minutes`: the
    server's max_task_minutes."""
    sent = body.model_fields_set
    for name in sent:
        value = getattr(body, name)
        if value is None and name not in NULLABLE:
            raise invalid(param_prefix + name, "cannot be null")
    if "key" in sent and body.key != row.key and body.key is not None:
        other = session.scalar(select(TestCase.id).where(TestCase.key == body.key))
        if other is not None and other != row.id:
            raise conflict(f"Another test case ({other}) has the key {body.key!r}.", param=param_prefix + "key")
    if "start_state" in sent and body.start_state is not None:
        _check_start_state(session, body.start_state, param_prefix + "start_state", bool(body.allow_unknown_image))
    simple = ("key", "name", "prompt", "start_state", "setup_script", "runs_on", "category")
    for name in simple:
        if name in sent:
            setattr(row, name, getattr(body, name))
    # Nested objects merge field by field (gh_server.api.merge): `limits={"steps": 5}` keeps `minutes`.
    if "success" in sent and body.success is not None:
        row.success = merge_nested(row.success, body.success, SUCCESS_DEFAULTS)
        if not any((row.success.get(f) or "").strip() for f in ("check_script", "rubric")) \
                and not row.success.get("checkpoints"):
            raise invalid(param_prefix + "success", "needs a check_script, checkpoints or a rubric")
        fault = checkpoints_fault(row.success.get("check_script"), row.success.get("checkpoints"))
        if fault:
            raise invalid(param_prefix + "success.checkpoints", fault)
    if "customer" in sent:
        row.customer = merge_nested(row.customer, body.customer, {}) if body.customer is not None else None
    if "operator" in sent and body.operator is not None:
        row.operator = merge_nested(row.operator, body.operator, OPERATOR_DEFAULTS)
    if "limits" in sent and body.limits is not None:
        row.limits = merge_nested(row.limits, body.limits, LIMITS_DEFAULTS)
        check_task_minutes(row.limits, max_minutes, param_prefix + "limits.minutes")
    if "metadata" in sent:
        row.metadata_ = dict(body.metadata or {})
    if "tags" in sent:
        tags = list(body.tags or [])
        row.tags = tags
        if row.id is not None:
            session.execute(delete(TestCaseTag).where(TestCaseTag.test_case_id == row.id))
        session.flush()
        session.add_all(TestCaseTag(test_case_id=row.id, tag=t) for t in tags)
    row.updated_at = utcnow()


def new_case(session: Session, body: TestCaseCreate, param_prefix: str = "", *, max_minutes: int) -> TestCase:
    row = TestCase(
        id=new_id("tc_"),
        name=body.name,
        prompt=body.prompt,
        start_state=body.start_state,
        success=dict(SUCCESS_DEFAULTS),
        limits=dict(LIMITS_DEFAULTS),
        operator=dict(OPERATOR_DEFAULTS),
        tags=[],
        metadata_={},
    )
    session.add(row)
    apply_fields(session, row, body, param_prefix, max_minutes=max_minutes)
    row.created_at = row.updated_at
    return row


@router.post("/v1/test_cases", summary="Create a test case")
def create_test_case(body: TestCaseCreate, s: Session = DB, _p: Principal = Admin,
                     max_minutes: int = MaxTaskMinutes) -> dict[str, Any]:
    row = new_case(s, body, max_minutes=max_minutes)
    s.commit()
    return serialize.test_case(row)


@router.post("/v1/test_cases/batch", summary="Create or update up to 500 test cases, matched by key")
def batch_test_cases(body: TestCaseBatchBody, s: Session = DB, _p: Principal = Admin,
                     max_minutes: int = MaxTaskMinutes) -> dict[str, Any]:
    seen: dict[str, int] = {}
    for i, c in enumerate(body.cases):
        if c.key is not None:
            if c.key in seen:
                raise invalid(f"cases[{i}].key", f"{c.key!r} is also cases[{seen[c.key]}]'s key")
            seen[c.key] = i
    test_set = None
    if body.test_set_id is not None:
        test_set = s.get(TestSet, body.test_set_id)
        if test_set is None:
            raise not_found("test set", body.test_set_id)
    rows: list[TestCase] = []
    created = updated = 0
    for i, c in enumerate(body.cases):
        existing = s.scalar(select(TestCase).where(TestCase.key == c.key)) if c.key is not None else None
        if existing is None:
            rows.append(new_case(s, c, f"cases[{i}].", max_minutes=max_minutes))
            created += 1
        else:
            apply_fields(s, existing, c, f"cases[{i}].", max_minutes=max_minutes)
            rows.append(existing)
            updated += 1
    s.flush()
    if test_set is not None:
        present = set(s.scalars(select(TestSetCase.test_case_id).where(TestSetCase.test_set_id == test_set.id)))
        pos = s.scalar(select(func.max(TestSetCase.position)).where(TestSetCase.test_set_id == test_set.id)) or 0
        for r in rows:
            if r.id not in present:
                pos += 1
                s.add(TestSetCase(test_set_id=test_set.id, test_case_id=r.id, position=pos))
                present.add(r.id)
        test_set.updated_at = utcnow()
    s.commit()
    return {"object": "list", "data": [serialize.test_case(r) for r in rows], "created": created, "updated": updated}


@router.get("/v1/test_cases", summary="List test cases, newest first")
def list_test_cases(
    tag: str | None = Query(default=None),
    category: str | None = Query(default=None),
    test_set_id: str | None = Query(default=None),
    q: str | None = Query(default=None, max_length=200),
    _p: Principal = Member,
    page: PageParams = Page,
    s: Session = DB,
) -> dict[str, Any]:
    stmt = select(TestCase)
    if tag is not None:
        stmt = stmt.where(TestCase.id.in_(select(TestCaseTag.test_case_id).where(TestCaseTag.tag == tag)))
    if category is not None:
        stmt = stmt.where(TestCase.category == category)
    if test_set_id is not None:
        if s.get(TestSet, test_set_id) is None:
            raise not_found("test set", test_set_id)
        members = select(TestSetCase.test_case_id).where(TestSetCase.test_set_id == test_set_id)
        stmt = stmt.where(TestCase.id.in_(members))
    if q:
        pat = like(q)
        stmt = stmt.where(
            or_(
                TestCase.name.ilike(pat, escape="\\"),
                TestCase.key.ilike(pat, escape="\\"),
                TestCase.prompt.ilike(pat, escape="\\"),
            )
        )
    rows, has_more, nxt, total = paginate(s, stmt, TestCase.created_at, TestCase.id, page)
    body = page_body([serialize.test_case(r) for r in rows], has_more, nxt, total)
    if "facets" in page.include:
        cats = s.execute(
            select(TestCase.category, func.count())
            .where(TestCase.category.is_not(None))
            .group_by(TestCase.category)
            .order_by(TestCase.category)
        ).all()
        tags = s.execute(
            select(TestCaseTag.tag, func.count()).group_by(TestCaseTag.tag).order_by(TestCaseTag.tag)
        ).all()
        body["facets"] = {
            "categories": [{"name": c, "count": n} for c, n in cats],
            "tags": [{"name": t, "count": n} for t, n in tags],
        }
    return body


@router.get("/v1/test_cases/{test_case_id}", summary="Retrieve a test case by id or key")
def retrieve_test_case(test_case_id: str, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    return serialize.test_case(resolve_case(s, test_case_id))


@router.patch("/v1/test_cases/{test_case_id}", summary="Change the fields sent")
def update_test_case(test_case_id: str, body: TestCaseFields, s: Session = DB, _p: Principal = Admin,
                     max_minutes: int = MaxTaskMinutes) -> dict[str, Any]:
    row = resolve_case(s, test_case_id)
    apply_fields(s, row, body, max_minutes=max_minutes)
    s.commit()
    return serialize.test_case(row)


@router.delete("/v1/test_cases/{test_case_id}", summary="Delete a test case (runs keep their copy)")
def delete_test_case(test_case_id: str, s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    row = resolve_case(s, test_case_id)
    cid = row.id
    s.execute(delete(TestSetCase).where(TestSetCase.test_case_id == cid))
    s.execute(delete(TestCaseTag).where(TestCaseTag.test_case_id == cid))
    s.delete(row)
    s.commit()
    return {"object": "test_case", "test_case_id": cid, "deleted": True}

"""/v1/test_sets: CRUD, add cases (or change their repeat), remove a case, PATCH cases replaces the list."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from gh_server import serialize
from gh_server.api.common import DB, Admin, Member, Page, PageParams, like, page_body, paginate
from gh_server.api.merge import merge_nested
from gh_server.api.schemas import AddCases, TestSetCaseInput, TestSetCreate, TestSetFields
from gh_server.api.test_cases import resolve_case
from gh_server.auth import Principal
from gh_server.errors import invalid, not_found
from gh_server.models import TestCase, TestSet, TestSetCase, new_id, utcnow

router = APIRouter(tags=["Test sets"])


def get_set(session: Session, ident: str) -> TestSet:
    row = session.get(TestSet, ident)
    if row is None:
        raise not_found("test set", ident)
    return row


def set_cases(session: Session, set_id: str) -> list[tuple[str, str | None, int | None]]:
    rows = session.execute(
        select(TestSetCase.test_case_id, TestCase.key, TestSetCase.repeat)
        .join(TestCase, TestCase.id == TestSetCase.test_case_id)
        .where(TestSetCase.test_set_id == set_id)
        .order_by(TestSetCase.position, TestSetCase.test_case_id)
    ).all()
    return [(r[0], r[1], r[2]) for r in rows]


def _out(session: Session, row: TestSet) -> dict[str, Any]:
    return serialize.test_set(row, set_cases(session, row.id))


def _replace_cases(session: Session, row: TestSet, cases: list[TestSetCaseInput]) -> None:
    resolved: list[tuple[str, int | None]] = []
    seen: set[str] = set()
    for i, c in enumerate(cases):
        try:
            case = resolve_case(session, c.test_case_id)
        except Exception:
            raise invalid(f"cases[{i}].test_case_id", f"no test case {c.test_case_id!r}") from None
        if case.id in seen:
            raise invalid(f"cases[{i}].test_case_id", f"{c.test_case_id!r} is in the list twice")
        seen.add(case.id)
        resolved.append((case.id, c.repeat))
    session.execute(delete(TestSetCase).where(TestSetCase.test_set_id == row.id))
    session.flush()
    session.add_all(
        TestSetCase(test_set_id=row.id, test_case_id=cid, repeat=rep, position=i)
        for i, (cid, rep) in enumerate(resolved)
    )


def _apply(session: Session, row: TestSet, body: TestSetFields) -> None:
    sent = body.model_fields_set
    for name in ("name", "repeat"):
        if name in sent and getattr(body, name) is None:
            raise invalid(name, "cannot be null")
    if "name" in sent and body.name is not None:
        row.name = body.name
    if "description" in sent:
        row.description = body.description or ""
    if "repeat" in sent and body.repeat is not None:
        row.repeat = body.repeat
    if "customer" in sent:
        # Merged field by field, as a test case's nested objects are (gh_server.api.merge).
        row.customer = merge_nested(row.customer, body.customer, {}) if body.customer is not None else None
    if "metadata" in sent:
        row.metadata_ = dict(body.metadata or {})
    if "cases" in sent:
        _replace_cases(session, row, list(body.cases or []))
    row.updated_at = utcnow()


@router.post("/v1/test_sets", summary="Create a test set")
def create_test_set(body: TestSetCreate, s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    row = TestSet(id=new_id("ts_"), name=body.name, description="", repeat=1, metadata_={})
    s.add(row)
    s.flush()
    _apply(s, row, body)
    row.created_at = row.updated_at
    s.commit()
    return _out(s, row)


@router.get("/v1/test_sets", summary="List test sets, newest first")
def list_test_sets(
    q: str | None = Query(default=None, max_length=200),
    _p: Principal = Member,
    page: PageParams = Page,
    s: Session = DB,
) -> dict[str, Any]:
    stmt = select(TestSet)
    if q:
        pat = like(q)
        stmt = stmt.where(or_(TestSet.name.ilike(pat, escape="\\"), TestSet.description.ilike(pat, escape="\\")))
    rows, has_more, nxt, total = paginate(s, stmt, TestSet.created_at, TestSet.id, page)
    return page_body([_out(s, r) for r in rows], has_more, nxt, total)


@router.get("/v1/test_sets/{test_set_id}", summary="Retrieve a test set")
def retrieve_test_set(test_set_id: str, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    return _out(s, get_set(s, test_set_id))


@router.patch("/v1/test_sets/{test_set_id}", summary="Change the fields sent (cases replaces the list)")
def update_test_set(test_set_id: str, body: TestSetFields, s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    row = get_set(s, test_set_id)
    _apply(s, row, body)
    s.commit()
    return _out(s, row)


@router.delete("/v1/test_sets/{test_set_id}", summary="Delete a test set (its cases and runs stay)")
def delete_test_set(test_set_id: str, s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    row = get_set(s, test_set_id)
    s.execute(delete(TestSetCase).where(TestSetCase.test_set_id == row.id))
    s.delete(row)
    s.commit()
    return {"object": "test_set", "test_set_id": test_set_id, "deleted": True}


@router.post("/v1/test_sets/{test_set_id}/cases", summary="Add cases at the end, or change their repeat")
def add_cases(test_set_id: str, body: AddCases, s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    row = get_set(s, test_set_id)
    existing = {m.test_case_id: m for m in s.scalars(select(TestSetCase).where(TestSetCase.test_set_id == row.id))}
    pos = s.scalar(select(func.max(TestSetCase.position)).where(TestSetCase.test_set_id == row.id)) or 0
    for i, ident in enumerate(body.test_case_ids):
        try:
            case = resolve_case(s, ident)
        except Exception:
            raise invalid(f"test_case_ids[{i}]", f"no test case {ident!r}") from None
        member = existing.get(case.id)
        if member is None:
            pos += 1
            member = TestSetCase(test_set_id=row.id, test_case_id=case.id, repeat=body.repeat, position=pos)
            s.add(member)
            existing[case.id] = member
        elif "repeat" in body.model_fields_set:
            member.repeat = body.repeat
    row.updated_at = utcnow()
    s.commit()
    return _out(s, row)


@router.delete("/v1/test_sets/{test_set_id}/cases/{test_case_id}", summary="Take a case out of the set")
def remove_case(test_set_id: str, test_case_id: str, s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    row = get_set(s, test_set_id)
    case = resolve_case(s, test_case_id)
    gone = s.execute(
        delete(TestSetCase).where(TestSetCase.test_set_id == row.id, TestSetCase.test_case_id == case.id)
    ).rowcount  # type: ignore[attr-defined]
    if not gone:
        raise not_found(f"test case in test set {row.id}:", test_case_id)
    row.updated_at = utcnow()
    s.commit()
    return _out(s, row)

# mypy: disable-error-code="arg-type,list-item,typeddict-item,misc"
"""Test sets through the SDK: CRUD, add/remove cases, PATCH cases replaces the list, limits, auth."""

from __future__ import annotations

import pytest
from guidinghand import InvalidRequestError, NotFoundError, PermissionDeniedError

from .conftest import Server


def _cases(server: Server, prefix: str, n: int) -> list[str]:
    return [
        server.admin.test_cases.create(f"{prefix}{i}", "p", "linux-tiny", {"rubric": "r"}, key=f"{prefix}{i}")[
            "test_case_id"
        ]
        for i in range(n)
    ]


def test_set_crud_and_cases(server: Server) -> None:
    c = server.admin
    ids = _cases(server, "S-", 4)
    ts = c.test_sets.create(
        "Basics",
        description="d",
        repeat=3,
        cases=[{"test_case_id": "S-0"}, {"test_case_id": ids[1], "repeat": 5}],
        customer={"persona": "calm"},
        metadata={"team": "x"},
    )
    assert ts["object"] == "test_set" and ts["test_set_id"].startswith("ts_")
    assert ts["cases"] == [
        {"test_case_id": ids[0], "key": "S-0", "repeat": None},
        {"test_case_id": ids[1], "key": "S-1", "repeat": 5},
    ]
    assert ts["case_count"] == 2 and ts["repeat"] == 3 and ts["customer"] == {"persona": "calm"}
    got = c.test_sets.add_cases(ts["test_set_id"], ["S-2", ids[3]], repeat=2)
    assert [x["key"] for x in got["cases"]] == ["S-0", "S-1", "S-2", "S-3"]
    assert got["cases"][2]["repeat"] == 2
    got = c.test_sets.add_cases(ts["test_set_id"], ["S-0"], repeat=4)  # already in: repeat changes, order stays
    assert [x["key"] for x in got["cases"]] == ["S-0", "S-1", "S-2", "S-3"] and got["cases"][0]["repeat"] == 4
    got = c.test_sets.remove_case(ts["test_set_id"], "S-1")
    assert [x["key"] for x in got["cases"]] == ["S-0", "S-2", "S-3"]
    with pytest.raises(NotFoundError):
        c.test_sets.remove_case(ts["test_set_id"], "S-1")
    got = c.test_sets.update(ts["test_set_id"], cases=[{"test_case_id": "S-3"}], name="Renamed")
    assert [x["key"] for x in got["cases"]] == ["S-3"] and got["name"] == "Renamed" and got["repeat"] == 3
    assert c.test_sets.retrieve(ts["test_set_id"]) == got
    assert server.member.test_sets.retrieve(ts["test_set_id"])["name"] == "Renamed"
    gone = c.test_sets.delete(ts["test_set_id"])
    assert gone == {"object": "test_set", "test_set_id": ts["test_set_id"], "deleted": True}
    with pytest.raises(NotFoundError):
        c.test_sets.retrieve(ts["test_set_id"])
    assert c.test_cases.retrieve("S-3")["name"] == "S-3"  # its cases stay


def test_set_errors(server: Server) -> None:
    c = server.admin
    _cases(server, "SE-", 1)
    for repeat in (0, 21):
        with pytest.raises(InvalidRequestError) as e:
            c.test_sets.create("bad", repeat=repeat)
        assert e.value.extra["param"] == "repeat"
    with pytest.raises(InvalidRequestError) as e:
        c.test_sets.create("bad", cases=[{"test_case_id": "NOPE"}])
    assert e.value.extra["param"] == "cases[0].test_case_id"
    with pytest.raises(InvalidRequestError) as e:
        c.test_sets.create("bad", cases=[{"test_case_id": "SE-0", "repeat": 21}])
    assert e.value.extra["param"] == "cases[0].repeat"
    with pytest.raises(InvalidRequestError) as e:
        c.test_sets.create("n" * 201)
    assert e.value.extra["param"] == "name"
    with pytest.raises(NotFoundError):
        c.test_sets.retrieve("ts_nope")
    with pytest.raises(NotFoundError):
        c.test_sets.add_cases("ts_nope", ["SE-0"])
    ts = c.test_sets.create("ok")
    with pytest.raises(InvalidRequestError) as e:
        c.test_sets.add_cases(ts["test_set_id"], ["NOPE"])
    assert e.value.extra["param"] == "test_case_ids[0]"
    for call in (
        lambda: server.member.test_sets.create("m"),
        lambda: server.member.test_sets.update(ts["test_set_id"], name="x"),
        lambda: server.member.test_sets.add_cases(ts["test_set_id"], ["SE-0"]),
        lambda: server.member.test_sets.delete(ts["test_set_id"]),
    ):
        with pytest.raises(PermissionDeniedError):
            call()


def test_set_list(server: Server) -> None:
    c = server.admin
    made = [c.test_sets.create(f"listset-{i}", description="findme" if i % 2 else "")["test_set_id"] for i in range(5)]
    page = c.test_sets.list(limit=2, q="listset", include="total_count")
    assert page["total_count"] == 5 and len(page["data"]) == 2 and page["has_more"]
    allsets = [t["test_set_id"] for t in c.test_sets.list_all(q="listset", limit=2)]
    assert allsets == list(reversed(made))
    assert {t["name"] for t in c.test_sets.list(q="findme")["data"]} == {"listset-1", "listset-3"}

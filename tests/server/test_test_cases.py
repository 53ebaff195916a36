# mypy: disable-error-code="arg-type,list-item,typeddict-item,misc"
"""Test cases through the official SDK: CRUD, keys, limits (400 naming the field), auth, batch, lists."""

from __future__ import annotations

import base64

import pytest
from guidinghand import AuthenticationError, ConflictError, InvalidRequestError, NotFoundError, PermissionDeniedError

from .conftest import Server


def test_create_retrieve_by_id_and_key(server: Server) -> None:
    c = server.admin
    tc = c.test_cases.create(
        "Dark mode",
        "windows went black",
        "linux-tiny",
        {"check_script": "echo False"},
        key="DSP-01",
        tags=["display", "uac"],
        category="Display",
        limits={"minutes": 5},
        customer={"persona": "teacher"},
    )
    assert tc["object"] == "test_case"
    assert tc["test_case_id"].startswith("tc_")
    assert tc["key"] == "DSP-01"
    assert tc["limits"] == {"minutes": 5, "steps": None}
    assert tc["success"] == {"check_script": "echo False", "rubric": None, "checkpoints": None}
    assert tc["operator"] == {"approvals": "approve"}
    assert tc["runs_on"] == "vm"
    assert tc["created_at"].endswith("Z")
    assert c.test_cases.retrieve(tc["test_case_id"]) == tc
    assert c.test_cases.retrieve("DSP-01") == tc
    assert server.member.test_cases.retrieve("DSP-01")["name"] == "Dark mode"


def test_patch_changes_only_sent_fields(server: Server) -> None:
    c = server.admin
    tc = c.test_cases.create("p", "prompt", "linux-tiny", {"rubric": "it works"}, key="PATCH-1", tags=["a"])
    up = c.test_cases.update("PATCH-1", name="renamed", category="Net")
    assert up["name"] == "renamed" and up["category"] == "Net"
    assert up["prompt"] == "prompt" and up["tags"] == ["a"] and up["key"] == "PATCH-1"
    up = c.test_cases.update(tc["test_case_id"], category=None, tags=[])
    assert up["category"] is None and up["tags"] == []
    with pytest.raises(InvalidRequestError) as e:
        c.test_cases.update("PATCH-1", name=None)
    assert e.value.status == 400 and "name" in e.value.message
    with pytest.raises(InvalidRequestError) as e:
        c.test_cases.update("PATCH-1", success={"check_script": None, "rubric": None})
    assert "success" in e.value.message


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("key", {"key": "tc_nope"}),
        ("key", {"key": "has space"}),
        ("key", {"key": "x" * 65}),
        ("name", {"name": "n" * 201}),
        ("prompt", {"prompt": "p" * 8001}),
        ("setup_script", {"setup_script": "s" * 100_001}),
        ("success.check_script", {"success": {"check_script": "c" * 100_001}}),
        ("limits.minutes", {"limits": {"minutes": 0}}),
        ("limits.minutes", {"limits": {"minutes": 61}}),
        ("limits.steps", {"limits": {"steps": 501}}),
        ("customer.facts", {"customer": {"facts": {f"f{i}": "v" for i in range(51)}}}),
        ("customer.facts", {"customer": {"facts": {"n" * 201: "v"}}}),
        ("customer.facts", {"customer": {"facts": {"": "v"}}}),
        ("customer.facts", {"customer": {"facts": {"Wi-Fi network": "v" * 2001}}}),
        ("tags", {"tags": [f"t{i}" for i in range(51)]}),
        ("tags", {"tags": ["x" * 65]}),
        ("success", {"success": {}}),
        ("start_state", {"start_state": "ss_doesnotexist"}),
    ],
)
def test_limits_are_400_naming_the_field(server: Server, field: str, kwargs: dict[str, object]) -> None:
    body: dict[str, object] = {
        "name": "n",
        "prompt": "p",
        "start_state": "linux-tiny",
        "success": {"check_script": "echo False"},
    }
    body.update(kwargs)
    name, prompt, start, success = body.pop("name"), body.pop("prompt"), body.pop("start_state"), body.pop("success")
    with pytest.raises(InvalidRequestError) as e:
        server.admin.test_cases.create(name, prompt, start, success, **body)  # type: ignore[arg-type]
    assert e.value.status == 400
    assert e.value.type == "invalid_request"
    assert e.value.extra.get("param") == field
    assert field in e.value.message
    assert "detail" not in (e.value.body or {})


def test_limits_at_the_edge_are_accepted(server: Server) -> None:
    tc = server.admin.test_cases.create(
        "n" * 200,
        "p" * 8000,
        "linux-tiny",
        {"check_script": "c" * 100_000},
        key="E" * 64,
        setup_script="s" * 100_000,
        limits={"minutes": 60, "steps": 500},
        tags=[f"t{i}" for i in range(50)],
        customer={"facts": {f"f{i}": "v" for i in range(49)} | {"pw": {"secret": "s3"}}},
    )
    assert len(tc["tags"]) == 50 and tc["limits"] == {"minutes": 60, "steps": 500}
    assert tc["customer"]["facts"]["pw"] == {"secret": "s3"}


def test_scripts_as_base64(server: Server) -> None:
    enc = base64.b64encode("echo 'é'\n".encode()).decode()
    tc = server.admin.test_cases.create(
        "b64",
        "p",
        "linux-tiny",
        {"check_script": {"base64": enc}},  # type: ignore[typeddict-item]
        setup_script={"base64": enc},  # type: ignore[arg-type]
    )
    assert tc["setup_script"] == "echo 'é'\n" and tc["success"]["check_script"] == "echo 'é'\n"
    with pytest.raises(InvalidRequestError) as e:
        server.admin.test_cases.create(
            "b64", "p", "linux-tiny", {"rubric": "r"}, setup_script={"base64": "!!!not base64"}
        )  # type: ignore[arg-type]
    assert e.value.extra["param"] == "setup_script"


def test_duplicate_key_is_409_and_unknown_is_404(server: Server) -> None:
    c = server.admin
    c.test_cases.create("a", "p", "linux-tiny", {"rubric": "r"}, key="DUP-1")
    with pytest.raises(ConflictError) as e:
        c.test_cases.create("b", "p", "linux-tiny", {"rubric": "r"}, key="DUP-1")
    assert e.value.status == 409
    with pytest.raises(NotFoundError):
        c.test_cases.retrieve("NOPE-404")
    with pytest.raises(NotFoundError):
        c.test_cases.update("tc_000000000000", name="x")
    with pytest.raises(NotFoundError):
        c.test_cases.delete("NOPE-404")


@pytest.mark.parametrize("path", ["/v1/test_cases", "/v1/test_sets", "/v1/test_runs", "/v1/runners",
                                  "/v1/start_states", "/v1/test_runs/tr_none/attempts"])
def test_a_list_without_a_key_is_401_whatever_its_page_says(server: Server, path: str) -> None:
    import httpx

    bad_page = {"limit": "1000", "include": "nonsense"}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        assert http.get(path, params=bad_page).status_code == 401
        assert http.get(path, params=bad_page, headers={"Authorization": "Bearer gh_live_wrong"}).status_code == 401
        r = http.get(path, params=bad_page, headers={"Authorization": f"Bearer {server.member_key}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text


def test_auth_401_and_member_403(server: Server) -> None:
    with pytest.raises(AuthenticationError) as e:
        server.client("gh_live_wrong").test_cases.list()
    assert e.value.status == 401 and e.value.type == "authentication"
    with pytest.raises(PermissionDeniedError) as e2:
        server.member.test_cases.create("m", "p", "linux-tiny", {"rubric": "r"})
    assert e2.value.status == 403 and e2.value.type == "permission"
    tc = server.admin.test_cases.create("m", "p", "linux-tiny", {"rubric": "r"}, key="MEM-1")
    for call in (
        lambda: server.member.test_cases.update("MEM-1", name="x"),
        lambda: server.member.test_cases.delete("MEM-1"),
        lambda: server.member.test_cases.batch(
            [{"name": "n", "prompt": "p", "start_state": "s", "success": {"rubric": "r"}}]
        ),
    ):
        with pytest.raises(PermissionDeniedError):
            call()
    assert server.admin.test_cases.retrieve(tc["test_case_id"])["name"] == "m"


def test_delete_removes_from_sets(server: Server) -> None:
    c = server.admin
    tc = c.test_cases.create("d", "p", "linux-tiny", {"rubric": "r"}, key="DEL-1")
    ts = c.test_sets.create("with del", cases=[{"test_case_id": "DEL-1"}])
    assert ts["case_count"] == 1
    gone = c.test_cases.delete("DEL-1")
    assert gone == {"object": "test_case", "test_case_id": tc["test_case_id"], "deleted": True}
    assert c.test_sets.retrieve(ts["test_set_id"])["case_count"] == 0
    with pytest.raises(NotFoundError):
        c.test_cases.retrieve(tc["test_case_id"])


def test_batch_upserts_by_key_and_adds_to_set(server: Server) -> None:
    c = server.admin
    ts = c.test_sets.create("batch set")
    cases = [
        {
            "key": f"B-{i}",
            "name": f"b{i}",
            "prompt": "p",
            "start_state": "linux-tiny",
            "success": {"check_script": "echo False"},
            "tags": ["batch"],
        }
        for i in range(3)
    ]
    cases.append({"name": "no key", "prompt": "p", "start_state": "linux-tiny", "success": {"rubric": "r"}})
    out = c.test_cases.batch(cases, test_set_id=ts["test_set_id"])  # type: ignore[arg-type]
    assert (out["created"], out["updated"]) == (4, 0)
    assert [d["key"] for d in out["data"]] == ["B-0", "B-1", "B-2", None]
    cases[1]["name"] = "renamed"
    out2 = c.test_cases.batch(
        [
            *cases[:3],
            {"key": "B-3", "name": "b3", "prompt": "p", "start_state": "linux-tiny", "success": {"rubric": "r"}},
        ],
        test_set_id=ts["test_set_id"],
    )  # type: ignore[arg-type]
    assert (out2["created"], out2["updated"]) == (1, 3)
    assert out2["data"][1]["name"] == "renamed"
    assert out2["data"][1]["test_case_id"] == out["data"][1]["test_case_id"]
    got = c.test_sets.retrieve(ts["test_set_id"])
    assert got["case_count"] == 5
    # a bad case names its index and field, and nothing of the batch is kept
    bad = [
        {"key": "B-NEW", "name": "n", "prompt": "p", "start_state": "s", "success": {"rubric": "r"}},
        {
            "key": "B-BAD",
            "name": "n",
            "prompt": "p",
            "start_state": "s",
            "success": {"rubric": "r"},
            "limits": {"minutes": 99},
        },
    ]
    with pytest.raises(InvalidRequestError) as e:
        c.test_cases.batch(bad)  # type: ignore[arg-type]
    assert e.value.extra["param"] == "cases[1].limits.minutes"
    with pytest.raises(NotFoundError):
        c.test_cases.retrieve("B-NEW")
    with pytest.raises(InvalidRequestError) as e:
        c.test_cases.batch([cases[0]] * 501)  # type: ignore[arg-type]
    assert e.value.extra["param"] == "cases"


def test_list_filters_and_pagination(server: Server) -> None:
    c = server.admin
    ts = c.test_sets.create("list set")
    made = []
    for i in range(7):
        made.append(
            c.test_cases.create(
                f"listcase {i}",
                f"needle{i % 2}",
                "linux-tiny",
                {"rubric": "r"},
                key=f"L-{i}",
                tags=["even"] if i % 2 == 0 else ["odd"],
                category="Cat-L",
            )
        )
    c.test_sets.add_cases(ts["test_set_id"], ["L-1", "L-2"])
    page = c.test_cases.list(category="Cat-L", limit=3, include="total_count")
    assert page["object"] == "list" and page["total_count"] == 7 and page["has_more"] is True  # type: ignore[typeddict-item]
    everything = list(c.test_cases.list_all(category="Cat-L", limit=3))
    assert [t["key"] for t in everything] == [f"L-{i}" for i in reversed(range(7))]  # newest first, no repeats
    assert {t["key"] for t in c.test_cases.list(tag="odd", category="Cat-L")["data"]} == {"L-1", "L-3", "L-5"}
    assert {t["key"] for t in c.test_cases.list(test_set_id=ts["test_set_id"])["data"]} == {"L-1", "L-2"}
    assert {t["key"] for t in c.test_cases.list(q="needle1")["data"]} == {"L-1", "L-3", "L-5"}
    facets = c.test_cases.list(include=["facets"])["facets"]  # type: ignore[typeddict-item]
    assert {"name": "Cat-L", "count": 7} in facets["categories"]
    with pytest.raises(InvalidRequestError) as e:
        c.test_cases.list(limit=1000)
    assert e.value.extra["param"] == "limit"
    with pytest.raises(InvalidRequestError) as e:
        c.test_cases.list(cursor="garbage")
    assert e.value.extra["param"] == "cursor"


def test_an_image_no_runner_has_advertised_is_refused_unless_it_is_coming(server: Server) -> None:
    import httpx

    from gh_server.models import Runner

    c = server.admin
    # Before any runner has said what it has, there is nothing to check against: cases may come first.
    c.test_cases.create("n", "p", "linux-tinyy", {"check_script": "echo False"}, key="IMG-0")
    with server.state.db.begin() as s:
        s.add(Runner(id="rn_imgs", name="lab-1", token_hash="h-imgs", labels=[], images=[{"name": "linux-tiny"}],
                     held_versions=[]))
    with pytest.raises(InvalidRequestError) as e:
        c.test_cases.create("n", "p", "linux-tinyy", {"check_script": "echo False"}, key="IMG-1")
    assert "no runner has advertised the image 'linux-tinyy' (known images: linux-tiny)" in str(e.value)
    assert "allow_unknown_image: true" in str(e.value)
    http = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=30)
    case = {"name": "n", "prompt": "p", "start_state": "win10-22h2", "success": {"check_script": "echo False"}}
    r = http.post("/v1/test_cases/batch", json={"cases": [case]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cases[0].start_state", r.text
    r = http.post("/v1/test_cases", json={**case, "key": "IMG-2", "allow_unknown_image": True})
    assert r.status_code == 200, r.text  # said to be coming: accepted
    assert "allow_unknown_image" not in r.json()
    assert c.test_cases.create("n", "p", "linux-tiny", {"check_script": "echo False"}, key="IMG-3")["key"] == "IMG-3"

"""How many times one request goes through the thread pool. FastAPI runs each sync dependency, and the
handler, in a worker thread; each trip is a turn at the GIL and back on the loop, which under load is
where a request waits (docs/security.md, bench/live_abuse.py). Dependencies that do no I/O (the role
checks, the page parameters, opening the session) stay on the loop, so a list takes four trips: the
key's lookup, the handler, FastAPI's check of what it returned, and giving the session's connection back.
Before, it took seven: the page parameters, the session opened and closed, the role check, and those."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
import httpx
import pytest

from .conftest import Server


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each HTTP request of the in-thread server ran in the thread pool, in order."""
    seen: list[str] = []
    real: Callable[..., Awaitable[Any]] = anyio.to_thread.run_sync

    async def counting(func: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        task = asyncio.current_task()
        # uvicorn runs each HTTP request, its dependencies and its handler, in one task of this coroutine
        if task is not None and "RequestResponseCycle.run_asgi" in repr(task.get_coro()):
            inner = getattr(func, "func", func)  # FastAPI passes functools.partial(handler, **values)
            seen.append(getattr(inner, "__qualname__", repr(inner)))
        return await real(func, *args, **kw)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
    return seen


ON_THE_LOOP = ("require_member", "require_admin", "page_params", "PageParams", "get_db")


def test_a_list_takes_four_trips(server: Server, trips: list[str]) -> None:
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.member_key}"}) as http:
        r = http.get("/v1/runners", params={"limit": 5})
    assert r.status_code == 200 and r.json()["object"] == "list"
    assert len(trips) == 4 and trips[0] == "authenticate" and trips[-1] == "Session.close", trips
    assert not [t for t in trips if t.startswith(ON_THE_LOOP)], trips


def test_a_read_by_id_that_is_not_there_takes_three_trips(server: Server, trips: list[str]) -> None:
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"}) as http:
        r = http.get("/v1/runners/rn_nosuch")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    assert len(trips) == 3 and trips[0] == "authenticate" and trips[-1] == "Session.close", trips


def test_a_bad_page_is_refused_on_the_loop(server: Server, trips: list[str]) -> None:
    """A page parameter out of range is answered on the loop once the key is known (the key first, so a
    caller without one hears 401: test_test_cases.py): its one trip is the key's lookup."""
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.member_key}"}) as http:
        r = http.get("/v1/runners", params={"limit": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
    assert trips == ["authenticate"], trips

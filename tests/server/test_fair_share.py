"""Each caller's share of gh-server (gh_server/fair_share.py), on the real server's middleware: one key's
burst is served a share at a time while another key's request goes ahead; past the waiting bound a 429
comes before anything is read; a slot is given back when the answer starts. A route that holds its
request until the test lets it go is added to gh-server's own app, behind all its middleware."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from fastapi import Request
from fastapi.responses import StreamingResponse

from gh_server.auth import create_key
from gh_server.fair_share import caller_of

from .conftest import RunningServer, make_settings

IN_FLIGHT, WAITING = 2, 3


class Held:
    """The held route's requests: which are inside the handler (the server's loop), told to the test's
    loop as they come, and the gate that lets them go."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.gate: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's
        self.changed: asyncio.Event | None = None  # the test's, and its loop
        self.test_loop: asyncio.AbstractEventLoop | None = None

    def came(self, tag: str) -> None:
        self.inside.append(tag)
        if self.test_loop is not None and self.changed is not None:
            self.test_loop.call_soon_threadsafe(self.changed.set)

    async def until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        self.test_loop, self.changed = asyncio.get_running_loop(), asyncio.Event()
        async with asyncio.timeout(timeout):
            while True:
                self.changed.clear()
                if predicate():
                    return
                await self.changed.wait()

    def release(self) -> None:
        assert self.loop is not None and self.gate is not None
        self.loop.call_soon_threadsafe(self.gate.set)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, str, str, Held]]:
    settings, data_dir = make_settings(None, api_in_flight_per_caller=IN_FLIGHT, api_waiting_per_caller=WAITING)
    running = RunningServer(settings)
    held = Held()

    async def hold(request: Request, tag: str) -> dict[str, str]:
        held.loop = asyncio.get_running_loop()
        if held.gate is None:
            held.gate = asyncio.Event()
        held.came(tag)
        await held.gate.wait()
        return {"tag": tag}

    async def stream(request: Request) -> StreamingResponse:
        held.loop = asyncio.get_running_loop()
        if held.gate is None:
            held.gate = asyncio.Event()
        gate = held.gate

        async def body() -> AsyncIterator[bytes]:
            yield b"started "
            await gate.wait()
            yield b"done"

        return StreamingResponse(body())

    running.app.add_api_route("/test/hold/{tag}", hold)
    running.app.add_api_route("/test/stream", stream)
    running.start()
    try:
        st = running.app.state.gh
        with st.db.begin() as s:
            _, one = create_key(s, "one", "member")
            _, other = create_key(s, "other", "member")
        yield f"http://127.0.0.1:{settings.port}", one, other, held
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def held(served: tuple[str, str, str, Held]) -> Iterator[Held]:
    h = served[3]
    h.inside.clear()
    h.gate = h.changed = h.test_loop = None
    yield h
    if h.gate is not None:
        h.release()


async def test_one_keys_burst_is_served_a_share_at_a_time_and_another_key_goes_ahead(
        served: tuple[str, str, str, Held], held: Held) -> None:
    base, one, other, _ = served
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        burst = [asyncio.create_task(http.get(f"/test/hold/one{i}", headers={"Authorization": f"Bearer {one}"}))
                 for i in range(IN_FLIGHT + WAITING)]
        await held.until(lambda: len(held.inside) >= IN_FLIGHT)
        # Another caller's request is served now, beside the burst's share, not after the burst.
        theirs = asyncio.create_task(http.get("/test/hold/other", headers={"Authorization": f"Bearer {other}"}))
        await held.until(lambda: "other" in held.inside)
        assert len([t for t in held.inside if t.startswith("one")]) == IN_FLIGHT
        # Past the waiting bound: refused at once, with why.
        r = await http.get("/test/hold/over", headers={"Authorization": f"Bearer {one}"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit"
        assert "over" not in held.inside
        held.release()
        answers = await asyncio.gather(*burst, theirs)
    assert [a.status_code for a in answers] == [200] * (IN_FLIGHT + WAITING + 1)
    assert sorted(held.inside) == sorted([f"one{i}" for i in range(IN_FLIGHT + WAITING)] + ["other"])


async def test_a_slot_is_given_back_when_the_answer_starts(served: tuple[str, str, str, Held], held: Held) -> None:
    base, one, other, _ = served
    auth = {"Authorization": f"Bearer {one}"}
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        streams = []
        for _ in range(IN_FLIGHT):  # a share's worth of answers started, their bodies held
            s = await http.send(http.build_request("GET", "/test/stream", headers=auth), stream=True)
            assert s.status_code == 200
            streams.append(s)
        # The share is free again: as many requests are served beside the streams, and one more waits.
        more = [asyncio.create_task(http.get(f"/test/hold/one{i}", headers=auth)) for i in range(IN_FLIGHT + 1)]
        await held.until(lambda: len(held.inside) >= IN_FLIGHT)
        theirs = asyncio.create_task(http.get("/test/hold/other", headers={"Authorization": f"Bearer {other}"}))
        await held.until(lambda: "other" in held.inside)
        assert len([t for t in held.inside if t.startswith("one")]) == IN_FLIGHT
        held.release()
        for s in streams:
            assert await s.aread() == b"started done"
            await s.aclose()
        assert [a.status_code for a in await asyncio.gather(*more, theirs)] == [200] * (IN_FLIGHT + 2)


def test_a_caller_is_its_credential_hashed_else_its_session_else_its_address() -> None:
    key = {"type": "http", "headers": [(b"authorization", b"Bearer gh_live_secret")], "client": ("10.0.0.1", 5)}
    session = {"type": "http", "headers": [(b"cookie", b"theme=dark; gh_console=s3cret")], "client": ("10.0.0.1", 5)}
    nobody = {"type": "http", "headers": [(b"cookie", b"theme=dark")], "client": ("10.0.0.2", 5)}
    assert caller_of(key).startswith("key:") and "secret" not in caller_of(key)
    assert caller_of(session).startswith("session:") and "s3cret" not in caller_of(session)
    assert caller_of(nobody) == "addr:10.0.0.2"
    assert caller_of(key) != caller_of({**key, "headers": [(b"authorization", b"Bearer gh_live_other")]})
    # One key is one share however its header is written (auth takes each of these as the same key).
    for same in (b"bearer gh_live_secret", b"BEARER  gh_live_secret ", b"Bearer gh_live_secret\t"):
        assert caller_of({**key, "headers": [(b"authorization", same)]}) == caller_of(key)

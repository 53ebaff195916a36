"""GET {machine.url}/accessibility through a real gh-server and gh-runner daemon (the provider double
behind it, tests/runner/doubles.py): the tree as XML, and each typed refusal (docs/desktop-guests.md)."""

from __future__ import annotations

import asyncio

import httpx

from gh_runner import machine_requests

from .test_frame_limits import Stack, stack  # noqa: F401 - the fixture: two attempts in their task

TREE = '<desktop-frame><application name="Mousepad" /></desktop-frame>'


async def test_the_tree_comes_as_xml_and_reads_take_turns_on_a_machine(stack: Stack) -> None:  # noqa: F811
    url, token, _ = stack.machine_api("one")
    auth = {"Authorization": f"Bearer {token}"}
    stack.provider.a11y, stack.provider.delay = TREE, 0.5
    async with httpx.AsyncClient(timeout=60) as http:
        got = await asyncio.gather(*(http.get(url + "/accessibility", headers=auth) for _ in range(3)))
    for r in got:
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("application/xml") and r.text == TREE
    # GLib in the guest crashes under concurrent AT-SPI reads: the runner lets one through at a time.
    assert stack.provider.a11y_most_at_once == 1


async def test_a_machine_without_a_desktop_or_a_tree_over_the_cap_is_a_typed_refusal(stack: Stack) -> None:  # noqa: F811
    url, token, _ = stack.machine_api("one")
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=60) as http:
        stack.provider.a11y = None  # the base Machine's answer: no desktop session
        r = await http.get(url + "/accessibility", headers=auth)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "no_accessibility"
        assert "no desktop session" in r.json()["error"]["message"]
        stack.provider.a11y = "<desktop-frame>" + "x" * machine_requests.ACCESSIBILITY_MAX_BYTES + "</desktop-frame>"
        r = await http.get(url + "/accessibility", headers=auth)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "accessibility_too_large"
        # Neither is the machine's failure: the machine still answers, and the attempt is not marked.
        shot = await http.get(url + "/screen", headers=auth)
        assert shot.status_code == 200

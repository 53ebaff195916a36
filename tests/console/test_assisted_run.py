"""The console's run page counts an assisted try apart, with the number the API's progress gives (an
attempt a person took over; docs/server-api.md, "Assisted attempts")."""

from __future__ import annotations

import secrets

from playwright.sync_api import Page, expect
from server.conftest import Server
from server.test_assisted import _assisted
from server.test_test_runs import _attempts, _case, _finish

from .conftest import sign_in


def test_the_run_page_shows_assisted_beside_error(page: Page, server: Server) -> None:
    key = "held-" + secrets.token_hex(3)
    _case(server, key)
    rid = server.admin.test_runs.create(test_case_ids=[key], agents=["noop"], repeat=2,
                                        name="assisted run")["test_run_id"]
    own, held = _attempts(server, rid)
    _finish(server, own.id, "passed")
    _assisted(server, held.id, "failed")
    progress = server.admin.test_runs.retrieve(rid)["progress"]
    assert progress["assisted"] == 1 and progress["failed"] == 0
    sign_in(page, server.member_key, f"/test_runs/{rid}")
    expect(page.get_by_role("heading", name="Run assisted run")).to_be_visible()
    expect(page.locator("dd .progress")).to_have_text(
        "2 attempts · 0 queued · 0 running · 1 passed · 0 failed · 0 error · 1 assisted")

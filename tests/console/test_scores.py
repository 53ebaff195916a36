"""The console shows scores (docs/agents.md, "Scores"): each attempt's on the run page and its own page
(with its checkpoints), and each agent's mean score in the run's results page."""

from __future__ import annotations

import secrets

from playwright.sync_api import Page, expect
from server.conftest import Server
from server.test_scores import _scored
from server.test_test_runs import _attempts, _case, _complete

from .conftest import sign_in


def test_the_run_page_shows_each_attempts_score_and_the_agents_mean(page: Page, server: Server) -> None:
    key = "scored-" + secrets.token_hex(3)
    _case(server, key)
    rid = server.admin.test_runs.create(test_case_ids=[key], agents=["noop"], repeat=2,
                                        name="scored run")["test_run_id"]
    half, parts = _attempts(server, rid)
    _scored(server, half.id, 0.5)
    _scored(server, parts.id, 0.75, checkpoints=[("check", 1.0, 1.0), ("files", 3.0, 2 / 3)])
    _complete(server, rid)
    sign_in(page, server.member_key, f"/test_runs/{rid}")
    expect(page.get_by_role("heading", name="Run scored run")).to_be_visible()
    expect(page.locator("dt:text-is('Mean score') + dd")).to_have_text("noop 0.625")
    row = page.get_by_role("row").filter(has_text=half.id)
    expect(row.get_by_role("cell", name="0.500")).to_be_visible()
    expect(page.get_by_role("row").filter(has_text=parts.id).get_by_role("cell", name="0.750")).to_be_visible()
    frame = page.frame_locator("iframe[title='Results page']")
    expect(frame.locator("#agents tr[data-agent='noop'] td.mean-score")).to_have_text("0.625")
    expect(frame.locator("#agent-rates .mean-score")).to_have_text(" · mean score 0.625")

    page.get_by_role("link", name=parts.id).click()
    expect(page.get_by_role("heading", name=f"Attempt {parts.id}")).to_be_visible()
    expect(page.locator("dd").filter(has_text="files 0.667 (weight 3)")).to_have_text(
        "check 1.000 (weight 1) · files 0.667 (weight 3)")
    expect(page.locator("dt:text-is('Score') + dd")).to_have_text("0.750")


def test_the_compare_page_pairs_scores(page: Page, server: Server) -> None:
    key = "paired-" + secrets.token_hex(3)
    _case(server, key)
    runs = [server.admin.test_runs.create(test_case_ids=[key], agents=["noop"], repeat=1)["test_run_id"]
            for _ in range(2)]
    for rid, value in zip(runs, (0.25, 0.75), strict=True):
        (a,) = _attempts(server, rid)
        _scored(server, a.id, value)
        _complete(server, rid)
    sign_in(page, server.member_key, f"/test_runs/compare?ids={runs[0]},{runs[1]}")
    expect(page.get_by_role("heading", name="Paired comparison")).to_be_visible()
    row = page.get_by_role("row").filter(has_text=runs[1])
    expect(row.get_by_role("cell", name="+0.500", exact=True)).to_be_visible()
    expect(row.get_by_role("cell", name="+0.500 to +0.500")).to_be_visible()

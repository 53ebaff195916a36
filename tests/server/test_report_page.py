# mypy: disable-error-code="arg-type,list-item,typeddict-item,misc,index"
"""The results page served by gh-server, in headless Chromium: it renders, its numbers are the API's,
flaky and broken cases are marked, the run is compared with the one before, and its links work. The
screenshot is kept in the test output dir (docs/report-page.png is one)."""

from __future__ import annotations

import html
import re

import httpx
import pytest

from gh_server.models import Attempt, TestCase

from .conftest import Server
from .test_test_runs import _attempts, _case, _complete, _finish

chromium = pytest.importorskip("e2e.chromium")


def test_report_page_in_chromium(server: Server, db_url: str | None) -> None:
    if chromium.chromium() is None:
        pytest.fail("chromium is not installed (scripts/setup.sh installs it)")
    c = server.admin
    suffix = "pg" if db_url else "lite"
    keys = [f"PG-{suffix}-1", f"PG-{suffix}-2"]
    for k in keys:
        _case(server, k)
    with server.state.db.begin() as s:  # as a validation run would have recorded it
        row = s.query(TestCase).filter(TestCase.key == keys[1]).one()
        row.validation = {"status": "broken", "runs": 4, "reasons": [], "at": "2026-12-01T00:00:00.000Z"}
    base = c.test_runs.create(test_case_ids=keys, agents=["noop", "reference"], repeat=2)["test_run_id"]
    for a in _attempts(server, base):
        _finish(server, a.id, "failed")
    _complete(server, base)
    rid = c.test_runs.create(test_case_ids=keys, agents=["noop", "reference"], repeat=2)["test_run_id"]
    ats = _attempts(server, rid)
    flaky_done = False
    for a in ats:
        if a.agent_id == "noop":
            _finish(server, a.id, "failed")
        elif not flaky_done and a.try_number == 2:
            _finish(server, a.id, "failed")  # one try of reference on the first case fails: flaky
            flaky_done = True
        else:
            _finish(server, a.id, "passed")
    _complete(server, rid)
    results = c.test_runs.results(rid)

    http = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"},
                        timeout=30)
    url = http.get(f"/v1/test_runs/{rid}/report_url").json()["url"]
    assert httpx.get(url.split("?")[0], timeout=30).status_code == 401  # no token, no key
    assert httpx.get(url.split("?")[0] + "?token=1.bad", timeout=30).status_code == 401
    assert httpx.get(url.replace(rid, base), timeout=30).status_code == 401  # a token opens its run only

    loaded = chromium.load(url, chromium.OUTPUT_DIR / f"report-page-{suffix}.png")
    dom = loaded.dom
    assert 'data-rendered="1"' in dom
    # Every cell's pass rate is the API's.
    for row in results["data"]:
        scored = row["passed"] + row["failed"]
        want = f"{100 * row['passed'] / scored:.1f}%"
        m = re.search(rf'data-case="{re.escape(row["key"])}" data-agent="{row["agent_id"]}">'
                      rf'<span class="rate">([^<]+)</span>', dom)
        assert m is not None and m.group(1) == want, (row["key"], row["agent_id"])
    for agent, a in results["by_agent"].items():
        m = re.search(rf'<tr data-agent="{agent}"><td>{agent}</td><td class="pass-rate">([^<]+)</td>', dom)
        assert m is not None and m.group(1) == f"{100 * a['pass_rate']:.1f}%"
        # The header gives each agent's rate; never one rate blended over agents.
        m = re.search(rf'<span class="agent-rate" data-agent="{agent}">{agent} <b>([^<]+)</b>', dom)
        assert m is not None and m.group(1) == f"{100 * a['pass_rate']:.1f}%", agent
    totals = re.search(r'<div id="totals">([^<]*)</div>', dom)
    assert totals is not None and "pass rate" not in totals.group(1) and "%" not in totals.group(1)
    # Each interval is drawn as an interval: a whisker from its low to its high end, the rate a dot on it.
    assert 'class="bar"' not in dom
    for row in results["data"]:
        cell = dom[dom.index(f'data-case="{row["key"]}" data-agent="{row["agent_id"]}"'):]
        cell = cell[:cell.index("</td>")]
        low, high = row["ci95"]
        m = re.search(r'<div class="ci" data-low="([^"]+)" data-high="([^"]+)" style="left: ([0-9.]+)%; '
                      r'width: ([0-9.]+)%;"', cell)
        assert m is not None, cell
        assert (float(m.group(1)), float(m.group(2))) == (low, high)
        assert abs(float(m.group(3)) - 100 * low) < 1e-6 and abs(float(m.group(4)) - 100 * (high - low)) < 1e-6
        assert 'class="pt"' in cell and f"95% CI {100 * low:.1f}% \u2013 {100 * high:.1f}%" in cell
    # The timeline has axes, with tick labels on both.
    assert 'data-axis="x"' in dom and 'data-axis="y"' in dom
    assert "time since the run started" in dom and "tries finished" in dom
    # No empty section: no error here, so no infrastructure errors section.
    assert re.search(r'<div id="sec-infra" hidden="">', dom), "an empty section is shown"
    assert dom.count('class="badge flaky"') == 1 + 1  # the legend's and the flaky cell's
    assert 'data-validation="broken"' in dom
    assert f">{base}</a> (baseline)" in dom
    # The links: each try to its replay, each run to its page.
    replay_links = [html.unescape(h) for h in re.findall(r'href="([^"]*/replay\?token=[^"]+)"', dom)]
    assert len(replay_links) == len(ats)
    r = httpx.get(replay_links[0], timeout=30)
    assert r.status_code == 200 and "<title>Replay" in r.text
    base_link = html.unescape(re.search(rf'href="([^"]*/v1/test_runs/{base}/report\?token=[^"]+)"', dom).group(1))
    assert httpx.get(base_link, timeout=30).status_code == 200
    # All inline: nothing from the network. (Not a search for "cdn": a random token in a link may hold it.)
    elsewhere = [u for u in re.findall(r'(?:src|href)="((?:https?:)?//[^"]*)"', dom)
                 if not u.startswith(str(server.base_url))]
    assert elsewhere == [] and "<script src=" not in dom, elsewhere
    # A key works too (the API's own auth).
    assert http.get(f"/v1/test_runs/{rid}/report").status_code == 200
    # A run still going: its queued tries say why they wait; a try the case broke is the case's error.
    waiting = c.test_runs.create(test_case_ids=keys[:1], agents=["noop"], repeat=2)["test_run_id"]
    first_try, _second = _attempts(server, waiting)
    _finish(server, first_try.id, "error")
    with server.state.db.begin() as s:
        row = s.get(Attempt, first_try.id)
        assert row is not None
        row.metrics = {**(row.metrics or {}), "error_phase": "check_before", "error_cause": "case"}
    link = http.get(f"/v1/test_runs/{waiting}/report_url").json()["url"]
    going = chromium.load(link, chromium.OUTPUT_DIR / f"report-page-waiting-{suffix}.png").dom
    assert 'class="hint waiting">queued: no runner is online' in going
    assert f'title="{first_try.id} error (your case)"' in going
    assert re.search(r'<td class="errors-case">1</td>', going) and '<div id="sec-case-errors">' in going
    assert re.search(r'<div id="sec-infra" hidden="">', going)  # no error of ours: that section is left out
    # The first run has no earlier run to compare with: no comparison section at all.
    first = chromium.load(html.unescape(base_link), chromium.OUTPUT_DIR / f"report-page-first-{suffix}.png").dom
    assert 'data-rendered="1"' in first
    assert re.search(r'<section id="sec-compare" hidden="">', first)

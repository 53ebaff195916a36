"""gh-server's /metrics: what a run through a simulated runner leaves in the series an operator watches."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gh_server.settings import ModelEndpoint

from .conftest import GwServer, await_for
from .fakehttp import serve
from .test_agents import connect


def samples(server: GwServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = httpx.get(server.base_url + "/metrics", headers={"Authorization": f"Bearer {server.admin_key}"},
                     timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(resp.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_count_leases_results_queue_judge_webhooks_and_db_pool(server_factory: Any) -> None:
    with serve(lambda p, b: (500, {"error": "overloaded"})) as (url, _):
        server: GwServer = server_factory(judge=ModelEndpoint(base_url=url + "/v1", model="judge"))
        async with httpx.AsyncClient(timeout=30) as c:  # deliveries that cannot go out are the backlog
            resp = await c.put(server.base_url + "/v1/webhook", headers={"Authorization": f"Bearer {server.admin_key}"},
                               json={"url": "http://127.0.0.1:9/nowhere", "events": ["test_run.completed"]})
            assert resp.status_code == 200, resp.text
            assert (await c.get(server.base_url + "/metrics")).status_code == 401  # Bearer, as everywhere
        r = await connect(server, slots=3)
        try:
            run_id, ids = server.add_run([{}, {}, {"success": {"check_script": "x", "rubric": "Polite."}}])
            leased = {(await r.expect("lease")).attempt_id for _ in range(3)}
            assert leased == set(ids)
            await r.finish(ids[0], "passed")
            await r.finish(ids[1], "failed", check_after="False")
            await r.finish(ids[2], "passed")  # the judge answers HTTP 500: an error (and a retry, leased again)
            server.add_run([{"runs_on": "gpu"}, {"runs_on": "gpu"}])  # no runner has the label: they wait
            m = samples(server)
            assert m[("gh_server_leases_total", ())] >= 3
            assert m[("gh_server_lease_latency_seconds_count", ())] >= 3
            assert m[("gh_server_results_applied_total", (("outcome", "passed"),))] == 1
            assert m[("gh_server_results_applied_total", (("outcome", "failed"),))] == 1
            assert m[("gh_server_results_applied_total", (("outcome", "error"),))] == 1
            assert m[("gh_server_queue_depth", (("label", "gpu"),))] == 2
            assert m[("gh_server_model_call_duration_seconds_count", (("kind", "judge"),))] == 1
            assert m[("gh_server_model_call_errors_total", (("kind", "judge"), ("reason", "error")))] == 1
            assert m[("gh_server_model_call_errors_total", (("kind", "customer"), ("reason", "timeout")))] == 0
            assert m[("gh_server_runners_connected", ())] == 1
            assert m[("gh_server_db_pool_size", ())] >= 1 and ("gh_server_db_pool_checked_out", ()) in m

            # The retry of the judged attempt fails the same way twice more; then the run completes and its
            # webhook cannot be delivered.
            for _ in range(2):
                retry = await r.expect("lease")
                await r.finish(retry.attempt_id, "passed")
            await await_for(lambda: server.run(run_id).status == "completed", what="run completed")
            await await_for(lambda: samples(server)[("gh_server_webhook_backlog", ())] == 1, what="backlog of 1")
        finally:
            await r.close()

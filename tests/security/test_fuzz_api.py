"""Property-based fuzzing of every endpoint in the server's own /openapi.json (schemathesis), with the
admin key and without one, with valid and invalid data: no 5xx, no response outside the schema, and
without a key no 2xx but from /healthz, /openapi.json and the replay assets (they take a signed token).

CI time is bounded: EXAMPLES per operation, mode and key, no shrinking, a deadline per example. The
operations are driven with schemathesis' Hypothesis strategies (`as_strategy`) rather than its pytest
plugin, which does not load under pytest 9.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from gateway.conftest import GwServer, make_settings, start_server, stop_server
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (  # type: ignore[attr-defined]  # names from schemathesis' check registry
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = 5
PUBLIC = re.compile(r"^/(healthz|openapi\.json)$|^/v1/attempts/[^/]+/replay(/.*)?$")
CHECKS = [response_schema_conformance, status_code_conformance, content_type_conformance,
          response_headers_conformance]
FUZZ = settings(max_examples=EXAMPLES, deadline=10_000, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck), database=None)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GwServer]:
    # As served for real (background loops on: the machine API needs the gateway's DB queue). No runner
    # connects, so fuzzed runs stay queued; a fuzzed webhook URL gets no private or loopback address.
    srv = start_server(make_settings(tmp_path_factory.mktemp("fuzz"), webhook_allow=[], webhook_timeout=2.0))
    yield srv
    stop_server(srv)


def _operations(api: GwServer) -> list[Any]:
    schema = schemathesis.openapi.from_url(api.base_url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) > 30, [op.label for op in ops]  # every resource and the machine API are in the schema
    return ops


def _modes(op: Any) -> list[GenerationMode]:
    """Invalid data only where there is something to get wrong: a body or query parameters. (A bare string
    path parameter has no invalid value, and Hypothesis spends hundreds of tries finding that out.)"""
    fields = op.get_request_payload_content_types() or [p for p in op.iter_parameters() if p.location == "query"]
    return [GenerationMode.POSITIVE, GenerationMode.NEGATIVE] if fields else [GenerationMode.POSITIVE]


def _fuzz(api: GwServer, key: str | None) -> list[str]:
    problems: list[str] = []
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for op in _operations(api):
        for mode in _modes(op):
            @FUZZ
            @given(case=op.as_strategy(generation_mode=mode))
            def one(case: Any) -> None:
                case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
                resp = case.call(headers=headers, timeout=30)
                where = f"{case.method} {case.formatted_path} ({mode.value}, {'key' if key else 'no key'})"  # noqa: B023 (called at once)
                assert resp.status_code < 500, f"{where}: {resp.status_code} {resp.text[:300]}"
                if key is None and 200 <= resp.status_code < 300:
                    assert PUBLIC.match(case.formatted_path), f"{where}: {resp.status_code} without a key"
                case.validate_response(resp, checks=CHECKS, headers=headers)

            try:
                one()
            except Unsatisfiable:
                continue  # no invalid value exists for this operation's inputs (e.g. string path params)
            except Exception as e:  # every operation is tried; the test lists every failure at the end
                problems.append(f"{op.label} [{mode.value}]: {str(e)[:600]}")
    return problems


def test_fuzz_every_endpoint_with_admin_key(api: GwServer) -> None:
    problems = _fuzz(api, api.admin_key)
    assert not problems, "\n\n".join(problems)


def test_fuzz_every_endpoint_without_a_key(api: GwServer) -> None:
    problems = _fuzz(api, None)
    assert not problems, "\n\n".join(problems)

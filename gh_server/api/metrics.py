"""`/metrics`: this process's Prometheus series (gh_server.metrics), for any API key (Bearer, as everywhere)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gh_server.api.common import Member, state_of
from gh_server.metrics import CONTENT_TYPE

router = APIRouter(tags=["Meta"])


@router.get("/metrics", summary="Prometheus metrics of this gh-server process", dependencies=[Member],
            response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
def metrics(request: Request) -> Response:
    return Response(state_of(request).metrics.render(), media_type=CONTENT_TYPE)

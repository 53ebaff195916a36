"""The /v1 Evals API: one module per resource, installed into the app by `install`."""

from __future__ import annotations

import importlib

from fastapi import FastAPI

from gh_server import errors
from gh_server.state import ServerState

_MODULES = (
    "meta", "test_cases", "test_sets", "test_runs", "runners", "start_states", "webhook", "keys", "metrics", "trust",
    "console", "attempt_steps",
)


def install(app: FastAPI, st: ServerState) -> None:
    errors.install(app)
    for name in _MODULES:
        app.include_router(importlib.import_module(f"gh_server.api.{name}").router)

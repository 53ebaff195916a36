"""Name -> implementation, filled by the metric and getter modules' decorators.

A metric is `f(result, expected, **options) -> float | bool`; a getter is `g(spec: dict) -> value` (a path
to a file in the guest, a text, a dict, ... as OSWorld's getter of that name returns). `load()` imports
every module once, so `python3 -m gh_osworld` pays for the libraries only when it evaluates.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, TypeVar

Metric = Callable[..., Any]
Getter = Callable[[dict[str, Any]], Any]
F = TypeVar("F", bound=Callable[..., Any])

METRICS: dict[str, Metric] = {}
GETTERS: dict[str, Getter] = {}


def metric(*names: str) -> Callable[[F], F]:
    def register(f: F) -> F:
        for name in names:
            if name in METRICS:
                raise RuntimeError(f"metric {name} is registered twice")
            METRICS[name] = f
        return f
    return register


def getter(*names: str) -> Callable[[F], F]:
    def register(f: F) -> F:
        for name in names:
            if name in GETTERS:
                raise RuntimeError(f"getter {name} is registered twice")
            GETTERS[name] = f
        return f
    return register


def load() -> None:
    """Import every module of gh_osworld.metrics and gh_osworld.getters (they register themselves)."""
    for package in ("gh_osworld.metrics", "gh_osworld.getters"):
        pkg = importlib.import_module(package)
        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"{package}.{info.name}")

"""Name -> implementation, filled by the metric and getter modules' decorators.

A metric is `f(result, expected, **options) -> float | bool`; a getter is `g(spec: dict) -> value` (a path
to a file in the guest, a text, a dict, ... as OSWorld's getter of that name returns). `load(...)` imports
the modules that implement the names a check uses (names.py says which), so a check pays only for the
libraries its metrics read with.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
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


def load(metrics: Iterable[str] | None = None, getters: Iterable[str] | None = None) -> None:
    """Import the modules that implement these names (None: every module); they register themselves.
    A name no module lists stays unregistered: the caller reports it."""
    from gh_osworld.names import GETTER_MODULES, METRIC_MODULES

    for table, wanted in ((METRIC_MODULES, metrics), (GETTER_MODULES, getters)):
        want = None if wanted is None else set(wanted)
        for module, names in table.items():
            if want is None or want & names:
                importlib.import_module(f"gh_osworld.{module}")

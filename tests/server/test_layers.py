"""gh_server's layers, kept so: each module imports only from its own layer or the ones below, and no
modules import one another in a cycle. Every import counts: top-level, inside functions, under
TYPE_CHECKING, and `importlib.import_module("...")` with a constant name.

    app       app.py, cli.py: the one place that wires everything together
    http      the routers (api/*) and the agents' machine API
    loops     the runner gateway, the scheduler loop (attempts.scheduler), the agent supervisor, the
              PostgreSQL relay, start-state housekeeping
    services  an attempt's life (attempts: matching, states, lease, completion, result intake), the
              start-state service, runner status, the rows a runner's session changes, webhook outbox,
              serialize, results, replays, auth, agents (base, registry, built-ins, external, models,
              grants), worker pools, the trust additions to results (trust, stats, calibration,
              validation, report_page)
    storage   state, ports (the Protocols a service needs of another), settings, errors, models, db,
              dbqueue, metrics

What a service needs from a loop or a router is a Protocol in `gh_server.ports`, passed in by app.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "gh_server"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("app", ("gh_server.app", "gh_server.cli")),
    ("http", ("gh_server.api", "gh_server.agents.machine_api")),
    ("loops", ("gh_server.gateway", "gh_server.attempts.scheduler", "gh_server.agents.supervisor", "gh_server.relay",
               "gh_server.start_state_jobs")),
    ("services", ("gh_server.attempts", "gh_server.start_states", "gh_server.runner_status", "gh_server.runner_rows",
                  "gh_server.webhooks", "gh_server.serialize", "gh_server.results",
                  "gh_server.replays", "gh_server.auth", "gh_server.agents", "gh_server.workpool",
                  "gh_server.trust", "gh_server.stats", "gh_server.calibration", "gh_server.validation",
                  "gh_server.report_page")),
    ("storage", ("gh_server.state", "gh_server.ports", "gh_server.settings", "gh_server.errors", "gh_server.models",
                 "gh_server.db", "gh_server.dbqueue", "gh_server.metrics", "gh_server")),
]
# None left: add none (a cycle is fixed by moving what both need down a layer, as `timestamps` was).
KNOWN_CYCLES: list[set[str]] = []


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest matching prefix (so agents.machine_api is http, agents is services)."""
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank >= 0, f"{module} is in no layer: add it to LAYERS in {__file__}"
    return rank


def modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        if "migrations" in p.relative_to(ROOT).parts:
            continue  # alembic scripts import the models; nothing imports them
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
                targets = [str(node.args[0].value)]
            graph[m] |= {t for t in targets if t in mods and t != m}
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
                  for m, targets in graph.items() for t in targets if layer_of(t) < layer_of(m))


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def test_no_module_imports_from_a_layer_above_it() -> None:
    assert upward_imports(import_graph()) == []


def test_no_import_cycles() -> None:
    assert [c for c in cycles(import_graph()) if c not in KNOWN_CYCLES] == []


def test_the_checks_catch_an_upward_import_and_a_cycle() -> None:
    graph = import_graph()
    assert "gh_server.gateway" in graph["gh_server.app"]  # the graph is real: app wires the gateway
    graph["gh_server.attempts.intake"].add("gh_server.api.start_states")  # a service reaching up into a router
    graph["gh_server.state"].add("gh_server.webhooks")  # ... and closing a loop through webhooks -> state
    assert upward_imports(graph)[:1] == [
        "gh_server.attempts.intake (services) imports gh_server.api.start_states (http)"]
    assert {"gh_server.state", "gh_server.webhooks"} in [c & {"gh_server.state", "gh_server.webhooks"}
                                                         for c in cycles(graph)]

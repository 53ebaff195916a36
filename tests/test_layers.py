"""The import graph of the whole repository, kept layered: every module of ours imports only from its
own layer or the ones below, and no modules import one another in a cycle. Every import counts:
top-level, inside functions, under TYPE_CHECKING, and `importlib.import_module("...")` with a
constant name.

Between packages, from the bottom (PACKAGES):

    gh_osworld             OSWorld's metrics and getters, run inside the guest: imports none of ours (the
                           guest has only it); the host imports its names
    gh_common              small helpers, importing none of ours: timeouts.py (the one timeout helper),
                           backoff.py (the one capped backoff), configfile.py (the one config file
                           reader), png.py (the PNG writer screenshots are encoded with)
    gh_wire                the runner<->server contract: protocol models, input events, screenshot masking
    providers              the machine providers (the interface, the manifest, QEMU/libvirt)
    imagebuilder           builds the images the providers start (image-builder/); imports providers
    gh_runner  gh_server   the two halves, PEERS: each imports the packages below, never the other
    gh_local               `gh-runner local`, validate, the case file, the report and the OSWorld importer,
                           above both halves

Inside a package, a module may import any other of the same package, unless the package has inner
layers of its own (INNER_LAYERS): gh_server's, listed in GH_SERVER_LAYERS below. There every module
must be in a layer: a module in none is an error (add it where it belongs), never a silent bottom.

gh_server's layers, from the top:

    app       app.py, cli.py: the one place that wires everything together
    http      the routers (api/*) and the agents' machine API
    loops     the runner gateway, the scheduler loop (attempts.scheduler), the agent supervisor, the
              PostgreSQL relay, start-state housekeeping
    services  an attempt's life (attempts: matching, states, lease, completion, result intake), the
              start-state service, runner status, the rows a runner's session changes, webhook outbox,
              serialize, results, replays, trajectories (exports), auth, agents (base, registry, built-ins,
              external, models, grants), worker pools, the trust additions to results (trust, stats, calibration,
              validation, report_page), runner_admin (make and revoke runner tokens)
    storage   state, ports (the Protocols a service needs of another), settings, errors, models, db,
              dbqueue, metrics, and the small helpers (ids, timestamps, egress, accesslog, bodylimit)

What a service needs from a loop or a router is a Protocol in `gh_server.ports`, passed in by app.py.

Not layered: tests/ and bench/ may import anything (they drive the packages from outside, and no
package imports them); gh_server/migrations (alembic scripts import the
models; nothing imports them); image-builder/build (a script, not a module).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Between packages, from the bottom. Packages in one entry are peers: neither imports the other.
PACKAGES: list[tuple[str, tuple[str, ...]]] = [
    ("guest", ("gh_osworld",)),
    ("common", ("gh_common",)),
    ("wire", ("gh_wire",)),
    ("providers", ("providers",)),
    ("imagebuilder", ("imagebuilder",)),
    ("halves", ("gh_runner", "gh_server")),
    ("local", ("gh_local",)),
]
# Where each package's top-level directory lives (the rest are at the repository's root).
PACKAGE_DIRS: dict[str, Path] = {"imagebuilder": REPO / "image-builder" / "imagebuilder"}
# Directories inside a package that are not modules of it.
NOT_MODULES: dict[str, tuple[str, ...]] = {"gh_server": ("migrations",)}

# gh_server's inner layers, from the top. A new module: add its dotted name (or a subpackage's, which
# covers everything under it) to the layer it belongs to; the longest matching name wins, so
# `gh_server.agents.machine_api` is http while the rest of `gh_server.agents` is a service. The
# package's own `gh_server` (its __init__) matches itself only.
GH_SERVER_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("app", ("gh_server.app", "gh_server.cli", "gh_server.listener")),
    ("http", ("gh_server.api", "gh_server.agents.machine_api", "gh_server.console_page", "gh_server.live.api",
              "gh_server.takeover.routes", "gh_server.fair_share")),
    ("loops", ("gh_server.gateway", "gh_server.attempts.scheduler", "gh_server.agents.supervisor",
               "gh_server.machine_relay", "gh_server.start_state_jobs", "gh_server.live.screen_relay")),
    ("services", ("gh_server.attempts", "gh_server.start_states", "gh_server.runner_status", "gh_server.runner_rows",
                  "gh_server.webhooks", "gh_server.serialize", "gh_server.results", "gh_server.counts",
                  "gh_server.replays", "gh_server.trajectories", "gh_server.auth", "gh_server.agents",
                  "gh_server.workpool",
                  "gh_server.trust", "gh_server.stats", "gh_server.calibration", "gh_server.validation",
                  "gh_server.report_page", "gh_server.runner_admin", "gh_server.queue_wait",
                  "gh_server.console_sessions", "gh_server.live.inputs", "gh_server.live.rfb",
                  "gh_server.live.tickets", "gh_server.live", "gh_server.takeover")),
    ("storage", ("gh_server.state", "gh_server.ports", "gh_server.settings", "gh_server.errors", "gh_server.models",
                 "gh_server.db", "gh_server.dbqueue", "gh_server.metrics", "gh_server.ids", "gh_server.timestamps",
                 "gh_server.egress", "gh_server.accesslog", "gh_server.bodylimit", "gh_server.yamlbody", "gh_server")),
]
INNER_LAYERS: dict[str, list[tuple[str, tuple[str, ...]]]] = {"gh_server": GH_SERVER_LAYERS}
# Add none (a cycle is fixed by moving what both need down a layer, as `timestamps` was). A found cycle
# within a known one passes; a known one no longer found fails, so the entry goes when its cycle does.
KNOWN_CYCLES: list[set[str]] = []


class NoLayer(Exception):
    """A module the layer tables do not place: a new module must be added where it belongs."""


def package_of(module: str) -> str:
    return module.partition(".")[0]


def package_rank(package: str) -> int:
    for i, (_, members) in enumerate(PACKAGES):
        if package in members:
            return i
    raise NoLayer(f"package {package} is in no layer: add it to PACKAGES in {__file__}")


def inner_layer(module: str) -> int | None:
    """The index in the package's inner layers of the longest matching name (top first), or None for a
    package without inner layers."""
    package = package_of(module)
    layers = INNER_LAYERS.get(package)
    if layers is None:
        return None
    best, rank = -1, -1
    for i, (_, names) in enumerate(layers):
        for name in names:
            covers = module == name or (name != package and module.startswith(name + "."))
            if covers and len(name) > best:
                best, rank = len(name), i
    if rank < 0:
        raise NoLayer(f"{module} is in no layer: add it to {package}'s layer table in {__file__}")
    return rank


def where(module: str) -> str:
    package = package_of(module)
    i = inner_layer(module)
    return PACKAGES[package_rank(package)][0] if i is None else f"{package} {INNER_LAYERS[package][i][0]}"


def unplaced(modules: Iterable[str]) -> list[str]:
    """The modules no table places, each with what to do about it."""
    out = []
    for m in sorted(modules):
        try:
            package_rank(package_of(m))
            inner_layer(m)
        except NoLayer as e:
            out.append(str(e))
    return out


def modules() -> dict[str, Path]:
    out = {}
    for _, members in PACKAGES:
        for package in members:
            root = PACKAGE_DIRS.get(package, REPO / package)
            assert (root / "__init__.py").is_file(), f"{root} is not the package {package}"
            for p in root.rglob("*.py"):
                rel = p.relative_to(root)
                if rel.parts[0] in NOT_MODULES.get(package, ()):
                    continue
                parts = (package, *rel.with_suffix("").parts)
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # `from pkg import sub` imports the module pkg.sub (pkg's __init__ runs first, as it does
                # for `import pkg.sub`, and neither counts); `from pkg import name` imports from pkg.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
                targets = [str(node.args[0].value)]
            graph[m] |= {t for t in targets if t in mods and t != m}
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module from a higher package (or a peer), or from a higher inner layer."""
    out = []
    for m, targets in graph.items():
        for t in targets:
            mine, theirs = package_of(m), package_of(t)
            if mine != theirs:
                up = package_rank(theirs) >= package_rank(mine)  # a peer is as wrong as a package above
            else:
                i, j = inner_layer(m), inner_layer(t)
                up = i is not None and j is not None and j < i
            if up:
                out.append(f"{m} ({where(m)}) imports {t} ({where(t)})")
    return sorted(out)


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


def test_every_module_is_in_a_layer() -> None:
    assert unplaced(modules()) == []


def test_no_module_imports_from_a_layer_above_it() -> None:
    assert upward_imports(import_graph()) == []


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert [c for c in found if not any(c <= known for known in KNOWN_CYCLES)] == []
    assert [known for known in KNOWN_CYCLES if not any(c & known for c in found)] == [], \
        "a known cycle is gone: delete it from KNOWN_CYCLES"


def test_the_graph_covers_every_package() -> None:
    graph = import_graph()
    assert {package_of(m) for m in graph} == {p for _, members in PACKAGES for p in members}
    # The graph is real: each kind of import is seen.
    assert "gh_server.gateway" in graph["gh_server.app"]  # top level
    assert "gh_server.webhooks" in graph["gh_server.attempts.completion"]  # importlib.import_module with a constant
    assert "gh_wire.protocol" in graph["gh_runner.daemon"]
    assert "providers.manifest" in graph["imagebuilder.pipeline"]
    assert {"gh_runner.daemon", "gh_server.app"} <= {t for t in graph["gh_local.local"]}


def test_the_checks_catch_an_upward_import_between_packages() -> None:
    graph = import_graph()
    graph["gh_wire.protocol"].add("gh_runner.daemon")  # the contract reaching up into one half
    graph["gh_server.attempts.intake"].add("gh_runner.jobs")  # one half importing its peer
    graph["gh_runner.jobs"].add("gh_server.state")  # ... and the other way
    graph["providers.base"].add("imagebuilder.qmp")  # a provider reaching up into the image builder
    assert upward_imports(graph) == [
        "gh_runner.jobs (halves) imports gh_server.state (gh_server storage)",
        "gh_server.attempts.intake (gh_server services) imports gh_runner.jobs (halves)",
        "gh_wire.protocol (wire) imports gh_runner.daemon (halves)",
        "providers.base (providers) imports imagebuilder.qmp (imagebuilder)",
    ]


def test_the_checks_catch_an_upward_import_and_a_cycle_inside_gh_server() -> None:
    graph = import_graph()
    graph["gh_server.attempts.intake"].add("gh_server.api.start_states")  # a service reaching up into a router
    graph["gh_server.state"].add("gh_server.webhooks")  # ... and closing a loop through webhooks -> state
    assert upward_imports(graph)[:1] == [
        "gh_server.attempts.intake (gh_server services) imports gh_server.api.start_states (gh_server http)"]
    assert {"gh_server.state", "gh_server.webhooks"} in [c & {"gh_server.state", "gh_server.webhooks"}
                                                         for c in cycles(graph)]


def test_the_checks_catch_a_cycle_between_packages() -> None:
    graph = import_graph()
    graph["gh_wire.protocol"].add("gh_local.local")  # gh_local.local -> gh_runner.daemon -> gh_wire.protocol
    assert any({"gh_wire.protocol", "gh_local.local", "gh_runner.daemon"} <= c for c in cycles(graph))


def test_a_module_in_no_layer_is_an_error() -> None:
    graph = import_graph()
    graph["gh_server.newthing"] = {"gh_server.state"}  # a module added to gh_server but to no layer
    assert unplaced(graph) == [
        f"gh_server.newthing is in no layer: add it to gh_server's layer table in {__file__}"]
    try:
        upward_imports(graph)
    except NoLayer as e:
        assert "gh_server.newthing" in str(e)
    else:
        raise AssertionError("a module in no layer passed the check")
    # A package in none is refused too.
    assert unplaced(["gh_newpackage.thing"]) == [
        f"package gh_newpackage is in no layer: add it to PACKAGES in {__file__}"]


# Modules that decide and never act: the runner's admission (whether a lease or job is taken, who
# holds the slots) and its result outbox (what to send, when again, what an ack clears). Their imports
# are held to pure modules, so the I/O (the disk, the journal's files, the socket, libvirt) stays with
# the daemon that gives it to them, and they are tested with plain values.
PURE_MODULES = ("gh_runner.admission", "gh_runner.outbox")
PURE_IMPORTS = ("__future__", "collections", "dataclasses", "enum", "re", "typing", "gh_wire")


def impure_imports(source: str) -> list[str]:
    """Every import in `source` (top-level or not) of a module outside PURE_IMPORTS."""
    out = []
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or "."] if isinstance(node, ast.ImportFrom) else [])
        out += [n for n in names if n.partition(".")[0] not in PURE_IMPORTS]
    return sorted(out)


def test_the_runners_admission_and_outbox_import_no_io() -> None:
    mods = modules()
    found = {m: impure_imports(mods[m].read_text(encoding="utf-8")) for m in PURE_MODULES}
    assert found == {m: [] for m in PURE_MODULES}


def test_the_purity_check_catches_an_io_import() -> None:
    assert impure_imports("import os\nfrom gh_runner.journal import Journal\nimport re\n") == [
        "gh_runner.journal", "os"]
    assert impure_imports("def f():\n    import asyncio\n") == ["asyncio"]

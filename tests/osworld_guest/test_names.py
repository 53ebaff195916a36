"""names.py, which the importer reads on the host, says exactly what the guest's package implements, and
under which module: the guest imports only the modules a check names."""

from __future__ import annotations

import json
from pathlib import Path

from gh_osworld import names

from .kit import check, make, metric, rule, verdict


def test_every_module_registers_exactly_its_listed_names(tmp_path: Path) -> None:
    out = tmp_path / "registered.json"
    make("import collections\nfrom gh_osworld import registry\nregistry.load()\n"
         "by = collections.defaultdict(lambda: [[], []])\n"
         "for i, table in enumerate((registry.METRICS, registry.GETTERS)):\n"
         "    for name, f in table.items():\n"
         "        by[f.__module__.split('.', 1)[1]][i].append(name)\n"
         "open(out, 'w').write(json.dumps(by))",
         tmp_path, out=str(out))
    registered = json.loads(out.read_text())
    listed = {m: [sorted(names.METRIC_MODULES.get(m, ())), sorted(names.GETTER_MODULES.get(m, ()))]
              for m in {*names.METRIC_MODULES, *names.GETTER_MODULES}}
    assert {m: [sorted(a), sorted(b)] for m, (a, b) in registered.items()} == listed


def test_a_check_imports_only_the_modules_its_names_need(tmp_path: Path) -> None:
    # A command's output compared with a rule: neither pandas nor the office modules are loaded.
    out = tmp_path / "modules.json"
    make("import sys\nfrom gh_osworld import registry\n"
         "registry.load(['exact_match'], ['vm_command_line', 'rule'])\n"
         "ours = sorted(m for m in sys.modules if m.startswith(('gh_osworld.', 'pandas', 'openpyxl')))\n"
         "open(out, 'w').write(json.dumps(ours))",
         tmp_path, out=str(out))
    loaded = json.loads(out.read_text())
    assert "gh_osworld.metrics.general" in loaded and "gh_osworld.getters.commands" in loaded
    assert not [m for m in loaded if m.startswith(("pandas", "openpyxl", "gh_osworld.metrics.table"))], loaded
    spec = check(metric("exact_match", {"type": "vm_command_line", "command": "echo hi", "shell": True},
                        rule(expected="hi\n")))
    assert verdict(spec, tmp_path) is True

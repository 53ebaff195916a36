"""names.py, which the importer reads on the host, says exactly what the guest's package implements."""

from __future__ import annotations

import json
from pathlib import Path

from gh_osworld import names

from .kit import make


def test_every_name_is_implemented_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "registered.json"
    make("from gh_osworld import registry\nregistry.load()\n"
         "open(out, 'w').write(json.dumps([sorted(registry.METRICS), sorted(registry.GETTERS)]))",
         tmp_path, out=str(out))
    metrics, getters = json.loads(out.read_text())
    assert set(metrics) == names.METRICS, (set(metrics) ^ names.METRICS)
    assert set(getters) == names.GETTERS, (set(getters) ^ names.GETTERS)

"""gh_osworld gives OSWorld's numbers: the pairs of fidelity_pairs.py, scored on the guest's Python, against
the numbers OSWorld's own package gave for the same files (fidelity_oracle.json, recorded by
bench/osworld_fidelity.py --write-oracle; no network here). One test per metric.

A pair on which OSWorld crashes has no number to compare (docs/osworld.md lists them): ours must still
give one (a crash of the agent's file is a score of 0 here, never no verdict).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .kit import GUEST_PYTHON, REPO, TIMEOUT_S, guest_env

ORACLE = json.loads((REPO / "tests" / "osworld_guest" / "fidelity_oracle.json").read_text(encoding="utf-8"))
PAIRS = REPO / "tests" / "osworld_guest" / "fidelity_pairs.py"
TOLERANCE = 1e-3  # bench/osworld_fidelity.py's


def _guest(mode: str, where: Path) -> Any:
    p = subprocess.run([GUEST_PYTHON, str(PAIRS), mode, str(where)], env=guest_env(), capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    where = tmp_path_factory.mktemp("fidelity")
    made = _guest("make", where)
    # the same bytes OSWorld scored: a generator or library that writes differently makes the oracle stale.
    # The oracle was recorded on the guest's pinned modules (image-builder/.../osworld-desktop/pypi.txt):
    # Debian's python-docx 0.8.11 or openpyxl 3.0.9 write other bytes (and read documents otherwise).
    changed = {k: (v, made["guest"].get(k)) for k, v in ORACLE["guest"].items() if made["guest"].get(k) != v}
    assert made["sha256"] == ORACLE["sha256"], (
        f"the pairs' files differ from those the oracle scored; the guest's libraries (recorded, here): "
        f"{changed}: install the image's pins (scripts/setup.sh) or run bench/osworld_fidelity.py --write-oracle")
    return made["pairs"], _guest("ours", where)


METRICS = sorted({k.split("/", 1)[0] for k in ORACLE["osworld"]})


@pytest.mark.parametrize("func", METRICS)
def test_osworld_numbers(scored: tuple[list[dict[str, Any]], dict[str, float | None]], func: str) -> None:
    pairs, ours = scored
    ids = [p["id"] for p in pairs if p["func"] == func]
    assert len(ids) >= 4
    off = []
    for i in ids:
        theirs = ORACLE["osworld"][i]
        if ours[i] is None:
            off.append(f"{i}: ours no verdict, OSWorld {theirs!r}")
        elif isinstance(theirs, dict):
            assert "crash" in theirs  # OSWorld has no number here; ours is the agent's 0
            assert ours[i] == 0.0, i
        elif abs(ours[i] - float(theirs or 0.0)) > TOLERANCE:
            off.append(f"{i}: ours {ours[i]!r}, OSWorld {theirs!r}")
    assert not off, "\n".join(off)

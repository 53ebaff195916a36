"""gh_osworld run exactly as the guest runs it, and the documents it judges made the same way.

The guest (osworld-desktop) runs `python3 -m gh_osworld SPEC.json` on Debian 12's python3 with Debian's
modules and the pins of image-builder/imagebuilder/assets/osworld-desktop/pypi.txt (python-docx, openpyxl,
python-pptx, PyMuPDF, rapidfuzz), which win over Debian's. This host is
Debian 12 too: scripts/setup.sh installs the same apt packages and puts the pinned PyPI modules in
GUEST_SITE. Nothing here runs in the venv: the venv's libraries are not the guest's.

    spec = check(metric("compare_csv", vm_file(tmp / "out.csv"), embedded(tmp / "gold.csv")))
    assert verdict(spec, tmp) is True          # Crash (an AssertionError) when it gives no verdict
    assert score(spec, tmp) == 0.5             # the number it printed
    assert "the check crashed" in crash(spec, tmp)
    make("import openpyxl; wb = openpyxl.Workbook(); wb.save(path)", tmp, path=str(tmp / "a.xlsx"))
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GUEST_PYTHON = "/usr/bin/python3"
GUEST_SITE = "/var/lib/gh-runner/guest-python"  # scripts/setup.sh
GUEST_MODULES = ("openpyxl", "docx", "pandas", "PIL", "lxml", "numpy", "xlsxwriter", "pptx", "pymupdf",
                 "rapidfuzz")
TIMEOUT_S = 120.0


class Crash(AssertionError):
    """The check gave no verdict (exit 1) where a verdict was expected; the message carries its stderr."""


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str

    def score(self) -> float:
        """The score as printed (gh_osworld/__main__.py: True 1, False 0, or a number between); Crash when
        the check gave none."""
        out = self.stdout.strip()
        if self.returncode != 0 or not out:
            raise Crash(f"exit {self.returncode}, stdout {out!r}, stderr:\n{self.stderr[-4000:]}")
        if out in ("True", "False"):
            return float(out == "True")
        try:
            value = float(out)
        except ValueError:
            raise Crash(f"stdout {out!r} is no score, stderr:\n{self.stderr[-4000:]}") from None
        if not 0.0 < value < 1.0:
            raise Crash(f"a score of {out!r} is printed as True or False, or lies between them")
        return value

    def verdict(self) -> bool:
        """True for a full score, as the pass rate counts it; Crash when the check gave none."""
        return self.score() == 1.0


def guest_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = f"{REPO}:{GUEST_SITE}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ in the checkout
    return env


def missing_modules() -> list[str]:
    """The guest's modules this host lacks (empty when scripts/setup.sh has run)."""
    code = ("import importlib.util, sys\n"
            f"print(' '.join(m for m in {GUEST_MODULES!r} if importlib.util.find_spec(m) is None))")
    p = subprocess.run([GUEST_PYTHON, "-c", code], env=guest_env(), capture_output=True, text=True,
                       timeout=TIMEOUT_S, check=True)
    return p.stdout.split()


# -- specs (gh_osworld/spec.py) --

def check(*metrics: dict[str, Any], conj: str = "and") -> dict[str, Any]:
    return {"conj": conj, "metrics": list(metrics)}


def metric(func: str, result: dict[str, Any] | None = None, expected: dict[str, Any] | None = None,
           **options: Any) -> dict[str, Any]:
    return {"func": func, "result": result, "expected": expected, "options": options}


def vm_file(path: Path | str) -> dict[str, Any]:
    """OSWorld's vm_file getter of a file in the machine (here: on this host)."""
    return {"type": "vm_file", "path": str(path), "dest": Path(path).name}


def embedded(path: Path | str) -> dict[str, Any]:
    """A file the importer fetched and embedded (OSWorld's cloud_file / cache_file)."""
    return {"type": "embedded_file", "path": str(path)}


def rule(**rules: Any) -> dict[str, Any]:
    return {"type": "rule", "rules": rules}


# -- running --

def run(spec: dict[str, Any], workdir: Path) -> Ran:
    """`python3 -m gh_osworld SPEC.json` in workdir, as the guest's check runs it."""
    path = workdir / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    p = subprocess.run([GUEST_PYTHON, "-m", "gh_osworld", str(path)], cwd=workdir, env=guest_env(),
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    return Ran(p.returncode, p.stdout, p.stderr)


def verdict(spec: dict[str, Any], workdir: Path) -> bool:
    return run(spec, workdir).verdict()


def score(spec: dict[str, Any], workdir: Path) -> float:
    return run(spec, workdir).score()


def crash(spec: dict[str, Any], workdir: Path) -> str:
    """Asserts the check gave no verdict (exit 1); its stderr."""
    r = run(spec, workdir)
    assert r.returncode == 1, f"expected no verdict, got exit {r.returncode} {r.stdout!r}\n{r.stderr[-4000:]}"
    return r.stderr


def make(snippet: str, workdir: Path, **values: Any) -> None:
    """Runs a generator snippet on the guest's Python (openpyxl, docx, pptx, pandas as the guest has them)
    in workdir; `values` (JSON-able) are its globals. Raises with the snippet's stderr when it fails."""
    prologue = "import json, sys\nglobals().update(json.loads(sys.argv[1]))\n"
    p = subprocess.run([GUEST_PYTHON, "-c", prologue + snippet, json.dumps(values)], cwd=workdir,
                       env=guest_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    if p.returncode != 0:
        raise RuntimeError(f"the generator snippet failed (exit {p.returncode}):\n{p.stderr[-4000:]}")

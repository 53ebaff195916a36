"""Running host tools with a timeout and an error that says what failed."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from .errors import BuildError


def run(
    argv: Sequence[str | Path],
    *,
    timeout: float,
    cwd: Path | None = None,
    input_bytes: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """Run a host command; a missing tool, a timeout or (with check) a failure becomes a BuildError."""
    args = [str(a) for a in argv]
    try:
        cp = subprocess.run(args, cwd=cwd, input=input_bytes, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise BuildError(f"{args[0]} is not installed (run scripts/setup.sh or apt-get install it)") from None
    except subprocess.TimeoutExpired:
        raise BuildError(f"{' '.join(args[:3])} … did not finish within {timeout:.0f} s") from None
    if check and cp.returncode != 0:
        err = cp.stderr.decode(errors="replace").strip() or cp.stdout.decode(errors="replace").strip()
        raise BuildError(f"{' '.join(args[:4])} … failed (exit {cp.returncode}): {err[-800:]}")
    return cp


def text(argv: Sequence[str | Path], *, timeout: float, cwd: Path | None = None) -> str:
    return run(argv, timeout=timeout, cwd=cwd).stdout.decode(errors="replace")

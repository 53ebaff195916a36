"""Command agents in tests run the way gh-server runs every command agent: with a uid of their own in
group gh-agent (gh_server.agents.sandbox). That uid cannot reach this checkout's venv (its interpreter
may live under /root, mode 0700) nor, wherever CI clones, maybe the checkout: so a test's agent is a
stdlib-only script run by the system python3, from a copy in a world-readable directory."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

AGENT_PYTHON = "/usr/bin/python3"  # Debian's (scripts/setup.sh installs python3)
_dir: Path | None = None


def agent_command(script: Path, *args: str) -> list[str]:
    global _dir
    if _dir is None:
        _dir = Path(tempfile.mkdtemp(prefix="gh-test-agents-", dir="/var/tmp"))
        _dir.chmod(0o755)
        atexit.register(shutil.rmtree, _dir, True)
    copy = _dir / script.name
    if not copy.exists():
        shutil.copyfile(script, copy)
        copy.chmod(0o644)
    return [AGENT_PYTHON, str(copy), *args]

"""Fixtures shared by the whole suite.

Area fixtures live in each folder's own conftest.py (tests/provider, tests/runner, tests/server,
tests/e2e, ...). This file holds only what every area needs: where the images are, and the check
that nothing is left behind in libvirt after the session. Helpers more than one folder needs (ports,
health waits, libvirt, scratch dirs, model-agent runs) are the test kit, tests/kit/.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kit.libvirt import domains, remove_domains

IMAGES_DIR = Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images"))
# The desktop tests' runner state dir when it is kept across runs (scripts/test.sh): its warm snapshots
# are a cache, like the images, not something a test left behind.
_KEPT_STATE = os.environ.get("GH_TEST_DESKTOP_STATE_DIR")
KEPT_WARM = Path(_KEPT_STATE) / "warm" if _KEPT_STATE else None
# `gh-runner local` keeps its runner's state in a temporary dir of its own unless told otherwise, so each run
# would boot linux-tiny again for its warm snapshot. The suite's local runs share this dir instead (a cache,
# like the images; subprocesses inherit it); the one test of the temporary dir runs without it.
LOCAL_STATE = Path(os.environ.setdefault("GH_RUNNER_STATE_DIR", "/var/tmp/gh-runner/local-state"))
KEPT_LOCAL_WARM = LOCAL_STATE / "warm"
# Every images dir is a cache, not a leftover: scripts/test.sh builds linux-desktop into its own while the
# suite runs, so on a host without it (a fresh one, or new build inputs) its disk is new during the session.
IMAGE_DIRS = [IMAGES_DIR, *(Path(os.environ[v]) for v in ("GH_DESKTOP_IMAGES_DIR", "GH_OSWORLD_IMAGES_DIR")
                            if os.environ.get(v))]


@pytest.fixture(scope="session")
def images_dir() -> Path:
    """The directory holding the built linux-tiny image (scripts/setup.sh builds it)."""
    if not (IMAGES_DIR / "linux-tiny" / "image.yaml").is_file():
        pytest.fail(f"no linux-tiny image in {IMAGES_DIR}: run scripts/setup.sh (or image-builder/build)")
    return IMAGES_DIR


# The leak check runs as session hooks rather than a fixture so that no folder can override it:
# whatever a test did, the whole run fails if a gh- domain or a new disk file is left behind.
_SCRATCH = Path("/var/tmp")
_session: dict[str, object] = {}
# The runner's own state dir when none is given (gh_runner/config.py, default_dirs): an operator's, never a
# test's. A test that lets a runner fall back on it leaves warm snapshots and a journal there for good.
_DEFAULT_STATE = Path("/var/lib/gh-runner/state") if os.geteuid() == 0 else None
_wrote_default_state: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    before = _DEFAULT_STATE is not None and _DEFAULT_STATE.exists()
    yield
    if _DEFAULT_STATE is not None and not before and _DEFAULT_STATE.exists():
        _wrote_default_state.append(item.nodeid)


def _new_disks(since: float) -> list[Path]:
    """qcow2/memory-image files written under /var/tmp during the run, outside the images dir and the
    kept warm snapshots."""
    found: list[Path] = []
    # os.walk, not Path.glob: it skips a directory removed while we look instead of raising.
    for root, _dirs, files in os.walk(_SCRATCH):
        for name in files:
            if not (name.endswith(".qcow2") or name == "memory.img"):
                continue
            p = Path(root) / name
            try:
                if (any(d in p.parents for d in IMAGE_DIRS) or KEPT_WARM in p.parents or KEPT_LOCAL_WARM in p.parents
                        or p.stat().st_mtime < since):
                    continue
            except OSError:
                continue  # removed while we looked
            found.append(p)
    return sorted(found)


def pytest_sessionstart(session: pytest.Session) -> None:
    _session["domains"] = set(domains("gh-"))
    _session["started"] = time.time()
    _session["disks"] = set(_new_disks(0.0))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if "started" not in _session or getattr(session.config, "workerinput", None) is not None:
        return
    left = sorted(set(domains("gh-")) - set(_session["domains"]))  # type: ignore[arg-type]
    disks = [d for d in _new_disks(float(_session["started"])) if d not in _session["disks"]]  # type: ignore[operator,arg-type]
    if not left and not disks and not _wrote_default_state:
        return
    # In CI nothing else runs on this host, so whatever is left is ours: clean it so the next run starts
    # clean. On a shared development host other people's machines may be running: only report.
    if os.environ.get("CI") or os.environ.get("GH_TEST_REAP"):
        remove_domains(left)
        for d in disks:
            d.unlink(missing_ok=True)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    msg = f"LEAK: the suite left libvirt domains {left} and disk files {[str(d) for d in disks][:20]} behind"
    if _wrote_default_state:
        msg += f"; the runner's default state dir {_DEFAULT_STATE} was made by {', '.join(_wrote_default_state)}"
    if reporter is not None:
        reporter.write_line(msg, red=True, bold=True)
    else:
        print(msg)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED

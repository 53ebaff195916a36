"""gh_osworld's tests: the package run on the guest's Python (kit.py), against documents the tests make."""

from __future__ import annotations

import pytest

from .kit import GUEST_SITE, missing_modules


@pytest.fixture(scope="session", autouse=True)
def guest_python() -> None:
    missing = missing_modules()
    if missing:
        pytest.fail(f"the guest's Python modules {missing} are missing here (in /usr/bin/python3's dist-packages "
                    f"and {GUEST_SITE}): run scripts/setup.sh")

"""Fixtures of the attempt tests: the provider double and a recording link (see fakes.py)."""

from __future__ import annotations

import pytest
from kit.libvirt import leak_check

from .fakes import FakeLink, FakeProvider, guest_scripts

OUR_DOMAINS = "gh-attempttest"  # the runner name the integration tests give their provider


@pytest.fixture
def provider() -> FakeProvider:
    p = FakeProvider()
    guest_scripts(p)
    return p


@pytest.fixture
def link() -> FakeLink:
    return FakeLink()


_no_domains_left_behind = leak_check(OUR_DOMAINS, "the attempt tests")

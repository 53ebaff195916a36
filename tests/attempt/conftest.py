"""Fixtures of the attempt tests: the provider double and a recording link (see fakes.py)."""

from __future__ import annotations

import pytest

from .fakes import FakeLink, FakeProvider, guest_scripts


@pytest.fixture
def provider() -> FakeProvider:
    p = FakeProvider()
    guest_scripts(p)
    return p


@pytest.fixture
def link() -> FakeLink:
    return FakeLink()

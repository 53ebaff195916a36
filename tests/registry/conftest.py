"""Registry fixtures: a plain registry, and one with htpasswd and TLS (its own CA), on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.server import RegistryProcess


@pytest.fixture
def plain_registry(tmp_path: Path) -> Iterator[RegistryProcess]:
    reg = RegistryProcess.start(tmp_path / "registry", auth=False)
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture
def secure_registry(tmp_path: Path) -> Iterator[RegistryProcess]:
    reg = RegistryProcess.start(tmp_path / "registry", auth=True)
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture(params=["plain", "htpasswd+tls"])
def registry(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RegistryProcess]:
    reg = RegistryProcess.start(tmp_path / "registry", auth=request.param != "plain")
    try:
        yield reg
    finally:
        reg.stop()

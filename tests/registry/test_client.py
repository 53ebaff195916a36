"""The OCI client against a real registry (docker-registry on loopback): plain, and htpasswd + TLS."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from gh_runner.registry import (
    DigestMismatch,
    Manifest,
    NotFound,
    Registry,
    RegistryAuthError,
    RegistryError,
    RegistryTimeouts,
    RegistryUnavailable,
    load_credentials,
    split_ref,
)
from registry.server import PASSWORD, USER, RegistryProcess


def client(reg: RegistryProcess, **kw: object) -> Registry:
    creds = load_credentials(reg.credentials_file, reg.url) if reg.credentials_file else None
    return Registry(reg.url, credentials=creds, ca_file=reg.ca_file, **kw)  # type: ignore[arg-type]


def blob(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


async def test_push_and_pull_round_trip_verified(registry: RegistryProcess, tmp_path: Path) -> None:
    # Small chunks force the chunked upload (PATCH) for the bigger blob, one PUT for the small one.
    async with client(registry, chunk_bytes=256 * 1024) as r:
        await r.ping()
        big = blob(tmp_path / "big", 1024 * 1024 + 17)
        small = blob(tmp_path / "small", 1000)
        d_big = await r.push_blob("gh/test", big, "application/x-test", {"name": "big"})
        d_small = await r.push_blob("gh/test", small, "application/x-test")
        assert d_big.digest == "sha256:" + hashlib.sha256(big.read_bytes()).hexdigest()
        m = Manifest("application/vnd.test", (d_big, d_small), {"k": "v"})
        digest = await r.push_manifest("gh/test", "v1", m)
        got_digest, got = await r.get_manifest("gh/test", "v1")
        assert got_digest == digest
        assert got.layers == m.layers and got.annotations["k"] == "v"
        out = tmp_path / "out"
        await r.pull_blob("gh/test", got.layers[0], out)
        assert out.read_bytes() == big.read_bytes()
        assert not (tmp_path / "out.partial").exists()


async def test_tampered_blob_is_refused_and_nothing_is_left(plain_registry: RegistryProcess, tmp_path: Path) -> None:
    async with client(plain_registry) as r:
        d = await r.push_blob("gh/test", blob(tmp_path / "b", 300_000), "application/x-test")
        data = plain_registry.blob_file(d.digest)
        raw = bytearray(data.read_bytes())
        raw[1000] ^= 0xFF  # same size, other bytes
        data.write_bytes(bytes(raw))
        out = tmp_path / "out"
        with pytest.raises(DigestMismatch) as e:
            await r.pull_blob("gh/test", d, out)
        assert e.value.expected == d.digest
        assert e.value.actual == "sha256:" + hashlib.sha256(raw).hexdigest()
        assert d.digest in str(e.value) and e.value.actual in str(e.value)
        assert not out.exists() and not (tmp_path / "out.partial").exists()


async def test_missing_manifest_is_not_found(plain_registry: RegistryProcess) -> None:
    async with client(plain_registry) as r:
        with pytest.raises(NotFound):
            await r.get_manifest("gh/nothing", "v1")


async def test_wrong_password_is_an_auth_error(secure_registry: RegistryProcess, tmp_path: Path) -> None:
    async with Registry(secure_registry.url, credentials=(USER, PASSWORD + "x"), ca_file=secure_registry.ca_file) as r:
        with pytest.raises(RegistryAuthError) as e:
            await r.ping()
        assert PASSWORD not in str(e.value)
    async with Registry(secure_registry.url, ca_file=secure_registry.ca_file) as r:
        with pytest.raises(RegistryAuthError, match="none are configured"):
            await r.ping()


async def test_unknown_ca_is_refused(secure_registry: RegistryProcess) -> None:
    async with Registry(secure_registry.url, credentials=(USER, PASSWORD)) as r:
        with pytest.raises(RegistryUnavailable):
            await r.ping()


async def test_registry_down_is_unavailable_within_the_bound(plain_registry: RegistryProcess) -> None:
    plain_registry.stop()
    async with client(plain_registry, timeouts=RegistryTimeouts(connect=1.0, io=1.0, call=2.0)) as r:
        with pytest.raises(RegistryUnavailable):
            await r.get_manifest("gh/test", "v1")


def test_credentials_files(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("alice:pw:with:colons\n")
    assert load_credentials(plain, "https://reg:5000") == ("alice", "pw:with:colons")
    docker = tmp_path / "config.json"
    import base64
    docker.write_text(json.dumps({"auths": {"reg:5000": {"auth": base64.b64encode(b"bob:pw").decode()},
                                            "other": {"username": "x", "password": "y"}}}))
    assert load_credentials(docker, "https://reg:5000") == ("bob", "pw")
    with pytest.raises(RegistryError, match="no auths entry for elsewhere:1"):
        load_credentials(docker, "https://elsewhere:1")
    bad = tmp_path / "bad"
    bad.write_text("no-colon-secret\n")
    with pytest.raises(RegistryError) as e:
        load_credentials(bad, "https://reg")
    assert "no-colon-secret" not in str(e.value)


def test_split_ref() -> None:
    assert split_ref("127.0.0.1:5000/gh/images/linux-tiny:abc") == ("127.0.0.1:5000", "gh/images/linux-tiny", "abc")
    assert split_ref("reg.lab/a/b@sha256:" + "0" * 64) == ("reg.lab", "a/b", "sha256:" + "0" * 64)
    with pytest.raises(ValueError):
        split_ref("linux-tiny")


async def test_a_cancelled_pull_leaves_nothing(plain_registry: RegistryProcess, tmp_path: Path) -> None:
    import asyncio

    async with client(plain_registry) as r:
        d = await r.push_blob("gh/test", blob(tmp_path / "big", 60 * 1024 * 1024), "application/x-test")
        out = tmp_path / "out"
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await r.pull_blob("gh/test", d, out)
        assert not out.exists() and not (tmp_path / "out.partial").exists()

"""`registry:` in the runner config (file, env twins) and doctor's registry check against a real registry."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gh_runner import doctor
from gh_runner.config import ConfigError, Registry, load_config
from registry.server import PASSWORD, USER, RegistryProcess


def test_registry_from_file_and_env_key_by_key(tmp_path: Path) -> None:
    f = tmp_path / "runner.yaml"
    f.write_text("registry:\n  url: https://reg.lab:5000/\n  repository: lab/gh\n  cache_mib: 1024\n")
    env = {"GH_RUNNER_REGISTRY_CREDENTIALS_FILE": "/etc/gh-runner/registry", "GH_RUNNER_REGISTRY_CACHE_MIB": "2048"}
    cfg = load_config(env=env, config_file=f)
    assert cfg.registry is not None
    assert cfg.registry.url == "https://reg.lab:5000"
    assert cfg.registry.repository == "lab/gh"
    assert cfg.registry.cache_mib == 2048  # env beats the file
    assert cfg.registry.credentials_file == Path("/etc/gh-runner/registry")
    only_env = load_config(env={"GH_RUNNER_REGISTRY_URL": "http://127.0.0.1:5000"})
    assert only_env.registry is not None and only_env.registry.repository == "gh-runner"
    assert load_config(env={}).registry is None


def test_the_slowest_rate_waited_for_is_a_setting_with_an_env_twin(tmp_path: Path) -> None:
    f = tmp_path / "runner.yaml"
    f.write_text("registry:\n  url: https://reg.lab:5000\n  min_mib_per_s: 2.5\n")
    assert (cfg := load_config(env={}, config_file=f)).registry is not None and cfg.registry.min_mib_per_s == 2.5
    env = {"GH_RUNNER_REGISTRY_MIN_MIB_PER_S": "40"}
    assert (cfg := load_config(env=env, config_file=f)).registry is not None and cfg.registry.min_mib_per_s == 40
    assert Registry(url="https://reg").min_mib_per_s == 5.0
    with pytest.raises(ConfigError, match="GH_RUNNER_REGISTRY_MIN_MIB_PER_S"):
        load_config(env={"GH_RUNNER_REGISTRY_URL": "https://reg", "GH_RUNNER_REGISTRY_MIN_MIB_PER_S": "0"})


@pytest.mark.parametrize("env, where", [
    ({"GH_RUNNER_REGISTRY_URL": "ftp://reg"}, "GH_RUNNER_REGISTRY_URL"),
    ({"GH_RUNNER_REGISTRY_URL": "https://reg", "GH_RUNNER_REGISTRY_REPOSITORY": "Upper/Case"},
     "GH_RUNNER_REGISTRY_REPOSITORY"),
    ({"GH_RUNNER_REGISTRY_URL": "http://reg.lab:5000"}, "not encrypted"),
])
def test_bad_registry_settings_are_refused_by_name(env: dict[str, str], where: str) -> None:
    with pytest.raises(ConfigError, match=where):
        load_config(env=env)


def test_unknown_registry_key_lists_the_allowed(tmp_path: Path) -> None:
    f = tmp_path / "runner.yaml"
    f.write_text("registry:\n  url: https://reg\n  pasword: x\n")
    with pytest.raises(ConfigError, match=r"registry\.pasword: unknown key; allowed keys: ca_file, cache_mib"):
        load_config(env={}, config_file=f)


def _ctx(reg: Registry) -> doctor.Context:
    return doctor.Context(SimpleNamespace(registry=reg), net_timeout=5.0)  # type: ignore[arg-type]


def test_doctor_names_bad_credentials(secure_registry: RegistryProcess, tmp_path: Path) -> None:
    good = Registry(url=secure_registry.url, credentials_file=secure_registry.credentials_file,
                    ca_file=secure_registry.ca_file)
    assert doctor.check_registry(_ctx(good)).status == "OK"
    wrong = tmp_path / "wrong"
    wrong.write_text(f"{USER}:not-{PASSWORD}\n")
    bad = good.model_copy(update={"credentials_file": wrong})
    c = doctor.check_registry(_ctx(bad))
    assert c.status == "FAIL" and "refused the credentials" in c.detail and str(wrong) in (c.fix or "")
    assert PASSWORD not in c.detail + (c.fix or "")
    no_ca = good.model_copy(update={"ca_file": None})
    c = doctor.check_registry(_ctx(no_ca))
    assert c.status == "FAIL" and "ca_file" in (c.fix or "")


def test_doctor_says_when_the_registry_is_down(plain_registry: RegistryProcess) -> None:
    ctx = _ctx(Registry(url=plain_registry.url))
    c = doctor.check_registry(ctx)
    assert c.status == "OK", c.detail
    plain_registry.stop()
    c = doctor.check_registry(ctx)
    assert c.status == "FAIL" and "cannot reach the registry" in c.detail


async def test_the_runner_says_at_start_that_the_registry_refused_its_credentials(
        secure_registry: RegistryProcess, tmp_path: Path) -> None:
    import asyncio

    from pydantic import SecretStr
    from runner.doubles import FakeProvider
    from runner.peer import Peer

    from gh_runner.config import RunnerConfig
    from gh_runner.daemon import Daemon

    wrong = tmp_path / "wrong"
    wrong.write_text(f"{USER}:not-{PASSWORD}\n")
    peer = Peer()
    await peer.start()
    try:
        cfg = RunnerConfig(server=peer.url, token=SecretStr(Peer.token), name="regcreds", state_dir=tmp_path / "s",
                           images_dir=tmp_path / "i", registry={"url": secure_registry.url, "credentials_file": wrong,
                                                                "ca_file": secure_registry.ca_file})
        d = Daemon(cfg, FakeProvider())
        task = asyncio.create_task(d.run())
        hello = await peer.wait_type("hello")
        assert hello.registry is None  # it serves what it holds, and is offered nothing to pull
        assert d.library_problem is not None and "refused the credentials" in d.library_problem
        assert PASSWORD not in d.library_problem
        d.request_stop()
        await asyncio.wait_for(task, 60)
    finally:
        peer.kill()
        await peer.stop()

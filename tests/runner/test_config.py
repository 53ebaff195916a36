"""Config: precedence flags > env > file > defaults, clear refusals, token sources, masking, defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from gh_runner.config import ConfigError, RunnerConfig, default_dirs, load_config, normalize_server_url

TOKEN = "gh_rn_secret_abcdef123456"


def _file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "runner.yaml"
    p.write_text(text)
    return p


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    cfg_file = _file(tmp_path, "slots: 3\nname: from-file\nlabels: [a, b]\nlog_format: json\ndrain_grace: 30\n")
    env = {"GH_RUNNER_SLOTS": "5", "GH_RUNNER_NAME": "from-env", "HOME": str(tmp_path)}
    cfg = load_config({"slots": 7}, env, cfg_file)
    assert cfg.slots == 7  # flag
    assert cfg.name == "from-env"  # env over file
    assert cfg.labels == ["a", "b"] and cfg.log_format == "json" and cfg.drain_grace == 30  # file
    assert cfg.libvirt_uri == "qemu:///system"  # default
    assert load_config({}, {"GH_RUNNER_LABELS": "lab, lenovo"}).labels == ["lab", "lenovo"]
    assert load_config({}, {"GH_RUNNER_CONFIG": str(cfg_file)}).slots == 3
    # A caller's defaults (gh-runner local's 2 slots) sit under the file, the env and the flags.
    assert load_config({}, {}, cfg_file, defaults={"slots": 2}).slots == 3
    assert load_config({}, {"HOME": str(tmp_path)}, defaults={"slots": 2}).slots == 2
    assert load_config({}, {"GH_RUNNER_SLOTS": "5"}, defaults={"slots": 2}).slots == 5


def test_unknown_keys_and_bad_values_name_the_key_and_what_is_allowed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_config({}, {}, _file(tmp_path, "slotz: 2\n"))
    assert "slotz: unknown key; allowed keys:" in str(e.value) and "slots" in str(e.value)
    assert str(tmp_path / "runner.yaml") in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config({}, {}, _file(tmp_path, "timeouts:\n  setup: 10\n  sertup: 3\n"))
    assert ("timeouts.sertup: unknown key; allowed keys: channel_back, check, machine, ready, screen, setup"
            in str(e.value))
    with pytest.raises(ConfigError) as e:
        load_config({}, {"GH_RUNNER_SLOTS": "many"})
    assert "GH_RUNNER_SLOTS" in str(e.value) and "'many'" in str(e.value)
    with pytest.raises(ConfigError, match="log_format: Input should be 'json' or 'console'"):
        load_config({"log_format": "xml"}, {})
    with pytest.raises(ConfigError, match="GH_RUNNER_INSECURE: 'maybe' is not a boolean"):
        load_config({}, {"GH_RUNNER_INSECURE": "maybe"})
    with pytest.raises(ConfigError, match="label 'a b'"):
        load_config({"labels": "a b"}, {})
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config({}, {}, _file(tmp_path, "slots: [\n"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config({}, {}, _file(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config({}, {}, tmp_path / "missing.yaml")


def test_token_sources_in_order_and_never_shown(tmp_path: Path) -> None:
    tf = tmp_path / "tok"
    tf.write_text(TOKEN + "-file\n")
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "gh-runner-token").write_text(TOKEN + "-cred")
    env = {"CREDENTIALS_DIRECTORY": str(creds)}
    assert load_config({}, env).token_value() == TOKEN + "-cred"
    assert load_config({}, {**env, "GH_RUNNER_TOKEN_FILE": str(tf)}).token_value() == TOKEN + "-file"
    assert load_config({"token_file": str(tf)}, env).token_value() == TOKEN + "-file"
    assert load_config({}, {**env, "GH_RUNNER_TOKEN": TOKEN + "-env"}).token_value() == TOKEN + "-env"
    cfg = load_config({"token": TOKEN}, {**env, "GH_RUNNER_TOKEN": TOKEN + "-env"})
    assert cfg.token_value() == TOKEN
    for shown in (repr(cfg), str(cfg), cfg.model_dump_json()):
        assert TOKEN not in shown
    with pytest.raises(ConfigError) as e:
        load_config({"token_file": str(tmp_path / "nope")}, {})
    assert "cannot read token file" in str(e.value)
    with pytest.raises(ConfigError, match="token: required"):
        load_config({}, {}).token_value()


def test_server_urls(tmp_path: Path) -> None:
    assert normalize_server_url("https://gh.example.com") == "wss://gh.example.com/v1/runners/connect"
    assert normalize_server_url("wss://gh.example.com/custom/path") == "wss://gh.example.com/custom/path"
    assert normalize_server_url("http://127.0.0.1:8700/") == "ws://127.0.0.1:8700/v1/runners/connect"
    with pytest.raises(ConfigError, match="must start with wss://"):
        load_config({"server": "ftp://x"}, {})
    with pytest.raises(ConfigError, match="server: required"):
        RunnerConfig().connect_url()


def test_several_servers_comma_separated_repeated_or_a_yaml_list(tmp_path: Path) -> None:
    one = load_config({"server": "https://gh.example.com"}, {})
    assert one.server == "wss://gh.example.com/v1/runners/connect"  # the bare form reads as before
    assert one.connect_urls() == [one.connect_url()]
    a, b = "wss://a.example.com/v1/runners/connect", "wss://b.example.com/v1/runners/connect"
    assert load_config({"server": ["https://a.example.com", "https://b.example.com"]}, {}).connect_urls() == [a, b]
    assert load_config({}, {"GH_RUNNER_SERVER": "https://a.example.com, wss://b.example.com"}).connect_urls() == [a, b]
    cfg = load_config({}, {}, _file(tmp_path, "server:\n  - https://a.example.com\n  - https://b.example.com\n"))
    assert cfg.connect_urls() == [a, b]
    with pytest.raises(ConfigError, match="is not encrypted"):
        load_config({"server": ["wss://a.example.com", "ws://b.example.com"]}, {}).check_transport()
    with pytest.raises(ConfigError, match="must start with wss://"):
        load_config({"server": "https://a.example.com,ftp://b"}, {})


def test_default_dirs_for_a_user_follow_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr("gh_runner.config.SERVICE_DIR", tmp_path / "no-such-service-dir")
    images, state = default_dirs({"HOME": "/home/u"})
    assert images == Path("/home/u/.local/share/gh-runner/images")
    assert state == Path("/home/u/.local/state/gh-runner")
    images, state = default_dirs({"HOME": "/home/u", "XDG_DATA_HOME": "/d", "XDG_STATE_HOME": "/s"})
    assert (images, state) == (Path("/d/gh-runner/images"), Path("/s/gh-runner"))
    monkeypatch.setattr("gh_runner.config.SERVICE_DIR", tmp_path)  # exists and writable: the service user
    assert default_dirs({"HOME": "/home/u"}) == (tmp_path / "images", tmp_path / "state")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr("gh_runner.config.SERVICE_DIR", Path("/var/lib/gh-runner"))
    assert default_dirs({"HOME": "/root"})[0] == Path("/var/lib/gh-runner/images")


def test_the_shipped_example_config_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "systemd" / "config.example.yaml"
    if not example.exists():
        pytest.skip("no systemd/config.example.yaml in this tree")
    cfg = load_config({}, {}, example)
    assert cfg.server is not None and cfg.server.startswith("wss://")


def test_backoff_bounds_must_be_ordered() -> None:
    with pytest.raises(ConfigError, match="reconnect_min"):
        load_config({"reconnect_min": 30, "reconnect_max": 5}, {})


def test_server_flag_repeated_and_comma_separated() -> None:
    from gh_runner.cli import _config_from, build_parser

    args = build_parser().parse_args(["--server", "https://a.example.com,https://b.example.com",
                                      "--server", "https://c.example.com"])
    assert [u.split("/")[2] for u in _config_from(args).connect_urls()] == ["a.example.com", "b.example.com",
                                                                           "c.example.com"]

"""gh_common.configfile: the one config file reader the runner and gh-server share."""

from __future__ import annotations

from pathlib import Path

import pytest

from gh_common.configfile import ConfigFileError, read_mapping


def _file(tmp_path: Path, text: str | bytes, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def test_a_mapping_with_either_spelling_of_its_keys(tmp_path: Path) -> None:
    assert read_mapping(_file(tmp_path, "drain-grace: 5\nslots: 2\ntimeouts: {task-grace: 1}\n")) == {
        "drain_grace": 5, "slots": 2, "timeouts": {"task-grace": 1}}  # top-level keys only: the models own the rest
    assert read_mapping(_file(tmp_path, '{"port": 9001, "public-url": "http://x"}', "c.json")) == {
        "port": 9001, "public_url": "http://x"}
    assert read_mapping(_file(tmp_path, "# nothing yet\n")) == {}


@pytest.mark.parametrize(("text", "problem"), [
    ("slots: [\n", "not valid YAML: expected the node content, but found '<stream end>' (line 2, column 1)"),
    ("- a\n- b\n", "must be a mapping of keys to values, not list"),
    ("just words\n", "must be a mapping of keys to values, not str"),
    (b"slots: \xff\n", "not UTF-8 text (byte 7)"),
])
def test_a_file_that_is_not_a_mapping_is_named_with_its_problem(tmp_path: Path, text: str | bytes,
                                                                 problem: str) -> None:
    p = _file(tmp_path, text)
    with pytest.raises(ConfigFileError) as e:
        read_mapping(p)
    assert str(e.value) == f"config file {p}: {problem}"
    assert isinstance(e.value, ValueError) and e.value.path == p and e.value.problem == problem


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match=r"missing.yaml: cannot read it: No such file or directory$"):
        read_mapping(str(tmp_path / "missing.yaml"))

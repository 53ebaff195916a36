"""The cases file of `gh-runner local`: the shipped examples load, and bad files are refused with a
message that names the case and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gh_local.casefile import CaseFileError, load_case_file, parse_agents, parse_repeat

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "linux-basics.yaml"


def test_examples_load_with_every_case_validated() -> None:
    cf = load_case_file(EXAMPLES)
    assert len(cf.cases) >= 6
    assert cf.agents == ["noop", "reference"] and cf.repeat == 2
    for c in cf.cases:
        assert c["start_state"] == "linux-tiny"
        assert c["limits"]["minutes"] <= 2
        assert c["metadata"]["reference_fix"].strip()
        assert "True" in c["success"]["check_script"] and "False" in c["success"]["check_script"]
    asks = [c for c in cf.cases if "GH_AGENT_ANSWER" in c["success"]["check_script"]]
    assert asks and all(c["metadata"].get("reference_answer") for c in asks)


def _write(tmp_path: Path, data: object, name: str = "cases.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if name.endswith(".yaml") else json.dumps(data))
    return p


GOOD = {"key": "K-1", "name": "n", "prompt": "p", "start_state": "linux-tiny",
        "success": {"check_script": "echo False"}}


def test_json_is_accepted(tmp_path: Path) -> None:
    cf = load_case_file(_write(tmp_path, {"cases": [GOOD], "agents": "noop, reference", "repeat": 3}, "c.json"))
    assert cf.keys == ["K-1"] and cf.agents == ["noop", "reference"] and cf.repeat == 3


@pytest.mark.parametrize(("case", "expected"), [
    ({**GOOD, "limits": {"minutes": 0}}, "case 'K-1' (cases[1]): field limits.minutes"),
    ({**GOOD, "success": {}}, "case 'K-1' (cases[1]): field success"),
    ({k: v for k, v in GOOD.items() if k != "prompt"}, "case 'K-1' (cases[1]): field prompt"),
    ({**GOOD, "key": None, "start_state": ""}, "cases[1]: field start_state"),
    ({**GOOD, "colour": "red"}, "field colour"),
    ({**GOOD, "key": "tc_x"}, "field key"),
])
def test_bad_case_names_the_case_and_field(tmp_path: Path, case: dict, expected: str) -> None:
    other = {**GOOD, "key": "K-0"}
    with pytest.raises(CaseFileError) as e:
        load_case_file(_write(tmp_path, {"cases": [other, case]}))
    assert expected in str(e.value)


def test_duplicate_keys_and_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(CaseFileError, match=r"cases\[1\]\): field key: 'K-1' is also cases\[0\]'s key"):
        load_case_file(_write(tmp_path, {"cases": [GOOD, GOOD]}))
    with pytest.raises(CaseFileError, match="'cases:' must be a non-empty list"):
        load_case_file(_write(tmp_path, {"cases": []}))
    with pytest.raises(CaseFileError, match="unknown top-level key"):
        load_case_file(_write(tmp_path, {"cases": [GOOD], "tries": 2}))
    with pytest.raises(CaseFileError, match="repeat: must be a whole number"):
        load_case_file(_write(tmp_path, {"cases": [GOOD], "repeat": 0}))
    with pytest.raises(CaseFileError, match="no such file"):
        load_case_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cases: [\n")
    with pytest.raises(CaseFileError, match="not valid YAML"):
        load_case_file(bad)


def test_agent_and_repeat_flags() -> None:
    assert parse_agents("noop,reference,noop", "--agents") == ["noop", "reference"]
    with pytest.raises(CaseFileError, match="--agents"):
        parse_agents("noop,bad agent", "--agents")
    assert parse_repeat(20, "--repeat") == 20
    with pytest.raises(CaseFileError, match="--repeat"):
        parse_repeat(21, "--repeat")

"""Reading OSWorld tasks: a file, a directory (domains from the layout), an index with its examples, and
bad input named by file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gh_local.osworld.task import TaskFileError, load_tasks

from .conftest import task, write_task


def test_a_task_file_with_every_field(tmp_path: Path) -> None:
    data = task(id="0b17a146-2934-46c7-8727-73ff6b6483e8", related_apps=["os", "terminal"], proxy=False,
                trajectory="trajectories/", config=[{"type": "sleep", "parameters": {"seconds": 1}}])
    (loaded,) = load_tasks([write_task(tmp_path, data)])
    t = loaded.task
    assert (t.id, t.snapshot, t.source, t.related_apps) == (data["id"], "os", "tests", ["os", "terminal"])
    assert (t.config[0].type, t.config[0].parameters) == ("sleep", {"seconds": 1})
    (call,) = t.evaluator.calls()
    assert call.func == "exact_match" and call.result is not None and call.result.type == "vm_command_line"
    assert call.result.params == {"command": "echo hi", "shell": True}
    assert loaded.domain is None


def test_lists_of_metrics_line_up_with_their_getters(tmp_path: Path) -> None:
    ev = {"func": ["exact_match", "check_include_exclude"], "conj": "or",
          "result": [{"type": "vm_command_line", "command": "a"}, {"type": "vm_file", "path": "/p"}],
          "expected": [{"type": "rule", "rules": {"expected": "x"}}, {"type": "rule", "rules": {"include": ["y"]}}],
          "options": [{}, {"k": 1}]}
    (loaded,) = load_tasks([write_task(tmp_path, task(evaluator=ev))])
    calls = loaded.task.evaluator.calls()
    assert [c.func for c in calls] == ["exact_match", "check_include_exclude"]
    assert [c.options for c in calls] == [{}, {"k": 1}]
    assert loaded.task.evaluator.conj == "or"


def test_a_directory_in_osworlds_layout_gives_domains_and_passes_over_other_json(tmp_path: Path) -> None:
    root = tmp_path / "evaluation_examples"
    write_task(root / "examples" / "os", task(id="a"))
    write_task(root / "examples" / "vs_code", task(id="b"))
    (root / "settings").mkdir()
    (root / "settings" / "google.json").write_text(json.dumps({"email": "x", "password": "y"}))
    (root / "test_all.json").write_text(json.dumps({"os": ["a"], "vs_code": ["b"]}))
    loaded = load_tasks([root])
    assert [(t.task.id, t.domain) for t in loaded] == [("a", "os"), ("b", "vs_code")]


def test_an_index_reads_its_examples_and_names_a_missing_one(tmp_path: Path) -> None:
    write_task(tmp_path / "examples" / "os", task(id="a"))
    write_task(tmp_path / "examples" / "gimp", task(id="b"))
    index = tmp_path / "test_small.json"
    index.write_text(json.dumps({"gimp": ["b"], "os": ["a"]}))
    assert [(t.task.id, t.domain) for t in load_tasks([index])] == [("b", "gimp"), ("a", "os")]
    assert len(load_tasks([index, tmp_path / "examples"])) == 2  # each file once
    index.write_text(json.dumps({"os": ["a", "zzz"]}))
    with pytest.raises(TaskFileError, match=r"lists os/zzz, but .*examples/os/zzz.json does not exist"):
        load_tasks([index])


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON"),
    (json.dumps(task(instruction="")), "field instruction: String should have at least 1 character"),
    (json.dumps({k: v for k, v in task().items() if k != "evaluator"}), "field evaluator: Field required"),
    (json.dumps(task(evaluator={"func": ["exact_match", "exact_match"], "result": [{"type": "vm_file"}]})),
     "field evaluator: result: 1 entries for 2 metrics in func"),
    (json.dumps(task(evaluator={"func": "exact_match", "conj": "xor"})), "field evaluator.conj: Input should be"),
    (json.dumps(task(config=[{"parameters": {}}])), "field config.0.type: Field required"),
    (json.dumps([1, 2]), "neither an OSWorld task"),
])
def test_bad_input_names_the_file_and_the_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TaskFileError) as e:
        load_tasks([path])
    assert str(e.value).startswith(f"{path}: ")
    assert message in str(e.value)


def test_a_malformed_task_in_a_directory_stops_the_whole_read(tmp_path: Path) -> None:
    write_task(tmp_path / "os", task(id="good"))
    (tmp_path / "os" / "bad.json").write_text(json.dumps(task(id="")))
    with pytest.raises(TaskFileError, match=r"bad\.json: field id"):
        load_tasks([tmp_path])


def test_nothing_found_and_a_missing_path_are_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="no OSWorld task found"):
        load_tasks([tmp_path])
    with pytest.raises(TaskFileError, match=r"nope\.json: no such file"):
        load_tasks([tmp_path / "nope.json"])

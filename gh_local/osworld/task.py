"""The OSWorld task format, and where tasks are found.

A task (OSWorld's `evaluation_examples/examples/<domain>/<id>.json`):
`{id, snapshot, instruction, source, related_apps, config: [{type, parameters}], evaluator: {func, conj,
result, expected, options, postconfig}}`. `func` is a name or a list of names; with a list, `result`,
`expected` and `options` are lists beside it. Fields we do not use (trajectory, proxy, ...) are allowed.

Where: a task file; a directory (walked; `<domain>/<id>.json` gives the domain; JSON files that are not
tasks, such as OSWorld's settings, are passed over); or an index such as OSWorld's `test_all.json`
(`{domain: [id, ...]}`, its tasks in `examples/<domain>/<id>.json` beside it). A file that is a task but
malformed is an error naming the file and the field: nothing is imported from a half-read benchmark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class TaskFileError(Exception):
    """Input that cannot be read as OSWorld tasks; the message names the file and what is wrong."""


class _Open(BaseModel):
    # OSWorld's files carry fields this importer does not read (trajectory, proxy, fixed_ip, ...).
    model_config = ConfigDict(extra="allow")


class ConfigStep(_Open):
    """One step of `config` or `postconfig`: a type and its parameters."""

    type: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)


class Getter(_Open):
    """A getter's spec (`result` or `expected`): its type and its own keys (command, path, rules, ...)."""

    type: str = Field(min_length=1)

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


@dataclass(frozen=True)
class MetricCall:
    """One metric of an evaluator with the getters and options beside it."""

    func: str
    result: Getter | None
    expected: Getter | None
    options: dict[str, Any]


class Evaluator(_Open):
    func: str | list[str]
    conj: Literal["and", "or"] = "and"
    result: Getter | list[Getter | None] | None = None
    expected: Getter | list[Getter | None] | None = None
    options: dict[str, Any] | list[dict[str, Any] | None] | None = None
    postconfig: list[ConfigStep] = Field(default_factory=list)

    @model_validator(mode="after")
    def _lists_line_up(self) -> Evaluator:
        if isinstance(self.func, list):
            if not self.func:
                raise ValueError("func: an empty list of metrics")
            for name in ("result", "expected", "options"):
                v = getattr(self, name)
                if isinstance(v, list) and len(v) != len(self.func):
                    raise ValueError(f"{name}: {len(v)} entries for {len(self.func)} metrics in func")
        else:
            for name in ("result", "expected", "options"):
                if isinstance(getattr(self, name), list):
                    raise ValueError(f"{name}: a list, but func is one metric")
        return self

    def calls(self) -> list[MetricCall]:
        """The metrics with their getters and options, one per func, in order."""
        funcs = self.func if isinstance(self.func, list) else [self.func]

        def nth(v: Any, i: int) -> Any:
            # A single spec beside a list of funcs is not OSWorld's shape; the validator refused it.
            return v[i] if isinstance(v, list) else v

        return [MetricCall(func=f, result=nth(self.result, i), expected=nth(self.expected, i),
                           options=nth(self.options, i) or {}) for i, f in enumerate(funcs)]


class Task(_Open):
    id: str = Field(min_length=1)
    snapshot: str | None = None
    instruction: str = Field(min_length=1)
    source: str | list[str] | None = None  # a URL, or a few (one task of OSWorld's has a list)
    related_apps: list[str] = Field(default_factory=list)
    config: list[ConfigStep] = Field(default_factory=list)
    evaluator: Evaluator


@dataclass(frozen=True)
class LoadedTask:
    task: Task
    path: Path
    domain: str | None  # from the index or the <domain>/<id>.json layout; None when neither says


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskFileError(f"{path}: cannot read it: {e}") from None
    except json.JSONDecodeError as e:
        raise TaskFileError(f"{path}: not valid JSON: {e}") from None


def _is_index(data: Any) -> bool:
    return (isinstance(data, dict) and bool(data) and "instruction" not in data
            and all(isinstance(v, list) and all(isinstance(i, str) for i in v) for v in data.values()))


def _looks_like_task(data: Any) -> bool:
    return isinstance(data, dict) and ("instruction" in data or "evaluator" in data)


def _parse(path: Path, data: Any, domain: str | None) -> LoadedTask:
    if not isinstance(data, dict):
        raise TaskFileError(f"{path}: a task must be a JSON object, not {type(data).__name__}")
    try:
        task = Task.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "(the task)"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        raise TaskFileError(f"{path}: field {where}: {msg}") from None
    return LoadedTask(task=task, path=path, domain=domain)


def _from_index(path: Path, index: dict[str, list[str]]) -> list[LoadedTask]:
    examples = path.parent / "examples"
    out = []
    for domain, ids in index.items():
        for task_id in ids:
            file = examples / domain / f"{task_id}.json"
            if not file.is_file():
                raise TaskFileError(f"{path}: lists {domain}/{task_id}, but {file} does not exist")
            out.append(_parse(file, _read_json(file), domain))
    return out


def _from_dir(root: Path) -> list[LoadedTask]:
    out = []
    for file in sorted(root.rglob("*.json")):
        data = _read_json(file)
        if not _looks_like_task(data):
            continue  # an index (its tasks are found by the walk) or OSWorld's settings files
        out.append(_parse(file, data, file.parent.name if file.parent != root else None))
    return out


def load_tasks(paths: list[Path]) -> list[LoadedTask]:
    """Every task under `paths`, in order, each file once; raise TaskFileError on the first bad input."""
    found: list[LoadedTask] = []
    for path in paths:
        if path.is_dir():
            found.extend(_from_dir(path))
            continue
        data = _read_json(path)
        if _is_index(data):
            found.extend(_from_index(path, data))
        elif _looks_like_task(data):
            found.append(_parse(path, data, None))
        else:
            raise TaskFileError(f"{path}: neither an OSWorld task (id, instruction, evaluator) nor an index "
                                "({domain: [task id, ...]})")
    seen: set[Path] = set()
    unique = []
    for t in found:
        p = t.path.resolve()
        if p not in seen:
            seen.add(p)
            unique.append(t)
    if not unique:
        raise TaskFileError(f"no OSWorld task found in {', '.join(map(str, paths))}")
    return unique

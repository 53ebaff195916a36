"""The cases file of `gh-runner local`: YAML (or JSON) with `cases:` in the API's test-case shape,
and optional `agents:` and `repeat:`.

Checked here with the API's own request model before anything starts, so a bad file fails in a
second with a message naming the case (its key, or its position) and the field, and no machine is
ever made for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

MAX_REPEAT = 20
_AGENT_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_TOP_KEYS = {"cases", "agents", "repeat", "name"}


class CaseFileError(Exception):
    """A cases file that cannot be run as written; the message says where and what."""


@dataclass(frozen=True)
class CaseFile:
    path: Path
    cases: list[dict[str, Any]]
    agents: list[str] | None = None
    repeat: int | None = None
    name: str | None = None
    keys: list[str] = field(default_factory=list)  # each case's key, or "cases[i]" when it has none


def parse_agents(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [p.strip() for p in value.split(",") if p.strip()]
    if not isinstance(value, list) or not value:
        raise CaseFileError(f"{where}: must be a non-empty list of agent ids (e.g. noop,reference)")
    out: list[str] = []
    for a in value:
        if not isinstance(a, str) or not _AGENT_RE.match(a):
            raise CaseFileError(f"{where}: {a!r} is not an agent id (letters, digits, '.', '_', ':', '-')")
        if a not in out:
            out.append(a)
    return out


def parse_repeat(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPEAT:
        raise CaseFileError(f"{where}: must be a whole number from 1 to {MAX_REPEAT}, got {value!r}")
    return value


def _describe(i: int, raw: Any) -> str:
    key = raw.get("key") if isinstance(raw, dict) else None
    return f"case {key!r} (cases[{i}])" if isinstance(key, str) and key else f"cases[{i}]"


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:3]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "(the case)"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"field {where}: {msg}")
    return "; ".join(parts)


def check_task_minutes(cf: CaseFile, bound: int) -> None:
    """Refuse, before anything starts, a case the embedded control plane would refuse for its
    max_task_minutes: a usage error naming the case and field, as a schema error is."""
    from gh_server.api.common import task_minutes

    for i, case in enumerate(cf.cases):
        minutes = task_minutes(case.get("limits"))
        if minutes > bound:
            raise CaseFileError(f"{cf.path}: {_describe(i, case)}: field limits.minutes: {minutes} minutes is over "
                                f"the control plane's limit of {bound} (max_task_minutes: --server-config raises it)")


def load_case_file(path: Path) -> CaseFile:
    """Read and check a cases file; raise CaseFileError naming the case and field at fault."""
    from gh_server.api.schemas import TestCaseCreate  # the API's own rules, so local and server agree

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CaseFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CaseFileError(f"{path}: cannot read it: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise CaseFileError(f"{path}: not valid YAML or JSON: {e}") from None
    if isinstance(data, list):  # a bare list of cases is accepted too
        data = {"cases": data}
    if not isinstance(data, dict):
        raise CaseFileError(f"{path}: must be a mapping with a 'cases:' list")
    unknown = sorted(set(map(str, data)) - _TOP_KEYS)
    if unknown:
        raise CaseFileError(f"{path}: unknown top-level key(s) {', '.join(unknown)}; "
                            f"allowed: {', '.join(sorted(_TOP_KEYS))}")
    raw_cases = data.get("cases")
    if not isinstance(raw_cases, list) or not raw_cases:
        raise CaseFileError(f"{path}: 'cases:' must be a non-empty list of test cases")
    if len(raw_cases) > 500:
        raise CaseFileError(f"{path}: {len(raw_cases)} cases; the limit is 500 (the batch API's)")
    cases: list[dict[str, Any]] = []
    keys: list[str] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_cases):
        where = _describe(i, raw)
        if not isinstance(raw, dict):
            raise CaseFileError(f"{path}: {where}: must be a mapping of test case fields")
        try:
            model = TestCaseCreate.model_validate(raw)
        except ValidationError as e:
            raise CaseFileError(f"{path}: {where}: {_validation_message(e)}") from None
        key = model.key
        if key is not None:
            if key in seen:
                raise CaseFileError(f"{path}: {where}: field key: {key!r} is also cases[{seen[key]}]'s key")
            seen[key] = i
        cases.append(dict(raw))
        keys.append(key or f"cases[{i}]")
    agents = parse_agents(data["agents"], f"{path}: agents") if data.get("agents") is not None else None
    repeat = parse_repeat(data["repeat"], f"{path}: repeat") if data.get("repeat") is not None else None
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not 1 <= len(name) <= 200):
        raise CaseFileError(f"{path}: name: must be text of 1 to 200 characters")
    return CaseFile(path=path, cases=cases, agents=agents, repeat=repeat, name=name, keys=keys)

"""Is a trajectory ATIF as Harbor publishes it? Its JSON schema, recorded from Harbor's PyPI package
(harbor_atif_schema.json; bench/atif_harbor.py regenerates it and validates against the live package's
models), plus the rules Harbor's models state in words that a JSON schema cannot: step ids run 1, 2, 3...;
an observation's `source_call_id` names a tool call of its own step; agent-only fields (model_name,
reasoning_content, tool_calls, metrics) only on agent steps; an agent step with `llm_call_count` 0 (no model
call) has no metrics nor reasoning_content. And ours: every image it names is a file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema_rs

SCHEMA_FILE = Path(__file__).with_name("harbor_atif_schema.json")
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")
LLM_ONLY = ("metrics", "reasoning_content")  # absent on an agent step that made no model call (ATIF v1.7)


def harbor_schema() -> dict[str, Any]:
    doc = json.loads(SCHEMA_FILE.read_text())
    schema: dict[str, Any] = doc["schema"]
    return schema


def _images(content: Any) -> list[str]:
    if not isinstance(content, list):
        return []
    return [p["source"]["path"] for p in content if p.get("type") == "image"]


def atif_errors(trajectory: Mapping[str, Any], files: Mapping[str, bytes] | None = None) -> list[str]:
    """What is wrong with `trajectory` ([] when nothing); `files`, relative to the trajectory's directory."""
    errors = [e.message for e in jsonschema_rs.validator_for(harbor_schema()).iter_errors(dict(trajectory))]
    for i, step in enumerate(trajectory.get("steps") or []):
        if step.get("step_id") != i + 1:
            errors.append(f"steps[{i}].step_id is {step.get('step_id')}, not {i + 1}")
        if step.get("source") != "agent":
            errors += [f"steps[{i}].{f} on a {step.get('source')} step" for f in AGENT_ONLY if f in step]
        elif step.get("llm_call_count") == 0:
            errors += [f"steps[{i}].{f} on a step with llm_call_count 0" for f in LLM_ONLY if f in step]
        calls = {c["tool_call_id"] for c in step.get("tool_calls") or []}
        images = _images(step.get("message"))
        for r in (step.get("observation") or {}).get("results") or []:
            if r.get("source_call_id") is not None and r["source_call_id"] not in calls:
                errors.append(f"steps[{i}] observation names {r['source_call_id']!r}, not a call of its step")
            images += _images(r.get("content"))
        if files is not None:
            errors += [f"steps[{i}] names {p}, which is not a file" for p in images if p not in files]
    return errors

"""Files: a file the agent left in the guest (`vm_file`), a file the importer embedded in the check
(`embedded_file`: OSWorld's cloud_file and cache_file, fetched at import), a value read from a file
(`content_from_vm_file`).

OSWorld copies a VM file to the host and hands the metric the copy's path, or None when the file is
not there; here the file is already where it is, so the getter hands its own path (with `~` and `$VAR`
expanded as OSWorld's file server expands them). `dest` names OSWorld's copy and means nothing here.
With `multi`, `path` is a list; `gives` (default [0]) picks which paths reach the metric: one is given
as itself, several as a list.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from gh_osworld.reading import Embedded
from gh_osworld.registry import getter
from gh_osworld.spec import SpecError


def _given(items: list[Any], spec: dict[str, Any]) -> Any:
    gives = spec.get("gives", [0])
    if not isinstance(gives, list) or not all(isinstance(i, int) for i in gives):
        raise SpecError(f"gives: a list of indexes is needed, not {gives!r}")
    chosen = [x for i, x in enumerate(items) if i in set(gives)]
    return chosen[0] if len(chosen) == 1 else chosen


def _with_time_suffix(path: str, fmt: str) -> str:
    """OSWorld's `time_suffix`: today's date put before the first dot of the name (`a.csv` -> `a2024_01_31.csv`)."""
    if "." not in path:
        return path
    head, tail = path.split(".")[0], path.split(".")[1]
    return head + datetime.now().strftime(fmt) + "." + tail


def vm_path(path: str) -> str | None:
    """The guest file's path, None when there is no regular file there (OSWorld's getter gives None)."""
    full = os.path.expandvars(os.path.expanduser(path))
    return full if os.path.isfile(full) else None


def _paths(spec: dict[str, Any], key: str) -> list[str]:
    value = spec.get(key)
    if spec.get("multi", False):
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise SpecError(f"{spec['type']}: with multi, {key} is a list of paths")
        return value
    if not isinstance(value, str):
        raise SpecError(f"{spec['type']}: {key} is a path")
    return [value]


@getter("vm_file")
def vm_file(spec: dict[str, Any]) -> Any:
    paths = _paths(spec, "path")
    if not spec.get("multi", False) and spec.get("time_suffix", False):
        paths = [_with_time_suffix(p, spec.get("time_format", "%Y_%m_%d")) for p in paths]
    return _given([vm_path(p) for p in paths], spec)


@getter("embedded_file")
def embedded_file(spec: dict[str, Any]) -> Any:
    """Our own file, written beside the spec by the check: missing is our error (a crash), never the agent's."""
    paths = _paths(spec, "paths" if spec.get("multi", False) else "path")
    for p in paths:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"the check's embedded file {p} is missing")
    return _given([Embedded(p) for p in paths], spec)


@getter("content_from_vm_file")
def content_from_vm_file(spec: dict[str, Any]) -> list[str] | None:
    """A part of a guest file as text: only `file_type: xlsx` with `file_content: last_row` (the last
    data row of the first sheet, each cell as text), the one form OSWorld's tasks use."""
    if spec.get("file_type") != "xlsx" or spec.get("file_content") != "last_row":
        raise SpecError(f"content_from_vm_file: {spec.get('file_type')}/{spec.get('file_content')} is not supported")
    path = vm_path(spec["path"])
    if path is None:
        return None
    import pandas as pd  # the guest's Debian python3-pandas; loaded only when a check needs it

    try:
        frame = pd.read_excel(path)
    except Exception:  # the agent's workbook is unreadable: nothing to compare, a failure
        return None
    if frame.empty:
        return None
    return [str(v) for v in frame.iloc[-1].astype(str).tolist()]

"""Reading a configuration file: the one loader the runner's `--config` and gh-server's `--config` share.

A file holds one YAML mapping (JSON is read too: YAML parses it); its top-level keys may be spelled
with dashes or underscores (`drain-grace` is `drain_grace`), as people write YAML either way. What the
keys mean, and the errors about them, stay with each side's own model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class ConfigFileError(ValueError):
    """A config file that cannot be read, is not YAML, or is not a mapping. The message names the file and
    the problem; a ValueError, so a caller that takes bad settings as ValueError takes this too."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"config file {path}: {problem}")
        self.path = path
        self.problem = problem


def read_mapping(path: Path | str) -> dict[str, Any]:
    """The file's top-level mapping, keys as strings with dashes turned to underscores; {} for an empty file.

    Raises:
        ConfigFileError: the file cannot be read or decoded, is not valid YAML, or holds something other
            than a mapping (a list, a bare value).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigFileError(path, f"cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigFileError(path, f"not UTF-8 text (byte {e.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigFileError(path, f"not valid YAML: {_yaml_problem(e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(path, f"must be a mapping of keys to values, not {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _yaml_problem(e: yaml.YAMLError) -> str:
    """What PyYAML found wrong and where, on one line (its own text spans several, and names no file)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if problem and mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(e).splitlines()[0] if str(e) else type(e).__name__

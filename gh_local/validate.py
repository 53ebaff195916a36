"""`gh-runner validate CASES.yaml [--repeat N]`: is each case worth scoring agents on?

A `gh-runner local` run of the cases against the built-ins `noop` and `reference`, N tries each (3 by
default), every try on a fresh machine; then the control plane's validation of that run
(GET /v1/test_runs/{id}/validation, gh_server/validation.py): per case valid, broken, flaky or
unvalidated with the reasons, printed after the results table and added to the JSON report as
`validation`. A case is valid when the check before printed False (a score of 0) on every machine (the
setup broke it, deterministically, and left no checkpoint done), noop failed every try and reference passed every try.

Exit codes: those of `gh-runner local`, except that a try ending in error is a finding here (the case's
verdict says it), not a failure: 0 when every try ran; with --strict, 3 when a case is not valid.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from gh_local.casefile import CaseFileError, load_case_file
from gh_local.local import DEFAULT_OUTPUT_ROOT, EXIT_OK, EXIT_USAGE, LocalRun, options_from_args

EXIT_NOT_VALID = 3
DEFAULT_REPEAT = 3
AGENTS = ["noop", "reference"]


def render(validation: dict[str, Any]) -> str:
    """One line per case, and its reasons under it."""
    lines = ["validation (noop must fail, reference must pass, the check before must score 0):"]
    for row in validation.get("data", []):
        v = row["validation"]
        lines.append(f"  {row.get('key') or row['test_case_id']:<10} {v['status']:<12} ({v['runs']} machines)")
        lines.extend(f"      {r['message']}" for r in v.get("reasons", []))
    counts = validation.get("counts") or {}
    lines.append("  " + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("valid", "broken", "flaky", "unvalidated")))
    return "\n".join(lines)


class ValidateRun(LocalRun):
    errors_fail = False

    def __init__(self, *args: Any, strict: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.agents = list(AGENTS)
        self.repeat = self.opts.repeat or DEFAULT_REPEAT
        self.strict = strict
        self.validation: dict[str, Any] | None = None

    async def _finish(self, http: httpx.AsyncClient, run: dict[str, Any],
                      partial: list[dict[str, Any]] | None = None) -> int:
        if partial is not None:  # interrupted: nothing to validate
            return await super()._finish(http, run, partial)
        # Validated first: that records each case's validation, so the results (and report.html) mark them.
        r = await http.get(f"/v1/test_runs/{self.run_id}/validation")
        code = await super()._finish(http, run)
        if r.status_code != 200:
            self.say(f"gh-runner validate: the control plane could not validate the run: HTTP {r.status_code}")
            return code or 1
        self.validation = dict(r.json())
        self.say("")
        self.say(render(self.validation))
        report = self.opts.report or DEFAULT_OUTPUT_ROOT / str(self.run_id) / "report.json"
        await asyncio.to_thread(_add_to_report, report, self.validation)
        if code == EXIT_OK and self.strict and any(d["validation"]["status"] != "valid"
                                                   for d in self.validation["data"]):
            return EXIT_NOT_VALID
        return code


def _add_to_report(path: Path, validation: dict[str, Any]) -> None:
    if not path.is_file():
        return
    data = json.loads(path.read_text())
    data["validation"] = validation
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def main(args: Any) -> int:
    """Entry point for `gh-runner validate` (dispatched by gh_runner.cli)."""
    try:
        opts = options_from_args(args)
        case_file = load_case_file(opts.cases)
    except (CaseFileError, ValueError) as e:
        print(f"gh-runner validate: {e}", file=sys.stderr)
        return EXIT_USAGE
    opts = replace(opts, agents=list(AGENTS))
    return asyncio.run(ValidateRun(opts, case_file, strict=bool(getattr(args, "strict", False))).main())

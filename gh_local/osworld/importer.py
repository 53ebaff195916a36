"""`gh-runner import osworld PATH... [--out cases.yaml] [--start-state osworld-desktop] [--like NAME]
[--files-dir DIR] [--offline] [--fetch-only]` (docs/osworld.md).

Reads every task first (a malformed one stops the import before anything is fetched or written), then
turns each into a case or a skip with its reason, prints one line per task and the totals, and writes the
cases file at once (a temporary file checked with the same rules as `gh-runner local`, then renamed): an
import that fails writes nothing, never half a file.

`--fetch-only` fetches every file the tasks need into --files-dir and writes nothing else; `--offline`
never reaches the network (a file not in --files-dir is download_failed). A task whose check may print
True on the untouched start gets a warning line (untouched.py); the files placed from the start state's
file store are listed with the command that builds it.

Exit codes: 0 when the file is written (whatever was skipped), 1 when no task could be imported, 2 on bad
input (a path, a task file, a flag).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gh_local.casefile import CaseFileError, load_case_file
from gh_local.osworld.baseline import baselines_for
from gh_local.osworld.check import LOCALE, refuse, translate_evaluator
from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.report import ImportReport, Outcome, TaskResult
from gh_local.osworld.script import Piece
from gh_local.osworld.setup import translate_steps
from gh_local.osworld.shims import preamble
from gh_local.osworld.skips import Skip, SkipReason
from gh_local.osworld.target import KNOWN_START_STATES, Carry, Target
from gh_local.osworld.task import LoadedTask, Task, TaskFileError, load_tasks
from gh_local.osworld.untouched import may_pass_untouched
from gh_server.api.schemas import SCRIPT_MAX, check_key

EXIT_OK, EXIT_NOTHING, EXIT_USAGE = 0, 1, 2
DEFAULT_MINUTES = 10
PROMPT_MAX = 8000
_KEY_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def case_key(task_id: str) -> str:
    """The task id when it is a valid key (OSWorld's UUIDs are), else a valid key made from it."""
    key = _KEY_BAD.sub("-", task_id).strip("-")[:64]
    try:
        if key and check_key(key) == key:
            return key
    except ValueError:
        pass
    return "osworld-" + hashlib.sha256(task_id.encode()).hexdigest()[:16]


def _name(instruction: str) -> str:
    first = " ".join(instruction.split())
    return first if len(first) <= 200 else first[:199] + "…"


def _script(title: str, body: Piece) -> str:
    shims = preamble("\n".join(body.lines))
    return "\n".join([f"# {title}", *shims.lines, *body.lines]) + "\n"


def _evaluator_summary(loaded: LoadedTask) -> str:
    calls = loaded.task.evaluator.calls()
    parts = [f"{c.func}({c.result.type if c.result else ''})" for c in calls]
    return f" {loaded.task.evaluator.conj} ".join(parts)[:500]


def task_to_case(loaded: LoadedTask, target: Target, fetcher: Fetcher,
                 store: dict[str, int] | None = None) -> dict[str, Any]:
    """The case for one task; raise Skip when it cannot keep its meaning on `target`. The files it places from
    the target's file store are added to `store` (sha256 -> size)."""
    task = loaded.task
    if len(task.instruction) > PROMPT_MAX:
        raise Skip(SkipReason.PROMPT_TOO_LONG, f"{len(task.instruction):,} characters; a prompt holds {PROMPT_MAX:,}")
    missing = target.lacks_apps(task.related_apps)
    if missing:  # before anything is fetched for it
        raise Skip(SkipReason.APP_MISSING, f"needs {', '.join(missing)}, which {target.start_state} does not have")
    refuse(task.evaluator, target)  # before the setup's downloads are fetched
    setup_body = translate_steps(task.config, fetcher, target, "config")
    check_body = translate_evaluator(task.evaluator, fetcher, target)
    baseline = [line for b in baselines_for(task) for line in (f"# OSWorld's snapshot: {b.why}", *b.lines)]
    setup = (_script(f"gh-runner import osworld: the config of OSWorld task {task.id}",
                     Piece(['cd "${HOME:-/}" 2>/dev/null || cd /', *LOCALE, *baseline, *setup_body.lines]))
             if setup_body.lines or baseline else None)
    check = _script(f"gh-runner import osworld: the evaluator of OSWorld task {task.id}: {_evaluator_summary(loaded)}",
                    check_body)
    needs = setup_body.needs | check_body.needs
    for text in (setup or "", check):
        needs |= preamble(text).needs
    lacking = target.lacks(needs)
    if lacking:
        raise Skip(SkipReason.NEEDS_DESKTOP,
                   f"needs {' and '.join(lacking)}, which {target.start_state} does not have")
    for what, text in (("setup", setup or ""), ("check", check)):
        if len(text) > SCRIPT_MAX:
            if target.carries(Carry.FILE_STORE) and not target.store_every_file:
                # Files that each fit but together do not: every one of them from the file store instead.
                return task_to_case(loaded, replace(target, store_every_file=True), fetcher, store)
            raise Skip(SkipReason.SCRIPT_TOO_LARGE,
                       f"the {what} is {len(text):,} characters; the limit is {SCRIPT_MAX:,}")
    if store is not None:
        store.update(setup_body.store)
        store.update(check_body.store)
    tags = [t for t in dict.fromkeys(["osworld", *task.related_apps]) if isinstance(t, str) and 1 <= len(t) <= 64]
    metadata = {"benchmark": "osworld", "osworld_id": task.id[:500], "osworld_evaluator": _evaluator_summary(loaded)}
    source = " ".join(task.source) if isinstance(task.source, list) else task.source
    if source:
        metadata["osworld_source"] = source[:500]
    if task.snapshot:
        metadata["osworld_snapshot"] = task.snapshot[:500]
    if task.evaluator.func == "infeasible":
        metadata["reference_answer"] = "infeasible"  # what the built-in model agent answers on `infeasible`
    case: dict[str, Any] = {
        "key": case_key(task.id),
        "name": _name(task.instruction),
        "prompt": task.instruction,
        "start_state": target.start_state,
    }
    if setup:
        case["setup_script"] = setup
    case.update({
        "success": {"check_script": check},
        "limits": {"minutes": DEFAULT_MINUTES},
        "runs_on": "vm",
        "category": (loaded.domain or task.snapshot or "osworld")[:200],
        "tags": tags[:50],
        "metadata": metadata,
    })
    return case


def import_tasks(tasks: list[LoadedTask], target: Target,
                 fetcher: Fetcher) -> tuple[list[dict[str, Any]], ImportReport]:
    report = ImportReport()
    cases: list[dict[str, Any]] = []
    keys: set[str] = set()
    # OSWorld's data has ids used by two tasks of different domains (15 in chrome/ and thunderbird/, different
    # tasks): each such task is keyed `<domain>-<id>`, the same whatever is skipped; the same id twice in one
    # domain is a duplicate.
    domains: dict[str, set[str | None]] = {}
    for loaded in tasks:
        domains.setdefault(loaded.task.id, set()).add(loaded.domain)
    for loaded in tasks:
        tid = loaded.task.id
        try:
            shared = len(domains[tid]) > 1 and loaded.domain is not None
            key = case_key(f"{loaded.domain}-{tid}" if shared else tid)
            if key in keys:
                same = "the id" if key == tid else f"its key {key} is the key"
                raise Skip(SkipReason.DUPLICATE_ID, f"{loaded.path}: {same} of an earlier task")
            store: dict[str, int] = {}
            case = task_to_case(loaded, target, fetcher, store)
            case["key"] = key
        except Skip as s:
            report.results.append(TaskResult(tid, Outcome.SKIPPED, reason=s.reason, detail=s.detail))
            continue
        keys.add(case["key"])
        cases.append(case)
        report.store.update(store)
        report.results.append(TaskResult(tid, Outcome.IMPORTED, key=case["key"],
                                         warning=may_pass_untouched(loaded.task) or ""))
    return cases, report


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Scripts as literal blocks, so the file reads like the hand-written examples.
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def write_cases(out: Path, cases: list[dict[str, Any]], report: ImportReport, sources: list[Path]) -> None:
    """Write the cases file whole or not at all: a temporary file, checked as `gh-runner local` would, renamed."""
    header = (f"# Imported from OSWorld-format tasks ({', '.join(map(str, sources))[:300]}) "
              "by gh-runner import osworld.\n"
              f"# {report.totals()}\n")
    text = header + yaml.dump({"cases": cases}, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial.yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        load_case_file(Path(tmp))
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def task_urls(task: Task) -> list[str]:
    """Every file a task would have fetched at import: its downloads (config and postconfig) and the files its
    evaluator fetches (cloud_file; cache_file with a URL)."""
    urls: list[str] = []
    for step in [*task.config, *task.evaluator.postconfig]:
        if step.type == "download":
            urls += [f["url"] for f in step.parameters.get("files", []) or []
                     if isinstance(f, dict) and isinstance(f.get("url"), str)]
    for call in task.evaluator.calls():
        for g in (call.result, call.expected):
            if g is not None and g.type in ("cloud_file", "cache_file"):
                path = g.params.get("path")
                for u in path if isinstance(path, list) else [path]:
                    if isinstance(u, str) and u.startswith(("http://", "https://")):
                        urls.append(u)
    return list(dict.fromkeys(urls))


def fetch_only(tasks: list[LoadedTask], fetcher: Fetcher) -> tuple[int, list[str]]:
    """Fetch every file the tasks need into the fetcher's files_dir, whatever the start state: how many URLs
    they name, and a line per one that could not be fetched."""
    failures = []
    urls: set[str] = set()
    for loaded in tasks:
        for url in task_urls(loaded.task):
            if url in urls:
                continue
            urls.add(url)
            try:
                fetcher.blob(url, loaded.task.id)
            except Skip as s:
                failures.append(f"{loaded.task.id}: {s.reason} ({s.detail})")
    return len(urls), failures


def main(args: Any) -> int:
    """Entry point for `gh-runner import osworld` (dispatched by gh_runner.cli)."""
    paths: list[Path] = list(args.paths)
    out: Path = args.out
    files_dir: Path = args.files_dir or out.parent / "osworld-files"
    if not out.parent.is_dir():
        print(f"gh-runner import osworld: --out {out}: the directory {out.parent} does not exist", file=sys.stderr)
        return EXIT_USAGE
    if out.is_dir():
        print(f"gh-runner import osworld: --out {out} is a directory; name the cases file", file=sys.stderr)
        return EXIT_USAGE
    try:
        tasks = load_tasks(paths)
    except TaskFileError as e:
        print(f"gh-runner import osworld: {e}; nothing was written", file=sys.stderr)
        return EXIT_USAGE
    like = getattr(args, "like", None)
    if like is not None and like not in KNOWN_START_STATES:
        print(f"gh-runner import osworld: --like {like}: not a start state the importer knows "
              f"({', '.join(KNOWN_START_STATES)})", file=sys.stderr)
        return EXIT_USAGE
    offline = bool(getattr(args, "offline", False))
    if getattr(args, "fetch_only", False):
        if offline:
            print("gh-runner import osworld: --fetch-only fetches; it cannot be --offline", file=sys.stderr)
            return EXIT_USAGE
        files_dir.mkdir(parents=True, exist_ok=True)
        fetcher = Fetcher(files_dir)
        try:
            needed, failures = fetch_only(tasks, fetcher)
        finally:
            fetcher.close()
        print("\n".join([*failures, f"{len(tasks)} tasks need {needed} files: {needed - len(failures)} in "
                                    f"{files_dir}, {len(failures)} failed; no cases written"]))
        return EXIT_OK if not failures else EXIT_NOTHING
    fetcher = Fetcher(files_dir, offline=offline)
    try:
        cases, report = import_tasks(tasks, Target.like(args.start_state, getattr(args, "like", None)), fetcher)
    finally:
        fetcher.close()
    print(report.render(str(files_dir)))
    if not cases:
        print("gh-runner import osworld: no task could be imported; nothing was written", file=sys.stderr)
        return EXIT_NOTHING
    try:
        write_cases(out, cases, report, paths)
    except CaseFileError as e:  # ours: an imported case the API would refuse
        print(f"gh-runner import osworld: the imported cases do not pass the case-file check ({e}); "
              "nothing was written", file=sys.stderr)
        return EXIT_NOTHING
    print(f"wrote {len(cases)} cases to {out}")
    return EXIT_OK

"""A task's `evaluator` as a check script: run in the guest as the signed-in user, prints its score.

OSWorld evaluates on the host, pulling state out of the VM; here the getters read the state where it is
and the metrics compare it there. The script, in order:
1. the agent's final answer: an `infeasible` task passes when it begins with the word "infeasible" (any
   case); any other task fails on such an answer, as OSWorld scores an agent that gave up on a feasible
   task;
2. the checkers: postconfig's `download` steps (and a `chmod +x` of one), written by the check itself in
   both phases before its getters, and removed again after the check before;
3. the rest of `postconfig`, only in the check after (GH_CHECK_PHASE=after), its output kept off the
   verdict;
4. the files OSWorld fetches for its getters (cloud_file; cache_file with URLs), fetched now and written by
   the check into its own directory (a base64 heredoc, or from the start state's file store): nothing
   expected is in the guest before the check runs; a multi getter's files all of them, under their `dest`
   names, as OSWorld keeps them;
5. `python3 -m gh_osworld SPEC` (gh_osworld/spec.py): each metric's getters and the metric, combined by
   `conj`; its last line (True, False or a number in [0, 1]) is the check's.

Every metric has one implementation, gh_osworld's, run in the guest: a task other than `infeasible` imports
only for a target that carries gh_osworld (osworld-desktop); elsewhere it is skipped (needs_gh_osworld).
The names gh_osworld/names.py lists are read when importing. Scripts run in en_US.UTF-8 where the guest
has it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.script import Piece, embed_bytes, quote
from gh_local.osworld.setup import place_file, translate_step
from gh_local.osworld.skips import Skip, SkipReason
from gh_local.osworld.target import Carry, Need, Target
from gh_local.osworld.task import ConfigStep, Evaluator, Getter, MetricCall
from gh_osworld import names as guest_names

INFEASIBLE = "infeasible"

# Getters whose state is a web page fetched from the internet, or an online account.
LIVE_WEB_GETTERS = {"info_from_website", "page_info", "active_tab_html_parse",
                    "gotoRecreationPage_and_get_html_content", "url_dashPart", "active_url_from_accessTree"}
DRIVE_GETTERS = {"googledrive_file"}
# Getters whose files the importer fetches and the check brings (embedded_file in the guest).
_FETCHED = ("cloud_file", "cache_file")


# The agent's answer, lowered, its leading blanks and line breaks gone: does it begin with the word?
_ANSWER = ["gh_a=$(printf '%s' \"${GH_AGENT_ANSWER:-}\" | tr '\\n\\r\\t' '   ' | tr 'A-Z' 'a-z' | sed 's/^ *//')"]
_SAYS_INFEASIBLE = 'infeasible|infeasible[!a-z0-9_]*'


class _Builder:
    def __init__(self, fetcher: Fetcher, target: Target) -> None:
        self.fetcher = fetcher
        self.target = target
        self.piece = Piece()
        self.n = 0


def is_infeasible(ev: Evaluator) -> bool:
    return ev.func == INFEASIBLE


# OSWorld's snapshot runs in en_US.UTF-8 (its `ls` order, its messages): scripts run in it where the guest
# has it. A start state without it keeps its own locale, and `gh-runner validate` says whether that matters.
LOCALE = ["if locale -a 2>/dev/null | grep -qixE 'en_US\\.utf-?8'; then",
          "  LANG=en_US.UTF-8; LC_ALL=en_US.UTF-8; export LANG LC_ALL", "fi"]
# The spec names files in the check's temporary directory by this token, replaced once the directory exists.
_W_TOKEN = "@GH_OSWORLD_W@"


def _checkers(ev: Evaluator, fetcher: Fetcher, target: Target) -> tuple[Piece, list[str], Piece]:
    """postconfig split: its `download` steps (checkers such as eval.sh: written by the check itself in both
    phases, before its getters, so the check before proves something and the agent cannot tamper with them),
    the files they write (removed after the check before, so the agent never sees them), and the rest (run in
    the check after only)."""
    placed, rest = Piece(), Piece()
    dests: list[str] = []
    raw: set[str] = set()
    for i, step in enumerate(ev.postconfig):
        where = f"evaluator.postconfig[{i}]"
        if step.type == "download":
            placed.add(translate_step(step, fetcher, target, where))
            files = [f for f in step.parameters.get("files", []) if isinstance(f, dict)]
            dests += [quote(f["path"]) for f in files]
            raw |= {f["path"] for f in files}
        elif _makes_executable(step, raw):  # `chmod +x eval.sh`: part of placing the checker
            placed.add(translate_step(step, fetcher, target, where))
        else:
            rest.add(translate_step(step, fetcher, target, where))
    return placed, dests, rest


def _makes_executable(step: ConfigStep, checkers: set[str]) -> bool:
    if step.type not in ("execute", "command"):
        return False
    cmd = step.parameters.get("command")
    words = cmd.split() if isinstance(cmd, str) else cmd if isinstance(cmd, list) else []
    return (len(words) == 3 and words[:2] == ["chmod", "+x"] and words[2] in checkers)


_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,10}$")


def _suffix(dest: Any) -> str:
    """The extension of OSWorld's `dest` (the name it keeps a fetched file under), for the embedded copy: a
    metric may read a file by its kind (openpyxl refuses a workbook whose name does not end in .xlsx)."""
    m = _SUFFIX.search(dest) if isinstance(dest, str) else None
    return m.group(0) if m else ""


def _guest_getter(b: _Builder, g: Getter | None, where: str) -> dict[str, Any] | None:
    """A getter for gh_osworld's spec: passed as it is when the guest implements it; what OSWorld fetches from
    the web (cloud_file, cache_file with a URL) fetched now and embedded (embedded_file); a cache_file OSWorld
    keeps from a postconfig's output read where the check kept it."""
    if g is None:
        return None
    p = g.params
    if g.type in LIVE_WEB_GETTERS or (g.type == "pdf_from_url" and str(p.get("path", "")).startswith("http")):
        raise Skip(SkipReason.LIVE_WEB, f"{where}: getter {g.type}")
    if g.type in DRIVE_GETTERS:
        raise Skip(SkipReason.GOOGLE_DRIVE, f"{where}: getter {g.type}")
    if g.type == "cache_file" and isinstance(p.get("path"), str) and not p["path"].startswith(("http:", "https:")):
        name = p["path"]
        if "/" in name or name in (".", ".."):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: cache_file {name[:100]!r}")
        # What the agent's state made (a postconfig command's output): missing is the agent's failure.
        return {"type": "vm_file", "path": f"{_W_TOKEN}/cache/{name}"}
    if g.type in _FETCHED:
        if p.get("multi"):
            return _multi_file(b, g, where)
        url = p.get("path")
        if not isinstance(url, str) or not url:
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {g.type} without its URL in path")
        b.n += 1
        name = f"e{b.n}{_suffix(p.get('dest'))}"
        b.piece.add(place_file(b.fetcher.blob(url, where), f'"$gh_w/{name}"', b.target, url, where))
        return {"type": "embedded_file", "path": f"{_W_TOKEN}/{name}"}
    if g.type not in guest_names.GETTERS:
        raise Skip(SkipReason.UNSUPPORTED_GETTER, f"{where}: {g.type[:100]}")
    return {"type": g.type, **p}


def _multi_file(b: _Builder, g: Getter, where: str) -> dict[str, Any]:
    """A multi cloud_file (or cache_file with URLs): OSWorld fetches every file into its cache under its `dest`
    name and hands the metric those `gives` picks. A metric may read a file beside the one it is given (the
    sheet_print rule of compare_table reads `<stem>-<sheet>.csv` beside the workbook), so every file is placed,
    `gives` or not, in a directory of this getter's own under its `dest` name."""
    p = g.params
    urls, dests, gives = p.get("path"), p.get("dest"), p.get("gives", [0])
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) and u for u in urls):
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {g.type} without its URLs in path")
    if not isinstance(dests, list) or len(dests) != len(urls) or not all(_plain_name(d) for d in dests):
        raise Skip(SkipReason.UNSUPPORTED_OPTION,
                   f"{where}: {g.type} needs a dest for each URL, each a plain file name, not {dests!r}"[:300])
    if len(set(dests)) != len(dests):
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {g.type} names one dest twice"[:300])
    if not isinstance(gives, list) or not all(isinstance(k, int) and 0 <= k < len(urls) for k in gives):
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {g.type} gives {gives!r}"[:200])
    b.n += 1
    folder = f"e{b.n}"
    b.piece.lines.append(f'mkdir "$gh_w/{folder}" || exit 1')
    for url, dest in zip(urls, dests, strict=True):
        b.piece.add(place_file(b.fetcher.blob(url, where), f'"$gh_w/{folder}/"{quote(dest)}', b.target, url, where))
    # OSWorld gives one path when one file is given, else the list (in the files' order).
    paths = [f"{_W_TOKEN}/{folder}/{dests[k]}" for k in sorted(set(gives))]
    return ({"type": "embedded_file", "path": paths[0]} if len(paths) == 1
            else {"type": "embedded_file", "paths": paths, "multi": True})


def _plain_name(name: Any) -> bool:
    """A file name to write under in the check's directory: no directory part, nothing the shell or the spec's
    token replacement would read otherwise."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and name not in (".", "..")
            and not any(c in name for c in "/\\\0\n\r") and _W_TOKEN not in name)


def _guest_options(call: MetricCall, where: str) -> None:
    """Options gh_osworld implements only in part say which (names.py: TABLE_RULES for compare_table)."""
    table_rules: frozenset[str] | None = getattr(guest_names, "TABLE_RULES", None)
    if call.func == "compare_table" and table_rules is not None:
        for rule in call.options.get("rules") or []:
            kind = rule.get("type") if isinstance(rule, dict) else None
            if kind not in table_rules:
                raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: compare_table rule of type {str(kind)[:60]}")


def _refuse(ev: Evaluator) -> None:
    """The skips a task's evaluator earns on any target, named before anything is fetched: the reason that says
    most comes first (a task that reads the live web or a Drive stays skipped for that whatever its metric)."""
    calls = ev.calls()
    for i, call in enumerate(calls):
        where = f"evaluator.func[{i}]" if len(calls) > 1 else "evaluator"
        for role, g in (("result", call.result), ("expected", call.expected)):
            if g is not None and g.type in LIVE_WEB_GETTERS:
                raise Skip(SkipReason.LIVE_WEB, f"{where}.{role}: getter {g.type}")
            if g is not None and g.type in DRIVE_GETTERS:
                raise Skip(SkipReason.GOOGLE_DRIVE, f"{where}.{role}: getter {g.type}")
            if g is not None and g.type == "pdf_from_url" and str(g.params.get("path", "")).startswith("http"):
                raise Skip(SkipReason.LIVE_WEB, f"{where}.{role}: getter {g.type}")
        if call.func == INFEASIBLE:
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: infeasible beside other metrics")
        if call.func not in guest_names.METRICS:
            raise Skip(SkipReason.UNSUPPORTED_METRIC, f"{where}: {call.func[:100]}")
        for role, g in (("result", call.result), ("expected", call.expected)):
            if g is not None and g.type not in guest_names.GETTERS and g.type not in _FETCHED:
                raise Skip(SkipReason.UNSUPPORTED_GETTER, f"{where}.{role}: {g.type[:100]}")
        _guest_options(call, where)


def refuse(ev: Evaluator, target: Target) -> None:
    """Raise the Skip the evaluator earns on `target` whatever its files: the importer asks before anything is
    fetched for the task (its setup's downloads included)."""
    if is_infeasible(ev):
        return
    _refuse(ev)
    if not target.carries(Carry.GH_OSWORLD):
        # Every metric has one implementation, gh_osworld's, run in the guest.
        raise Skip(SkipReason.NEEDS_GH_OSWORLD,
                   f"its metrics run in gh_osworld, which {target.start_state} does not carry (osworld-desktop does)")


def _guest_check(b: _Builder, ev: Evaluator) -> None:
    """The check hands the evaluator to gh_osworld in the guest: `python3 -m gh_osworld SPEC` (spec.py)."""
    calls = ev.calls()
    metrics = []
    for i, call in enumerate(calls):
        where = f"evaluator.func[{i}]" if len(calls) > 1 else "evaluator"
        metrics.append({"func": call.func,
                        "result": _guest_getter(b, call.result, f"{where}.result"),
                        "expected": _guest_getter(b, call.expected, f"{where}.expected"),
                        "options": call.options})
    text = json.dumps({"conj": ev.conj, "metrics": metrics}, ensure_ascii=False)
    if _W_TOKEN in json.dumps(ev.model_dump(mode="json"), ensure_ascii=False):  # it would be replaced too
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"evaluator: the text {_W_TOKEN} in the task")
    b.piece.lines += [*embed_bytes(text.encode(), '"$gh_w/spec.in"'),
                      f'sed "s|{_W_TOKEN}|$gh_w|g" "$gh_w/spec.in" > "$gh_w/spec.json" || exit 1',
                      # gh_osworld's last line is the check's: True, False or a number in [0, 1], passed on as
                      # it is (nothing after it prints). Exit 1 is no verdict (ours), never a failure of the agent.
                      'python3 -m gh_osworld "$gh_w/spec.json" || exit 1']
    b.piece.needs.add(Need.PYTHON3)


def translate_evaluator(ev: Evaluator, fetcher: Fetcher, target: Target) -> Piece:
    """The check's body (after the shims): the answer rule, the checkers, postconfig, getters, metrics,
    verdict; on a target that carries gh_osworld, the getters and metrics are its."""
    if is_infeasible(ev):
        return Piece([*_ANSWER, f'case "$gh_a" in {_SAYS_INFEASIBLE}) echo True ;; *) echo False ;; esac'])
    refuse(ev, target)
    b = _Builder(fetcher, target)
    # The directory's name is made of characters that need no quoting in JSON or sed (the spec names it).
    mk = 'gh_w=$(mktemp -d "${TMPDIR:-/tmp}/gh-check.XXXXXXXX") && case $gh_w in *[!A-Za-z0-9/._-]*) false ;; esac'
    placed, dests, rest = _checkers(ev, fetcher, target)
    # After the check before, the checkers it wrote go again (the agent never sees them), unless the start
    # state already had a file there.
    had = [f"if [ -e {d} ]; then gh_had{i}=1; fi" for i, d in enumerate(dests)]
    cleanup = [f'[ "${{GH_CHECK_PHASE:-}}" = after ] || [ -n "${{gh_had{i}:-}}" ] || rm -f {d}'
               for i, d in enumerate(dests)]
    head = ['cd "${HOME:-/}" 2>/dev/null || cd /', *LOCALE,
            f'{mk} || {{ echo "gh-runner import osworld: cannot make a temporary directory (named in characters '
            'that need no quoting)" >&2; exit 1; }',
            "gh_end() {", '  rm -rf "$gh_w"', *[f"  {c}" for c in cleanup], "}",
            "trap gh_end EXIT",
            'mkdir -p "$gh_w/cache"',
            *_ANSWER,
            f'case "$gh_a" in {_SAYS_INFEASIBLE}) echo False; exit 0 ;; esac',
            *had, *placed.lines]
    if rest.lines:
        head += ['if [ "${GH_CHECK_PHASE:-}" = after ]; then', *rest.lines, "fi >/dev/null 2>&1"]
    b.piece.needs |= placed.needs | rest.needs
    b.piece.store.update(placed.store)
    b.piece.store.update(rest.store)
    _guest_check(b, ev)
    return Piece([*head, *b.piece.lines], b.piece.needs, b.piece.store)

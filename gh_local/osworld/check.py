"""A task's `evaluator` as a check script: run in the guest as the signed-in user, prints True or False.

OSWorld evaluates on the host, pulling state out of the VM; here the getters read the state where it is
and the metrics compare it there. The script, in order:
1. the agent's final answer: an `infeasible` task passes when it begins with the word "infeasible" (any
   case); any other task fails on such an answer, as OSWorld scores an agent that gave up on a feasible
   task;
2. the checkers: postconfig's `download` steps (and a `chmod +x` of one), written by the check itself in
   both phases before its getters, and removed again after the check before;
3. the rest of `postconfig`, only in the check after (GH_CHECK_PHASE=after), its output kept off the
   verdict;
4. each metric's getters (the result as the guest has it; the expected value embedded in the script, a
   file as a base64 heredoc or from the start state's file store: nothing expected is in the guest before
   the check runs) and the metric;
5. the metrics combined by `conj` (and: all pass; or: one does), printed as True or False.

On a target that carries gh_osworld (osworld-desktop), 4 and 5 are `python3 -m gh_osworld SPEC` in the
guest, for the names gh_osworld/names.py lists (read when importing). Elsewhere metrics are POSIX sh where
their meaning allows (cmp, grep -F), so they run on linux-tiny; those that need Python's parsing (JSON,
regular expressions, text with line breaks) need python3. Both run in en_US.UTF-8 where the guest has it,
and the sh metrics read text as OSWorld does (universal newlines).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.script import Piece, command_text, embed_bytes, quote
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


class Kind(StrEnum):
    TEXT = "text"  # a command's output, in a file the check wrote
    FILE = "file"  # a file's content: in the guest (vm_file) or embedded (cloud_file)
    RULES = "rules"  # a rule: values written in the task


@dataclass(frozen=True)
class Value:
    kind: Kind
    word: str = ""  # sh word naming the file holding it (TEXT, FILE)
    rules: Any = None  # RULES


# The agent's answer, lowered, its leading blanks and line breaks gone: does it begin with the word?
_ANSWER = ["gh_a=$(printf '%s' \"${GH_AGENT_ANSWER:-}\" | tr '\\n\\r\\t' '   ' | tr 'A-Z' 'a-z' | sed 's/^ *//')"]
_SAYS_INFEASIBLE = 'infeasible|infeasible[!a-z0-9_]*'

# Python metrics: argv[1] is the spec (JSON), argv[2] the result file. Exit 0: passes; 3: fails (also when
# the result file is missing or not what the metric reads: the agent's doing); anything else is a crash,
# which the check reports as one (exit 1, no verdict), never as a failure of the agent.
PY_FAIL = 3
_PY_INCLUDE = """import json, sys
spec = json.load(open(sys.argv[1], encoding="utf-8"))
try:
    text = open(sys.argv[2], encoding="utf-8", errors="replace").read()
except FileNotFoundError:
    sys.exit(3)
ok = all(s in text for s in spec["include"]) and not any(s in text for s in spec["exclude"])
sys.exit(0 if ok else 3)
"""
_PY_JSON_SETTINGS = """import json, sys
expected = json.load(open(sys.argv[1], encoding="utf-8"))
try:
    data = json.load(open(sys.argv[2], encoding="utf-8"))
except (FileNotFoundError, ValueError):
    sys.exit(3)
sys.exit(0 if isinstance(data, dict) and all(k in data and data[k] == v for k, v in expected.items()) else 3)
"""
_PY_LIST = """import json, re, sys
spec = json.load(open(sys.argv[1], encoding="utf-8"))
want = [re.compile(p) for p in spec.get("expect", [])]
bad = [re.compile(p) for p in spec.get("unexpect", [])]
seen = [False] * len(want)
clean = True
try:
    lines = open(sys.argv[2], encoding="utf-8", errors="replace").readlines()
except FileNotFoundError:
    sys.exit(3)
for line in lines:
    seen = [s or w.search(line) is not None for s, w in zip(seen, want)]
    clean = clean and not any(b.search(line) for b in bad)
sys.exit(0 if all(seen) and clean else 3)
"""


class _Builder:
    def __init__(self, fetcher: Fetcher, target: Target) -> None:
        self.fetcher = fetcher
        self.target = target
        self.piece = Piece()
        self.n = 0

    def tmp(self, stem: str) -> str:
        self.n += 1
        return f'"$gh_w/{stem}{self.n}"'

    def getter(self, g: Getter | None, role: str, where: str) -> Value | None:
        if g is None:
            return None
        p = g.params
        if g.type in ("vm_command_line", "vm_command_error"):
            cmd, needs = command_text(p.get("command"), p.get("shell", False), where)
            self.piece.needs |= needs
            out = self.tmp("r")
            # OSWorld's getters return the output read as text, with universal newlines (gh_nl).
            streams = "2>/dev/null" if g.type == "vm_command_line" else "2>&1 >/dev/null"
            self.piece.lines.append(f"{{ {cmd} {streams} </dev/null || :; }} | gh_nl > {out}")
            return Value(Kind.TEXT, out)
        if g.type == "vm_file":
            if p.get("multi"):
                raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: vm_file with multi")
            path = p.get("path")
            if not isinstance(path, str) or not path:
                raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: vm_file without a path")
            return Value(Kind.FILE, quote(path))
        if g.type == "cloud_file" and role == "expected":
            if p.get("multi"):
                raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: cloud_file with multi")
            url = p.get("path")
            if not isinstance(url, str):
                raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: cloud_file without a URL in path")
            dest = self.tmp("e")
            self.piece.add(place_file(self.fetcher.blob(url, where), dest, self.target, url, where))
            return Value(Kind.FILE, dest)
        if g.type == "rule" and role == "expected":
            return Value(Kind.RULES, rules=p.get("rules"))
        if g.type in LIVE_WEB_GETTERS:
            raise Skip(SkipReason.LIVE_WEB, f"{where}: getter {g.type}")
        if g.type in DRIVE_GETTERS:
            raise Skip(SkipReason.GOOGLE_DRIVE, f"{where}: getter {g.type}")
        raise Skip(SkipReason.UNSUPPORTED_GETTER, f"{where}: {g.type[:100]}")

    def spec_file(self, spec: Any) -> str:
        dest = self.tmp("s")
        self.piece.lines += embed_bytes(json.dumps(spec).encode(), dest, compress=False)
        return dest

    def python(self, program: str, spec: Any, result: str, var: str) -> None:
        spec_word = self.spec_file(spec)
        self.piece.needs.add(Need.PYTHON3)
        self.piece.lines += [f"python3 -c {quote(program)} {spec_word} {result}",
                             f'case $? in 0) {var}=True ;; {PY_FAIL}) ;; *) echo "gh-runner import osworld: '
                             f'the metric crashed" >&2; exit 1 ;; esac']

    def text_of(self, v: Value) -> str:
        """A file's content as OSWorld's metrics read it (text, universal newlines): a normalised copy that is
        missing when the file is."""
        if v.kind is Kind.TEXT:
            return v.word
        copy = self.tmp("n")
        self.piece.lines.append(f"if [ -f {v.word} ]; then gh_nl < {v.word} > {copy}; fi")
        return copy

    def text_equals(self, result: str, expected: str, var: str) -> None:
        x = self.tmp("x")
        self.piece.lines.append(f"printf '%s' {quote(expected)} > {x}; if cmp -s {result} {x}; then {var}=True; fi")


def _rules(v: Value | None, func: str, where: str) -> dict[str, Any]:
    if v is None or v.kind is not Kind.RULES or not isinstance(v.rules, dict):
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {func} needs an expected rule (type rule, rules: {{...}})")
    return v.rules


def _need(v: Value | None, kinds: tuple[Kind, ...], func: str, role: str, where: str) -> Value:
    if v is None or v.kind not in kinds:
        got = "nothing" if v is None else v.kind.value
        raise Skip(SkipReason.UNSUPPORTED_OPTION,
                   f"{where}: {func} with a {role} that is {got} (takes {' or '.join(k.value for k in kinds)})")
    return v


def _strings(value: Any, what: str, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {what} must be text or a list of texts, not {value!r}"[:300])


def _metric(b: _Builder, call: MetricCall, var: str, where: str) -> None:
    """Lines that set `var` to True when the metric passes (it starts False)."""
    func = call.func
    # The reason that says most comes first: a task that reads the live web or a Drive stays skipped for
    # that whatever its metric; then the metric, named, before its getters' kinds are looked at.
    for role, g in (("result", call.result), ("expected", call.expected)):
        if g is not None and g.type in LIVE_WEB_GETTERS:
            raise Skip(SkipReason.LIVE_WEB, f"{where}.{role}: getter {g.type}")
        if g is not None and g.type in DRIVE_GETTERS:
            raise Skip(SkipReason.GOOGLE_DRIVE, f"{where}.{role}: getter {g.type}")
    if func not in SUPPORTED_METRICS:
        raise Skip(SkipReason.UNSUPPORTED_METRIC, f"{where}: {func[:100]}")
    result = b.getter(call.result, "result", f"{where}.result")
    expected = b.getter(call.expected, "expected", f"{where}.expected")
    opts = call.options
    if func == "exact_match":
        r = _need(result, (Kind.TEXT,), func, "result", where)
        want = _rules(expected, func, where).get("expected")
        if not isinstance(want, str):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: exact_match needs rules.expected as text")
        b.text_equals(r.word, want, var)
    elif func == "match_in_list":
        r = _need(result, (Kind.TEXT,), func, "result", where)
        for want in _strings(_rules(expected, func, where).get("expected"), "rules.expected", where):
            b.text_equals(r.word, want, var)
    elif func in ("check_include_exclude", "is_in_list"):
        r = _need(result, (Kind.TEXT, Kind.FILE), func, "result", where)
        rules = _rules(expected, func, where)
        if func == "is_in_list":
            include, exclude = _strings(rules.get("expected"), "rules.expected", where)[:1], []
        else:
            include = _strings(rules.get("include", []), "rules.include", where)
            exclude = _strings(rules.get("exclude", []), "rules.exclude", where)
        if any("\n" in s or "\r" in s for s in include + exclude):
            b.python(_PY_INCLUDE, {"include": include, "exclude": exclude}, r.word, var)
            return
        # grep -F finds a text without line breaks wherever it is; LC_ALL=C compares bytes, as Python's `in`
        # compares characters. An empty text is in everything.
        text = b.text_of(r)
        tests = [f"[ -f {text} ]"]
        tests += [f"LC_ALL=C grep -qF -e {quote(s)} {text}" for s in include if s]
        tests += ([f"! LC_ALL=C grep -qF -e {quote(s)} {text}" for s in exclude if s]
                  if "" not in exclude else ["false"])
        b.piece.lines.append(f"if {' && '.join(tests)}; then {var}=True; fi")
    elif func == "literal_match":
        r = _need(result, (Kind.TEXT,), func, "result", where)
        if opts.get("type", "str") != "str":
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: literal_match of type {opts.get('type')!r}")
        rules = _rules(expected, func, where)
        want = rules.get("expected")
        if not isinstance(want, str):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: literal_match needs rules.expected as text")
        if opts.get("ignore_case"):
            x, y = b.tmp("x"), b.tmp("y")
            b.piece.lines.append(f"printf '%s' {quote(want)} | tr 'A-Z' 'a-z' > {x}; tr 'A-Z' 'a-z' < {r.word} > {y}; "
                                 f"if cmp -s {y} {x}; then {var}=True; fi")
        else:
            b.text_equals(r.word, want, var)
    elif func == "compare_text_file":
        r = _need(result, (Kind.FILE,), func, "result", where)
        e = _need(expected, (Kind.FILE,), func, "expected", where)
        norm = []
        if opts.get("ignore_case"):
            norm.append("tr 'A-Z' 'a-z'")
        if opts.get("ignore_blanks"):
            norm.append("tr '\\t\\n\\r' '   ' | tr -s ' ' | sed 's/^ //; s/ $//'")
        unknown = set(opts) - {"ignore_case", "ignore_blanks"}
        if unknown:
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: compare_text_file option {sorted(unknown)[0]}")
        # OSWorld reads both files as text: universal newlines first, then its options.
        rt, et = b.text_of(r), b.text_of(e)
        if norm:
            x, y = b.tmp("x"), b.tmp("y")
            chain = " | ".join(norm)
            # `cat FILE |`: a `< FILE` after a pipeline would feed its last command, not its first.
            b.piece.lines.append(f"if [ -f {rt} ] && [ -f {et} ]; then cat {rt} | {chain} > {x}; "
                                 f"cat {et} | {chain} > {y}; if cmp -s {x} {y}; then {var}=True; fi; fi")
        else:
            b.piece.lines.append(f"if [ -f {rt} ] && [ -f {et} ] && cmp -s {rt} {et}; "
                                 f"then {var}=True; fi")
    elif func == "check_json_settings":
        r = _need(result, (Kind.FILE,), func, "result", where)
        want = _rules(expected, func, where).get("expected")
        if not isinstance(want, dict):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: check_json_settings needs rules.expected as a mapping")
        b.python(_PY_JSON_SETTINGS, want, r.word, var)
    elif func == "check_list":
        r = _need(result, (Kind.FILE,), func, "result", where)
        rules = _rules(expected, func, where)
        spec = {"expect": _strings(rules.get("expect", []), "rules.expect", where),
                "unexpect": _strings(rules.get("unexpect", []), "rules.unexpect", where)}
        b.python(_PY_LIST, spec, r.word, var)
    elif func == INFEASIBLE:
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: infeasible beside other metrics")
    else:
        raise Skip(SkipReason.UNSUPPORTED_METRIC, f"{where}: {func[:100]}")


SUPPORTED_METRICS = ("exact_match", "match_in_list", "check_include_exclude", "is_in_list", "literal_match",
                     "compare_text_file", "check_json_settings", "check_list", INFEASIBLE)
SUPPORTED_GETTERS = ("vm_command_line", "vm_command_error", "vm_file", "rule (expected)", "cloud_file (expected)")


def is_infeasible(ev: Evaluator) -> bool:
    return ev.func == INFEASIBLE


# Universal newlines, as OSWorld's getters read a command's output and its metrics read a file as text:
# \r\n and a lone \r both become \n.
_NEWLINES = ["gh_cr=$(printf '\\r')", 'gh_nl() { sed "s/${gh_cr}\\$//" | tr \'\\015\' \'\\012\'; }']
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
    if g.type in ("cloud_file", "cache_file"):
        multi = bool(p.get("multi"))
        urls = p.get("path")
        urls = urls if multi else [urls]
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) and u for u in urls):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {g.type} without its URL(s) in path")
        gives = p.get("gives", [0]) if multi else [0]
        if not isinstance(gives, list) or not all(isinstance(k, int) and 0 <= k < len(urls) for k in gives):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {g.type} gives {gives!r}"[:200])
        dests = p.get("dest") if multi else [p.get("dest")]
        paths = []
        for k in sorted(set(gives)):
            b.n += 1
            name = f"e{b.n}{_suffix(dests[k] if isinstance(dests, list) and k < len(dests) else None)}"
            b.piece.add(place_file(b.fetcher.blob(urls[k], where), f'"$gh_w/{name}"', b.target, urls[k], where))
            paths.append(f"{_W_TOKEN}/{name}")
        # OSWorld gives one path when one file is given, else the list.
        return ({"type": "embedded_file", "path": paths[0]} if len(paths) == 1
                else {"type": "embedded_file", "paths": paths, "multi": True})
    if g.type not in guest_names.GETTERS:
        raise Skip(SkipReason.UNSUPPORTED_GETTER, f"{where}: {g.type[:100]}")
    return {"type": g.type, **p}


def _guest_options(call: MetricCall, where: str) -> None:
    """Options gh_osworld implements only in part say which (names.py: TABLE_RULES for compare_table)."""
    table_rules: frozenset[str] | None = getattr(guest_names, "TABLE_RULES", None)
    if call.func == "compare_table" and table_rules is not None:
        for rule in call.options.get("rules") or []:
            kind = rule.get("type") if isinstance(rule, dict) else None
            if kind not in table_rules:
                raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: compare_table rule of type {str(kind)[:60]}")


def _guest_check(b: _Builder, ev: Evaluator) -> None:
    """The check hands the evaluator to gh_osworld in the guest: `python3 -m gh_osworld SPEC` (spec.py)."""
    calls = ev.calls()
    metrics = []
    for i, call in enumerate(calls):
        where = f"evaluator.func[{i}]" if len(calls) > 1 else "evaluator"
        for role, g in (("result", call.result), ("expected", call.expected)):
            if g is not None and g.type in LIVE_WEB_GETTERS:
                raise Skip(SkipReason.LIVE_WEB, f"{where}.{role}: getter {g.type}")
            if g is not None and g.type in DRIVE_GETTERS:
                raise Skip(SkipReason.GOOGLE_DRIVE, f"{where}.{role}: getter {g.type}")
        if call.func == INFEASIBLE:
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: infeasible beside other metrics")
        if call.func not in guest_names.METRICS:
            raise Skip(SkipReason.UNSUPPORTED_METRIC, f"{where}: {call.func[:100]}")
        _guest_options(call, where)
        metrics.append({"func": call.func,
                        "result": _guest_getter(b, call.result, f"{where}.result"),
                        "expected": _guest_getter(b, call.expected, f"{where}.expected"),
                        "options": call.options})
    text = json.dumps({"conj": ev.conj, "metrics": metrics}, ensure_ascii=False)
    if _W_TOKEN in json.dumps(ev.model_dump(mode="json"), ensure_ascii=False):  # it would be replaced too
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"evaluator: the text {_W_TOKEN} in the task")
    b.piece.lines += [*embed_bytes(text.encode(), '"$gh_w/spec.in"'),
                      f'sed "s|{_W_TOKEN}|$gh_w|g" "$gh_w/spec.in" > "$gh_w/spec.json" || exit 1',
                      # Prints True or False; exit 1 is no verdict (ours), never a failure of the agent.
                      'python3 -m gh_osworld "$gh_w/spec.json" || exit 1']
    b.piece.needs.add(Need.PYTHON3)


def translate_evaluator(ev: Evaluator, fetcher: Fetcher, target: Target) -> Piece:
    """The check's body (after the shims): the answer rule, the checkers, postconfig, getters, metrics,
    verdict; on a target that carries gh_osworld, the getters and metrics are its."""
    if is_infeasible(ev):
        return Piece([*_ANSWER, f'case "$gh_a" in {_SAYS_INFEASIBLE}) echo True ;; *) echo False ;; esac'])
    b = _Builder(fetcher, target)
    guest = target.carries(Carry.GH_OSWORLD)
    # The directory's name is made of characters that need no quoting in JSON or sed (the spec names it).
    mk = ('gh_w=$(mktemp -d "${TMPDIR:-/tmp}/gh-check.XXXXXXXX") && case $gh_w in *[!A-Za-z0-9/._-]*) false ;; esac'
          if guest else "gh_w=$(mktemp -d)")
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
            *_NEWLINES, *had, *placed.lines]
    if rest.lines:
        head += ['if [ "${GH_CHECK_PHASE:-}" = after ]; then', *rest.lines, "fi >/dev/null 2>&1"]
    b.piece.needs |= placed.needs | rest.needs
    b.piece.store.update(placed.store)
    b.piece.store.update(rest.store)
    if guest:
        _guest_check(b, ev)
        return Piece([*head, *b.piece.lines], b.piece.needs, b.piece.store)
    calls = ev.calls()
    names = []
    for i, call in enumerate(calls):
        var = f"gh_m{i}"
        b.piece.lines.append(f"{var}=False")
        _metric(b, call, var, f"evaluator.func[{i}]" if len(calls) > 1 else "evaluator")
        names.append(var)
    op = " && " if ev.conj == "and" else " || "
    verdict = op.join(f'[ "${v}" = True ]' for v in names)
    return Piece([*head, *b.piece.lines, f"if {verdict}; then echo True; else echo False; fi"], b.piece.needs,
                 b.piece.store)

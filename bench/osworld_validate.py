"""OSWorld's tasks imported for osworld-desktop and run on real machines: is each one a sound case?

    .venv/bin/python bench/osworld_validate.py OSWORLD_CHECKOUT [--sample N] [--domain D ...] [--work DIR]
        [--images-dir /var/tmp/gh-runner/osworld-images] [--config examples/osworld-runner.yaml]

1. Files. Every `download`, `cloud_file` and `cache_file` of the tasks is looked up in --files-dir (as
   `gh-runner import osworld --fetch-only` or an earlier import left it: `sha256/<hex>` and `urls.json`).
   A file not there gets a stand-in of the right type for its name, made on this host (which has no
   network): an .xlsx, .docx or .pptx written with the guest's own openpyxl, python-docx and python-pptx
   (tests/osworld_guest/kit.py), an image with PIL, a PDF, a zip or tar archive, text for the text types;
   other types (audio, video, GIMP's .xcf) get bytes that only name themselves. A setup that opens a
   stand-in then opens a real document; what a stand-in cannot be is the task's real content, so a
   stand-in never tells whether the reference would pass, only whether the check before is False.
   Each stand-in carries its URL's hash, so two files of a task are never the same by accident.
2. `gh-runner import osworld` of the whole checkout onto osworld-desktop: per domain, imported and
   skipped by reason.
3. The imported tasks (all, or --sample N per domain, --domain to choose) run on fresh machines, one try
   each: `gh-runner validate` for the infeasible tasks (noop must fail, the reference answer
   "infeasible" must pass) and `gh-runner local --agents noop` for the others. OSWorld ships no reference
   solution for a feasible task, so the reference agent would have nothing to run there: those tasks are
   judged on the check before and noop only.
4. Per domain: the check before False / True / no verdict, noop failed / passed, the infeasible tasks
   passed with the reference answer, and errors; every exception is named with its evaluator and the
   check's output, which says why.

A bench, not a test: a full run is hours under TCG (two machines at a time on 2 cores).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]  # the test kit, as pytest has it

from osworld_guest.kit import make  # noqa: E402

from gh_local.osworld.task import load_tasks  # noqa: E402

GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")
IMPORT_TIMEOUT_S = 3600.0
PER_CASE_S = 900.0  # the bound on one case's tries, for the run's own deadline (10-minute task limit + machine)

# -- stand-ins --

_OFFICE = {"xlsx", "docx", "pptx"}
_IMAGES = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG", "gif": "GIF", "webp": "WEBP", "bmp": "BMP"}
_TEXT = {"txt", "md", "csv", "json", "py", "sh", "html", "htm", "css", "js", "srt", "tex", "bib", "eml",
         "code-workspace", "xml", "yaml", "yml", "ini", "conf", "log"}

# One call of the guest's Python makes every office document and image of a run.
_MAKE = """import docx, openpyxl, pptx
from PIL import Image
for job in jobs:
    kind, path, token = job["kind"], job["path"], job["token"]
    if kind == "xlsx":
        wb = openpyxl.Workbook()
        ws = wb.active
        ws.append(["stand-in", token])
        ws.append([1, 2])
        wb.save(path)
    elif kind == "docx":
        d = docx.Document()
        d.add_paragraph("stand-in " + token)
        d.save(path)
    elif kind == "pptx":
        p = pptx.Presentation()
        s = p.slides.add_slide(p.slide_layouts[1])
        s.shapes.title.text = "stand-in"
        s.placeholders[1].text = token
        p.save(path)
    else:
        seed = int(token[:6], 16)
        im = Image.new("RGB", (64, 48), ((seed >> 16) & 255, (seed >> 8) & 255, seed & 255))
        im.save(path, kind)
"""


def extension(name: str) -> str:
    base = name.replace("\\", "/").rsplit("/", 1)[-1].lower()
    for double in ("tar.gz", "tar.xz", "tar.bz2"):
        if base.endswith("." + double):
            return double
    return base.rsplit(".", 1)[-1] if "." in base else ""


def _pdf(token: str) -> bytes:
    """A one-page PDF saying `token` (written by hand: the host has no PDF library)."""
    text = f"BT /F1 18 Tf 72 720 Td (stand-in {token}) Tj ET".encode()
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
            b"/Resources << /Font << /F1 5 0 R >> >> >>",
            b"<< /Length %d >>\nstream\n" % len(text) + text + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = b"%PDF-1.4\n", []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)


def _archive(ext: str, token: str) -> bytes:
    buf = io.BytesIO()
    data = f"stand-in {token}\n".encode()
    if ext == "zip" or ext in ("epub", "vsix"):
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("stand-in.txt", data)
    else:
        mode = {"tar.gz": "w:gz", "tar.xz": "w:xz", "tar.bz2": "w:bz2"}[ext]
        with tarfile.open(fileobj=buf, mode=mode) as tar:  # type: ignore[call-overload]
            info = tarfile.TarInfo("stand-in.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


_ODF_NS = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
           'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
           'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" office:version="1.2"')


def _odf(ext: str, token: str) -> bytes:
    """A one-paragraph .odt or one-cell .ods: the least an ODF package is (its mimetype first and stored,
    a manifest, content.xml), which LibreOffice opens and an .odt reader parses."""
    mime = {"odt": "application/vnd.oasis.opendocument.text",
            "ods": "application/vnd.oasis.opendocument.spreadsheet"}[ext]
    para = f"<text:p>stand-in {token}</text:p>"
    body = (f"<office:text>{para}</office:text>" if ext == "odt" else
            f'<office:spreadsheet><table:table table:name="Sheet1"><table:table-row>'
            f'<table:table-cell office:value-type="string">{para}</table:table-cell>'
            f"</table:table-row></table:table></office:spreadsheet>")
    manifest = ('<?xml version="1.0" encoding="UTF-8"?><manifest:manifest '
                'xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" manifest:version="1.2">'
                f'<manifest:file-entry manifest:full-path="/" manifest:media-type="{mime}"/>'
                '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
                "</manifest:manifest>")
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {_ODF_NS}>'
               f"<office:body>{body}</office:body></office:document-content>")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), mime, compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/manifest.xml", manifest)
        z.writestr("content.xml", content)
    return buf.getvalue()


def _text(ext: str, token: str) -> bytes:
    if ext in ("json", "code-workspace"):
        return json.dumps({"stand_in": token}).encode() + b"\n"
    if ext == "csv":
        return f"stand_in,token\n1,{token}\n".encode()
    if ext in ("html", "htm"):
        return f"<!doctype html><title>stand-in</title><p>{token}</p>\n".encode()
    if ext == "sh":
        return f"#!/bin/sh\necho stand-in {token}\n".encode()
    if ext == "py":
        return f"print('stand-in {token}')\n".encode()
    return f"stand-in {token}\n".encode()


@dataclass
class Wanted:
    url: str
    name: str  # the path or dest it is saved as: its extension says what it is


def wanted_files(task: dict[str, Any]) -> list[Wanted]:
    """Every file a task fetches: its download steps' files, its cloud_file and cache_file getters."""
    out: list[Wanted] = []

    def walk(o: Any) -> None:
        if isinstance(o, dict):
            if o.get("type") in ("cloud_file", "cache_file"):
                paths, dests = o.get("path"), o.get("dest")
                if isinstance(paths, list):
                    names = dests if isinstance(dests, list) else [str(dests)] * len(paths)
                    out.extend(Wanted(p, str(d)) for p, d in zip(paths, names, strict=False) if isinstance(p, str))
                elif isinstance(paths, str):
                    out.append(Wanted(paths, str(dests or paths)))
            if o.get("type") == "download":
                for f in (o.get("parameters") or {}).get("files") or []:
                    if isinstance(f, dict) and isinstance(f.get("url"), str):
                        out.append(Wanted(f["url"], str(f.get("path") or f["url"])))
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(task)
    return out


def fill_stand_ins(wanted: list[Wanted], files_dir: Path, scratch: Path) -> collections.Counter[str]:
    """Stand-ins for the files not already in files_dir, stored as the importer's Fetcher keeps them.
    Returns how many were made, by extension."""
    index_path = files_dir / "urls.json"
    index: dict[str, str] = json.loads(index_path.read_text()) if index_path.is_file() else {}
    todo = {w.url: w for w in wanted if not (index.get(w.url) and (files_dir / "sha256" / index[w.url]).is_file())}
    made: collections.Counter[str] = collections.Counter()
    jobs, paths = [], {}
    for url, w in todo.items():
        token = hashlib.sha256(url.encode()).hexdigest()[:16]
        ext = extension(w.name)
        path = scratch / f"{token}.{ext or 'bin'}"
        paths[url] = path
        if ext in _OFFICE:
            jobs.append({"kind": ext, "path": str(path), "token": token})
        elif ext in _IMAGES:
            jobs.append({"kind": _IMAGES[ext], "path": str(path), "token": token})
        elif ext == "pdf":
            path.write_bytes(_pdf(token))
        elif ext in ("zip", "epub", "vsix", "tar.gz", "tar.xz", "tar.bz2"):
            path.write_bytes(_archive(ext, token))
        elif ext in ("odt", "ods"):
            path.write_bytes(_odf(ext, token))
        elif ext in _TEXT:
            path.write_bytes(_text(ext, token))
        else:  # audio, video, .xcf, ...: nothing here can write them
            path.write_bytes(f"stand-in {token} ({ext or 'no extension'}): not a real file of its type\n".encode())
        made[ext or "(none)"] += 1
    if jobs:
        make(_MAKE, scratch, jobs=jobs)
    (files_dir / "sha256").mkdir(parents=True, exist_ok=True)
    for url, path in paths.items():
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (files_dir / "sha256" / digest).write_bytes(data)
        index[url] = digest
    tmp = index_path.with_suffix(".partial")
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    tmp.replace(index_path)
    return made


# -- import --

_LINE = re.compile(r"^(?P<id>\S+): (?:imported|skipped: (?P<reason>[a-z_]+))")
_WARNED = re.compile(r"^(?P<id>\S+): warning: ")


@dataclass
class Imported:
    outcome: list[tuple[str, str]]  # (task id, "imported" or the skip reason), in the order the tasks were read
    warned: list[int]  # indexes into outcome: imported with a warning that the check may pass untouched


def run_import(index: Path, out: Path, files_dir: Path, start_state: str) -> Imported:
    """What the importer said of each task, in the order it read them (by position: an id may be in two
    domains, OSWorld lists some tasks under multi_apps and under their application's domain)."""
    p = subprocess.run([GH_RUNNER, "import", "osworld", str(index), "--start-state", start_state, "--out", str(out),
                        "--files-dir", str(files_dir), "--offline"],
                       capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    if p.returncode not in (0, 1):
        sys.exit(f"gh-runner import osworld failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    got = Imported([], [])
    for line in p.stdout.splitlines():
        if "too large to embed" in line or line.startswith("build it with:"):
            # their setups fail on an image built without these files: say so before hours of runs
            print(f"{line}  (GH_OSWORLD_FILES_DIR={files_dir} bash scripts/osworld-image.sh)"
                  if line.startswith("build it with:") else line, flush=True)
        elif (m := _LINE.match(line)) is not None:
            got.outcome.append((m["id"], m["reason"] or "imported"))
        elif (w := _WARNED.match(line)) is not None and got.outcome and got.outcome[-1][0] == w["id"]:
            got.warned.append(len(got.outcome) - 1)
    return got


# -- runs --

@dataclass
class Tally:
    sampled: int = 0
    before: collections.Counter[str] = field(default_factory=collections.Counter)  # False | True | none | not run
    noop: collections.Counter[str] = field(default_factory=collections.Counter)  # failed | passed | error
    infeasible: collections.Counter[str] = field(default_factory=collections.Counter)  # passed | failed | error
    notes: list[str] = field(default_factory=list)


def _last_line(text: str | None) -> str | None:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1] if lines else None


def run_cases(cases: list[dict[str, Any]], agents: list[str], work: Path, name: str,
              args: argparse.Namespace) -> dict[str, Any]:
    """One `gh-runner validate` (noop and reference) or `gh-runner local --agents noop` run; its report."""
    if not cases:
        return {}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"cases": cases}, sort_keys=False, allow_unicode=True))
    report = work / f"{name}-report.json"
    report.unlink(missing_ok=True)
    command = "validate" if agents == ["noop", "reference"] else "local"
    argv = [GH_RUNNER, command, str(path), "--repeat", "1", "--report", str(report), "--config", str(args.config),
            "--images-dir", str(args.images_dir)]
    if command == "local":
        argv += ["--agents", ",".join(agents)]
    if args.slots:
        argv += ["--slots", str(args.slots)]
    deadline = PER_CASE_S * len(cases) * len(agents) / max(1, args.slots or 2) + 1800
    started = time.monotonic()
    print(f"{name}: {len(cases)} cases, agents {','.join(agents)}: {' '.join(argv[1:])}", flush=True)
    with open(work / f"{name}.log", "w") as log:
        p = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=deadline)
    print(f"{name}: exit {p.returncode} after {time.monotonic() - started:.0f} s (log {work / f'{name}.log'})",
          flush=True)
    return json.loads(report.read_text()) if report.is_file() else {}


def tally(report: dict[str, Any], cases: dict[str, dict[str, Any]], tallies: dict[str, Tally]) -> None:
    for a in report.get("attempts") or []:
        case = cases.get(a.get("key") or "")
        if case is None:
            continue
        t = tallies[case["category"]]
        meta = case["metadata"]
        label = f"{a['key']} [{meta.get('osworld_evaluator', '')[:80]}]"
        check = a.get("check") or {}
        before = _last_line(check.get("before"))
        phase = (a.get("metrics") or {}).get("error_phase")
        if before in ("True", "False"):
            t.before[before] += 1
            if before == "True":
                t.notes.append(f"check before True: {label}: {(check.get('before') or '')[-300:]!r}")
        elif check.get("before") is not None or phase == "check_before":
            t.before["no verdict"] += 1
            t.notes.append(f"check before gave no verdict: {label}: {(check.get('before') or '')[-400:]!r}")
        else:
            t.before["not run"] += 1
        outcome = a.get("outcome") or "unfinished"
        if outcome == "error":
            t.notes.append(f"error ({a.get('agent_id')}, phase {phase}, cause {a.get('error_cause')}): {label}: "
                           f"{str(a.get('error'))[:300]}")
        if a.get("agent_id") == "noop":
            t.noop[outcome] += 1
            if outcome == "passed":
                t.notes.append(f"noop passed: {label}: {(check.get('after') or '')[-300:]!r}")
        elif a.get("agent_id") == "reference" and "reference_answer" in meta:
            t.infeasible[outcome] += 1
            if outcome != "passed":
                after = (check.get("after") or "")[-300:]
                t.notes.append(f"infeasible, reference answer {outcome}: {label}: {after!r}")


def _fmt(c: collections.Counter[str], keys: tuple[str, ...]) -> str:
    return " / ".join(str(c.get(k, 0)) for k in keys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkout", type=Path,
                    help="an OSWorld checkout (its evaluation_examples/test_all.json), or an index")
    ap.add_argument("--work", type=Path, default=None, help="where the cases, reports and logs go (default: a new "
                                                            "directory under /var/tmp, kept)")
    ap.add_argument("--files-dir", type=Path, default=None, help="the importer's files (default: WORK/files); "
                                                                "files missing there get stand-ins")
    ap.add_argument("--start-state", default="osworld-desktop")
    ap.add_argument("--sample", type=int, default=None, metavar="N", help="N imported tasks per domain (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="which sample (default 0)")
    ap.add_argument("--domain", action="append", default=None, help="only this domain (repeat for more)")
    ap.add_argument("--images-dir", type=Path,
                    default=Path(os.environ.get("GH_OSWORLD_IMAGES_DIR", "/var/tmp/gh-runner/osworld-images")))
    ap.add_argument("--config", type=Path, default=REPO / "examples" / "osworld-runner.yaml")
    ap.add_argument("--slots", type=int, default=None, help="machines at once (default: the config's)")
    ap.add_argument("--import-only", action="store_true", help="stop after the import's counts")
    args = ap.parse_args()

    index = args.checkout
    if index.is_dir():
        index = index / "evaluation_examples" / "test_all.json"
    work = args.work or Path(tempfile.mkdtemp(prefix="gh-osworld-validate-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    files_dir = args.files_dir or work / "files"
    files_dir.mkdir(parents=True, exist_ok=True)
    print(f"work: {work}", flush=True)

    loaded = load_tasks([index])
    wanted = [w for lt in loaded for w in wanted_files(json.loads(lt.path.read_text()))]
    scratch = Path(tempfile.mkdtemp(prefix="stand-ins-", dir=work))
    made = fill_stand_ins(wanted, files_dir, scratch)
    print(f"files: {len({w.url for w in wanted})} distinct URLs; stand-ins made now: {sum(made.values())} "
          f"({', '.join(f'{k} {n}' for k, n in made.most_common())})", flush=True)

    cases_path = work / "cases.yaml"
    imported = run_import(index, cases_path, files_dir, args.start_state)
    if [tid for tid, _ in imported.outcome] != [lt.task.id for lt in loaded]:
        sys.exit("gh-runner import osworld did not print one line per task in the order they were read")
    per_domain: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for i, (lt, (_, what)) in enumerate(zip(loaded, imported.outcome, strict=True)):
        per_domain[lt.domain or "?"][what] += 1
        if i in imported.warned:
            per_domain[lt.domain or "?"]["(warned)"] += 1
    total = sum(c["imported"] for c in per_domain.values())
    print(f"\nimport onto {args.start_state}: {total} of {len(imported.outcome)} imported, "
          f"{len(imported.warned)} of them warned (may pass untouched)")
    for domain, c in sorted(per_domain.items()):
        skips = ", ".join(f"{k} {n}" for k, n in c.most_common() if k not in ("imported", "(warned)"))
        print(f"  {domain:<20} {c['imported']:>3} of {sum(c.values()) - c['(warned)']:>3} imported"
              + (f" ({c['(warned)']} warned)" if c["(warned)"] else "") + (f"; skipped: {skips}" if skips else ""))
    if args.import_only or not cases_path.is_file():
        return

    cases = yaml.safe_load(cases_path.read_text())["cases"]
    by_domain: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for c in cases:
        if args.domain is None or c["category"] in args.domain:
            by_domain[c["category"]].append(c)
    rng = random.Random(args.seed)
    chosen: list[dict[str, Any]] = []
    for domain in sorted(by_domain):
        group = sorted(by_domain[domain], key=lambda c: c["key"])
        chosen += rng.sample(group, min(args.sample, len(group))) if args.sample is not None else group
    print(f"\nrunning {len(chosen)} tasks: " + ", ".join(f"{d} {sum(c['category'] == d for c in chosen)}"
                                                     for d in sorted(by_domain)), flush=True)
    infeasible = [c for c in chosen if "reference_answer" in c["metadata"]]
    feasible = [c for c in chosen if "reference_answer" not in c["metadata"]]
    tallies: dict[str, Tally] = collections.defaultdict(Tally)
    for case in chosen:
        tallies[case["category"]].sampled += 1
    keyed = {case["key"]: case for case in chosen}
    tally(run_cases(feasible, ["noop"], work, "feasible", args), keyed, tallies)
    tally(run_cases(infeasible, ["noop", "reference"], work, "infeasible", args), keyed, tallies)

    print(f"\n{'domain':<20} {'run':>4}  {'machines: before F/T/none/not run':>34}  {'noop failed/passed/error':>25}  "
          f"{'infeasible passed/of':>20}")
    for domain in sorted(tallies):
        t = tallies[domain]
        inf = f"{t.infeasible.get('passed', 0)}/{sum(t.infeasible.values())}"
        print(f"{domain:<20} {t.sampled:>4}  {_fmt(t.before, ('False', 'True', 'no verdict', 'not run')):>34}  "
              f"{_fmt(t.noop, ('failed', 'passed', 'error')):>25}  {inf:>20}")
    for domain in sorted(tallies):
        for note in tallies[domain].notes:
            print(f"  {domain}: {note}")


if __name__ == "__main__":
    main()

"""gh_osworld's metrics side by side with OSWorld's own, on the same files: do we give OSWorld's numbers?

    .venv/bin/python bench/osworld_fidelity.py [--write-oracle] [--keep-venv DIR] [--guest-site DIR]
                                               [--oracle-pin SPEC ...] [--versus-recorded]

1. A throwaway venv under /var/tmp (removed at the end; --keep-venv reuses one and leaves it) with
   OSWorld's published package, `desktop-env` (DESKTOP_ENV), installed with --no-deps, and only the
   libraries the metric modules loaded here import (ORACLE_LIBRARIES: pinned as desktop-env's own
   requirements pin them, its newest release elsewhere, as `pip install desktop-env` gets them).
2. The pairs of tests/osworld_guest/fidelity_pairs.py written to a scratch directory, on the guest's
   python3 (kit.py), and our score of each as the guest gives it (gh_osworld's evaluation).
3. OSWorld's score of each, in the venv: its metric modules loaded one by one (desktop_env's packages
   stand as empty modules: the metrics package's __init__ imports every module and their libraries,
   torch among them); the OCR and audio libraries of docs.py and vlc.py (STAND_INS) stand as empty
   modules, used by none of the metrics measured. OSWorld runs on a copy of the files (some of its
   metrics write beside them), and its URL comparison (tldextract) on tldextract's bundled public suffix
   list: nothing is fetched. A pair's `value` (a getter's JSON: Chrome's tabs, a window's size) is
   OSWorld's result as it is.
4. One row per metric: pairs, pairs where OSWorld crashes (no number to compare: listed by id), the
   largest |ours - OSWorld's|, and how many pairs differ by more than TOLERANCE (listed with both numbers).

--oracle-pin SPEC (repeatable: `scikit-image==0.24.0`) replaces the oracle's requirement of that library, and
--versus-recorded compares that oracle with the numbers recorded in the oracle file in place of ours: whether
an older library (one Debian 12's numpy, scipy and Pillow can run) gives OSWorld's numbers as recorded.

--write-oracle writes OSWorld's numbers, the files' sha256 and the versions to
tests/osworld_guest/fidelity_oracle.json, which tests/osworld_guest/test_fidelity.py checks with no network.
About a minute: the venv's install (40 s with a warm pip cache), then about 10 s for the pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]  # the test kit, as pytest has it

from osworld_guest.kit import GUEST_PYTHON, guest_env  # noqa: E402

DESKTOP_ENV = "desktop-env==1.0.2"
# What the metric modules loaded import, beyond the standard library; pins are desktop-env 1.0.2's own.
ORACLE_LIBRARIES = ["numpy>=1.26,<2", "Pillow~=11.0.0", "pandas>=2.2,<2.3", "opencv-python-headless>=4.5,<5",
                    "rapidfuzz", "pymupdf", "scikit-image", "python-docx", "python-pptx", "openpyxl",
                    "pdfplumber", "pyyaml", "lxml", "cssselect", "mutagen", "beautifulsoup4", "imagehash",
                    "borb", "odfpy", "pypdf", "PyPDF2", "scipy", "formulas", "xmltodict", "tldextract"]
# Imported by the loaded modules for metrics not measured here (OCR in docs.py, audio in vlc.py): empty
# modules stand for them (numba and torch are minutes of install for nothing measured).
STAND_INS = ["easyocr", "acoustid", "librosa", "fastdtw"]
# OSWorld's module of each metric measured (desktop_env/evaluators/metrics/__init__.py says where each is).
ORACLE_MODULES = {
    "compare_images": "vlc", "compare_pdfs": "chrome", "compare_archive": "chrome", "diff_text_file": "general",
    "compare_epub": "others", "run_sqlite3": "general", "compare_docx_files": "docs",
    "check_structure_sim": "gimp", "check_structure_sim_resized": "gimp",
    "check_file_exists_and_structure_sim": "gimp", "check_palette_and_structure_sim": "gimp",
    "check_brightness_decrease_and_structure_sim": "gimp", "check_contrast_increase_and_structure_sim": "gimp",
    "check_saturation_increase_and_structure_sim": "gimp",
    "fuzzy_match": "general", "exact_match": "general", "check_include_exclude": "general",
    "compare_text_file": "vscode", "compare_csv": "table", "compare_docx_files_and_ignore_new_lines": "docs",
    "compare_table": "table", "compare_pptx_files": "slides",
    "check_json": "general", "compare_config": "vscode", "file_contains": "general",
    "check_line_number": "general", "is_in_list": "general", "compare_python_pure_text": "general",
    "compare_result_files": "vscode", "compare_zip_files": "vscode",
    "compare_docx_tables": "docs", "compare_line_spacing": "docs", "compare_subscript_contains": "docs",
    "compare_docx_lines": "docs", "evaluate_strike_through_last_paragraph": "docs",
    "check_italic_font_size_14": "docs", "is_first_line_centered": "docs", "has_page_numbers_in_footers": "docs",
    "contains_page_break": "docs", "compare_font_names": "docs", "check_tabstops": "docs",
    "check_image_mirror": "gimp", "check_green_background": "gimp", "check_image_size": "gimp",
    "check_image_file_size": "gimp", "check_triangle_position": "gimp", "compare_image_list": "gimp",
    "check_csv": "general", "check_list": "general", "check_json_settings": "vscode",
    "evaluate_presentation_fill_to_rgb_distance": "slides", "check_slide_orientation_Portrait": "slides",
    "check_transition": "slides", "compare_references": "docs", "evaluate_colored_words_in_tables": "docs",
    "compare_docx_images": "docs", "compare_contains_image": "docs", "find_default_font": "docs",
    "check_config_status": "gimp", "is_utc_0": "basic_os", "check_text_enlarged": "basic_os",
    "check_gnome_favorite_apps": "basic_os",
    "check_qt_bgcone": "vlc", "check_qt_max_volume": "vlc", "check_qt_minimal_view": "vlc",
    "check_qt_slider_colours": "vlc", "check_global_key_play_pause": "vlc",
    "check_one_instance_when_started_from_file": "vlc", "is_vlc_recordings_folder": "vlc", "is_vlc_playing": "vlc",
    "is_vlc_fullscreen": "vlc",
    "check_thunderbird_prefs": "thunderbird", "check_thunderbird_filter": "thunderbird",
    "check_accessibility_tree": "general", "check_highlighted_words": "docs",
    "literal_match": "general", "check_direct_json_object": "general", "check_moved_jpgs": "basic_os",
    "is_in_vm_clickboard": "basic_os", "is_extension_installed": "vscode", "check_json_keybindings": "vscode",
    "check_presenter_console_disable": "slides", "check_auto_saving_time": "slides",
    "check_page_number_colors": "slides", "check_image_stretch_and_center": "slides",
    "check_thunderbird_folder": "thunderbird", "compare_time_in_speedtest_results": "general",
    **{name: "chrome" for name in (
        "is_expected_active_tab", "is_expected_url_pattern_match", "is_expected_search_query", "is_expected_tabs",
        "is_expected_bookmarks", "check_history_deleted", "is_cookie_deleted", "check_enabled_experiments",
        "check_font_size", "is_expected_installed_extensions", "is_shortcut_on_desktop")},
}
TOLERANCE = 1e-3
PIP_TIMEOUT_S = 900
RUN_TIMEOUT_S = 600
PAIRS = REPO / "tests" / "osworld_guest" / "fidelity_pairs.py"
ORACLE_FILE = REPO / "tests" / "osworld_guest" / "fidelity_oracle.json"

# Run in the venv: OSWorld's metric of every pair, {id: number | null (it crashed)} on stdout.
ORACLE_WORKER = r"""
import importlib, json, os, sys, types, io, contextlib, logging
logging.disable(logging.CRITICAL)
root, modules, stand_ins = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
pairs = json.load(sys.stdin)
import importlib.util
base = importlib.util.find_spec("desktop_env").submodule_search_locations[0]
for name, sub in (("desktop_env", ""), ("desktop_env.evaluators", "evaluators"),
                  ("desktop_env.evaluators.metrics", "evaluators/metrics")):
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(base, sub)]
    sys.modules[name] = m
for name in stand_ins:
    sys.modules[name] = types.ModuleType(name)
for name in ("fastdtw",):
    sys.modules[name].fastdtw = None
out = {}
for p in pairs:
    f = getattr(importlib.import_module("desktop_env.evaluators.metrics." + modules[p["func"]]), p["func"])
    result = p["text"] if p["text"] is not None else os.path.join(root, p["result"]) if p["result"] else None
    if p.get("value") is not None:
        result = p["value"]
    expected = p["rules"] if p["rules"] is not None else os.path.join(root, p["expected"]) if p["expected"] else None
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            # OSWorld passes no expected value to a metric whose task gives none
            value = f(result, expected, **p["options"]) if expected is not None else f(result, **p["options"])
        out[p["id"]] = None if value is None else float(value)
    except Exception as e:
        out[p["id"]] = {"crash": type(e).__name__ + ": " + str(e).replace(root, "DIR")[:200]}
print(json.dumps(out))
"""


def _run(argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None,
         timeout: float = RUN_TIMEOUT_S, cwd: Path | None = None) -> str:
    p = subprocess.run(argv, env=env, input=stdin, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if p.returncode != 0:
        raise SystemExit(f"{argv[0]} {argv[1:3]} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


def _name(spec: str) -> str:
    return re.split(r"[<>=~!\[; ]", spec, maxsplit=1)[0].lower().replace("_", "-")


def oracle_libraries(pins: list[str]) -> list[str]:
    """ORACLE_LIBRARIES with each pin in place of the requirement of its library (or added)."""
    pinned = {_name(p): p for p in pins}
    return [pinned.pop(_name(spec), spec) for spec in ORACLE_LIBRARIES] + list(pinned.values())


def make_venv(where: Path, libraries: list[str]) -> Path:
    py = where / "bin" / "python"
    if not py.exists():
        _run([GUEST_PYTHON, "-m", "venv", str(where)])
        _run([str(py), "-m", "pip", "install", "-q", "--no-deps", DESKTOP_ENV], timeout=PIP_TIMEOUT_S)
        _run([str(py), "-m", "pip", "install", "-q", *libraries], timeout=PIP_TIMEOUT_S)
    return py


def versions(py: Path) -> dict[str, str]:
    names = ["desktop-env", "rapidfuzz", "pymupdf", "scikit-image", "python-docx", "numpy", "pillow", "scipy"]
    code = ("import importlib.metadata as m, json, sys\n"
            "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))")
    return json.loads(_run([str(py), "-c", code, *names]))


def close(a: float | None, b: Any) -> bool:
    if not isinstance(b, (int, float)) or a is None:
        return False
    return abs(a - float(b)) <= TOLERANCE


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-oracle", action="store_true", help=f"write OSWorld's numbers to {ORACLE_FILE}")
    ap.add_argument("--keep-venv", type=Path, help="the oracle's venv: made if absent, reused, not removed")
    ap.add_argument("--guest-site", type=Path, help="the guest's PyPI modules from DIR in place of kit.py's "
                    "GUEST_SITE (an empty directory: Debian's modules alone)")
    ap.add_argument("--oracle-pin", action="append", default=[], metavar="SPEC",
                    help="the oracle's requirement of a library replaced (scikit-image==0.24.0); repeatable")
    ap.add_argument("--versus-recorded", action="store_true",
                    help=f"compare the oracle with the numbers recorded in {ORACLE_FILE.name}, not with ours")
    args = ap.parse_args()
    env = guest_env()
    if args.guest_site:
        env["PYTHONPATH"] = f"{REPO}:{args.guest_site}"

    scratch = Path(tempfile.mkdtemp(prefix="gh-fidelity-", dir="/var/tmp"))
    try:
        venv = args.keep_venv or scratch / "venv"
        py = make_venv(venv, oracle_libraries(args.oracle_pin))
        print("the oracle's libraries:", json.dumps(versions(py)))
        files, theirs_dir = scratch / "pairs", scratch / "osworld-copy"
        made = json.loads(_run([GUEST_PYTHON, str(PAIRS), "make", str(files)], env=env))
        pairs = made["pairs"]
        ours = json.loads(_run([GUEST_PYTHON, str(PAIRS), "ours", str(files)], env=env))
        shutil.copytree(files, theirs_dir)
        theirs = json.loads(_run([str(py), "-c", ORACLE_WORKER, str(theirs_dir), json.dumps(ORACLE_MODULES),
                                  json.dumps(STAND_INS)],
                                 stdin=json.dumps(pairs), env={"PATH": os.environ["PATH"], "HOME": str(scratch),
                                                              # tldextract's bundled suffix list, not the network's
                                                              "TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS": ""},
                                 cwd=scratch))  # some of OSWorld's metrics write temporary files there
        if args.versus_recorded:
            recorded = json.loads(ORACLE_FILE.read_text(encoding="utf-8"))["osworld"]
            ours = {i: (None if isinstance(v, dict) or v is None else float(v)) for i, v in recorded.items()}
            print(f"left: OSWorld's numbers as recorded in {ORACLE_FILE.name}; right: this oracle's")
        report(pairs, ours, theirs)
        if args.write_oracle:
            ORACLE_FILE.write_text(json.dumps({
                "note": "OSWorld's numbers for tests/osworld_guest/fidelity_pairs.py, by bench/osworld_fidelity.py",
                "versions": versions(py), "guest": made["guest"], "sha256": made["sha256"], "osworld": theirs},
                indent=1, sort_keys=True)
                + "\n", encoding="utf-8")
            print(f"wrote {ORACLE_FILE.relative_to(REPO)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(pairs: list[dict[str, Any]], ours: dict[str, float | None], theirs: dict[str, Any]) -> None:
    rows: dict[str, list[str]] = {}
    for p in pairs:
        rows.setdefault(p["func"], []).append(p["id"])
    print(f"{'metric':46} {'pairs':>5} {'OSWorld crashes':>15} {'max |diff|':>10} {'> 0.001':>7}")
    total_over = total = 0
    notes = []
    for func, ids in rows.items():
        crashed = [i for i in ids if isinstance(theirs[i], dict)]
        compared = [i for i in ids if i not in crashed]
        diffs = [abs((ours[i] if ours[i] is not None else float("inf")) - float(theirs[i] or 0.0))
                 for i in compared]
        over = [i for i in compared if not close(ours[i], theirs[i] or 0.0)]
        total += len(ids)
        total_over += len(over)
        worst = max(diffs, default=0.0)
        print(f"{func:46} {len(ids):5} {len(crashed):15} {worst:10.4f} {len(over):7}")
        notes += [f"  {i}: ours {ours[i]!r}, OSWorld {theirs[i]!r}" for i in over]
        notes += [f"  {i}: OSWorld crashes ({theirs[i]['crash']}), ours {ours[i]!r}" for i in crashed]
    print(f"{'all':46} {total:5} {'':15} {'':10} {total_over:7}")
    compared_all = [p["id"] for p in pairs if not isinstance(theirs[p["id"]], dict)]
    same = [i for i in compared_all if ours[i] is not None and ours[i] == float(theirs[i] or 0.0)]
    print(f"equal to the bit: {len(same)} of the {len(compared_all)} pairs both score")
    if notes:
        print("\n".join(["", "pairs over the tolerance, and OSWorld's crashes:", *notes]))


if __name__ == "__main__":
    main()

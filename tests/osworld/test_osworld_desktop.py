"""OSWorld-format tasks of every application domain, end to end on real osworld-desktop machines.

The test writes one task per domain in OSWorld's own layout (`test_all.json` and `examples/<domain>/<id>.json`,
the fields OSWorld's task files use; none of OSWorld's files is copied), generates the documents they
need with the guest's own Python libraries (tests/osworld_guest/kit.py: Debian's openpyxl, docx and PIL,
the pinned python-pptx) and serves them from a local HTTP server as the tasks' `download` and
`cloud_file` URLs. `gh-runner import osworld --start-state osworld-desktop` turns them into cases whose
checks hand the evaluator to `python3 -m gh_osworld` in the guest, and `gh-runner validate --strict`
runs each on fresh machines: the check before prints False, `noop` fails, and the case's
`metadata.reference_fix` passes. A reference fix does what a person would: it closes the application
holding the document and writes the right cell, paragraph, title, pixels, bookmark or preference (with
the guest's python3-openpyxl and python3-docx, Python's zipfile, PIL), or trashes a file with `gio trash`.

| domain | the task's evaluator |
|---|---|
| libreoffice_calc | compare_table (rules sheet_name and sheet_data) of the file the setup opened in Calc |
| libreoffice_writer | compare_docx_files of the file opened in Writer |
| libreoffice_impress | compare_pptx_files of the file opened in Impress |
| chrome | is_expected_bookmarks of the bookmarks getter (the profile in ~/.config/google-chrome); a file:// page |
| gimp | compare_images of an image exported from the one the setup opened in GIMP |
| vlc | check_qt_max_volume of the vlc_config getter (~/.config/vlc/vlcrc) |
| thunderbird | check_thunderbird_prefs of the profile's prefs.js (a profile the setup unpacks) |
| os | check_include_exclude of a command's output: a file moved to the trash |
| multi_apps | compare_csv: a table shown in Chrome put into a CSV with LibreOffice Calc open |

VS Code is not in Debian: its task is skipped on import (`app_missing`), which the last test proves
without a machine.

The machine tests run only with GH_TEST_DESKTOP=1 and a built osworld-desktop image (scripts/osworld-image.sh;
GH_OSWORLD_IMAGES_DIR): desktop machines under TCG take minutes. The run uses examples/osworld-runner.yaml
(warm snapshots, two slots: the machines of one image share the hot pool).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.scratch import scratch_dir
from osworld_guest.kit import make

from .conftest import Served, write_task

GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")
REPO = Path(__file__).resolve().parents[2]
IMAGES_DIR = Path(os.environ.get("GH_OSWORLD_IMAGES_DIR", "/var/tmp/gh-runner/osworld-images"))
HOME = "/home/user"
DESKTOP = f"{HOME}/Desktop"

needs_image = pytest.mark.skipif(
    os.environ.get("GH_TEST_DESKTOP") != "1" or not (IMAGES_DIR / "osworld-desktop" / "image.yaml").is_file(),
    reason=f"needs GH_TEST_DESKTOP=1 and a built osworld-desktop image in {IMAGES_DIR}")


def task_id(name: str) -> str:
    """A UUID, as OSWorld's ids are, stable per task name."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gh-runner/tests/osworld/{name}"))


# -- the documents, made with the guest's libraries --

SALES: list[list[Any]] = [["Region", "Q1", "Q2", "Total"], ["North", 10, 20, 30], ["South", 5, 7, 12],
                          ["East", 3, 4, None]]
LETTER = ["Dear Sir,", "Thank you for the draft of the report.", "Regards,", "Ana"]
PRICES = [["Item", "Price"], ["Apple", "1.50"], ["Bread", "2.25"], ["Milk", "0.99"]]

_XLSX = """import openpyxl
wb = openpyxl.Workbook()
ws = wb.active
ws.title = "Sales"
for row in rows:
    ws.append(row)
wb.save(path)
"""
_DOCX = """import docx
d = docx.Document()
for text in paragraphs:
    d.add_paragraph(text)
d.save(path)
"""
_PPTX = """import pptx
p = pptx.Presentation()
s = p.slides.add_slide(p.slide_layouts[1])
s.shapes.title.text = title
s.placeholders[1].text = body
p.save(path)
"""
# An image that is not its own mirror: a gradient with a red block on the left; `flip` mirrors it.
_PNG = """from PIL import Image, ImageOps
im = Image.new("RGB", (96, 64))
im.putdata([(x * 2, y * 3, 128) if x >= 24 else (220, 30, 30) for y in range(64) for x in range(96)])
(ImageOps.mirror(im) if flip else im).save(path)
"""


def _tar_gz(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o644, 1000, 1000
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


PROFILE = "gh5test1.default-release"
PREFS = f"{HOME}/.thunderbird/{PROFILE}/prefs.js"


def documents(work: Path) -> dict[str, bytes]:
    """Every file the tasks download or expect, by the name it is served under."""
    work.mkdir(parents=True, exist_ok=True)
    gold_sales = [[*row[:3], row[1] + row[2]] if row[3] is None else row for row in SALES]
    made = {
        "sales.xlsx": (_XLSX, {"rows": SALES}),
        "sales_gold.xlsx": (_XLSX, {"rows": gold_sales}),
        "letter.docx": (_DOCX, {"paragraphs": LETTER}),
        "letter_gold.docx": (_DOCX, {"paragraphs": ["Dear Ms Smith,", *LETTER[1:]]}),
        "agenda.pptx": (_PPTX, {"title": "Draft agenda", "body": "Budget\nHiring"}),
        "agenda_gold.pptx": (_PPTX, {"title": "Quarterly review", "body": "Budget\nHiring"}),
        "photo.png": (_PNG, {"flip": False}),
        "photo_mirrored_gold.png": (_PNG, {"flip": True}),
    }
    for name, (snippet, values) in made.items():
        make(snippet, work, path=str(work / name), **values)
    out = {name: (work / name).read_bytes() for name in made}
    out["recipes.html"] = b"<!doctype html><title>Recipes</title><h1>Recipes</h1><p>Lentil soup.</p>\n"
    rows = "".join(f"<tr><td>{a}</td><td>{b}</td></tr>" for a, b in PRICES)
    out["prices.html"] = f"<!doctype html><title>Prices</title><table>{rows}</table>\n".encode()
    out["prices_gold.csv"] = "".join(f"{a},{b}\n" for a, b in PRICES).encode()
    out["thunderbird-profile.tar.gz"] = _tar_gz({
        ".thunderbird/profiles.ini": ("[General]\nStartWithLastProfile=1\nVersion=2\n\n[Profile0]\n"
                                      f"Name=default-release\nIsRelative=1\nPath={PROFILE}\nDefault=1\n"),
        f".thunderbird/{PROFILE}/prefs.js": (
            '// Mozilla User Preferences\n'
            'user_pref("mail.identity.id1.fullName", "Ana");\n'
            'user_pref("mail.identity.id1.useremail", "ana@example.test");\n'
            'user_pref("mail.identity.id1.auto_quote", true);\n'
            'user_pref("mail.account.account1.identities", "id1");\n'),
    })
    return out


# -- the tasks, in OSWorld's format --

def _download(url: str, path: str) -> dict[str, Any]:
    return {"type": "download", "parameters": {"files": [{"url": url, "path": path}]}}


def _open(path: str) -> dict[str, Any]:
    return {"type": "open", "parameters": {"path": path}}


def _launch(command: list[str] | str) -> dict[str, Any]:
    return {"type": "launch", "parameters": {"command": command}}


def _vm_file(path: str) -> dict[str, Any]:
    return {"type": "vm_file", "path": path, "dest": path.rsplit("/", 1)[-1]}


def _cloud(url: str, dest: str) -> dict[str, Any]:
    return {"type": "cloud_file", "path": url, "dest": dest}


def _save_in(window: str) -> list[dict[str, Any]]:
    """OSWorld's postconfig of an office task: the document's window activated and saved with Ctrl+S."""
    return [{"type": "activate_window", "parameters": {"window_name": window, "strict": True}},
            {"type": "sleep", "parameters": {"seconds": 0.5}},
            {"type": "execute", "parameters": {"command": ["python", "-c",
                                                           "import pyautogui; pyautogui.hotkey('ctrl', 's');"]}},
            {"type": "sleep", "parameters": {"seconds": 0.5}}]


def _task(name: str, domain: str, instruction: str, config: list[dict[str, Any]], evaluator: dict[str, Any],
          apps: list[str] | None = None) -> dict[str, Any]:
    return {"id": task_id(name), "snapshot": domain, "instruction": instruction,
            "source": "gh-runner tests/osworld/test_osworld_desktop.py", "config": config,
            "trajectory": "trajectories/", "related_apps": apps or [domain], "evaluator": evaluator}


def tasks(url: str) -> dict[str, dict[str, Any]]:
    """The tasks by domain; `url` is the HTTP server the documents are served from."""
    chrome = [_launch(["google-chrome", "--remote-debugging-port=1337"]),
              _launch(["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"])]
    return {
        "libreoffice_calc": _task(
            "calc", "libreoffice_calc",
            "In sales.xlsx the Total of East is missing. Fill it in: Q1 plus Q2, like the other rows.",
            [_download(f"{url}/sales.xlsx", f"{DESKTOP}/sales.xlsx"), _open(f"{DESKTOP}/sales.xlsx")],
            {"postconfig": _save_in("sales.xlsx - LibreOffice Calc"), "func": "compare_table",
             "result": _vm_file(f"{DESKTOP}/sales.xlsx"),
             "expected": _cloud(f"{url}/sales_gold.xlsx", "sales_gold.xlsx"),
             "options": {"rules": [{"type": "sheet_name"},
                                   {"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}]}}),
        "libreoffice_writer": _task(
            "writer", "libreoffice_writer",
            "Address the letter to Ms Smith: its first line should read \"Dear Ms Smith,\". Save the document.",
            [_download(f"{url}/letter.docx", f"{DESKTOP}/letter.docx"), _open(f"{DESKTOP}/letter.docx")],
            {"func": "compare_docx_files", "result": _vm_file(f"{DESKTOP}/letter.docx"),
             "expected": _cloud(f"{url}/letter_gold.docx", "letter_gold.docx")}),
        "libreoffice_impress": _task(
            "impress", "libreoffice_impress",
            "Change the title of the first slide to \"Quarterly review\" and save the presentation.",
            [_download(f"{url}/agenda.pptx", f"{DESKTOP}/agenda.pptx"), _open(f"{DESKTOP}/agenda.pptx")],
            {"func": "compare_pptx_files", "result": _vm_file(f"{DESKTOP}/agenda.pptx"),
             "expected": _cloud(f"{url}/agenda_gold.pptx", "agenda_gold.pptx"), "options": {}}),
        "chrome": _task(
            "chrome", "chrome",
            "Bookmark the recipes page I keep on my Desktop (recipes.html) on the bookmarks bar.",
            [_download(f"{url}/recipes.html", f"{DESKTOP}/recipes.html"), *chrome],
            {"func": "is_expected_bookmarks", "result": {"type": "bookmarks"},
             "expected": {"type": "rule", "rules": {"type": "bookmark_bar_websites_urls",
                                                     "urls": [f"file://{DESKTOP}/recipes.html"]}}}),
        "gimp": _task(
            "gimp", "gimp",
            "Mirror this photo horizontally and export it to my Desktop as photo_mirrored.png.",
            [_download(f"{url}/photo.png", f"{DESKTOP}/photo.png"), _launch(["gimp", f"{DESKTOP}/photo.png"])],
            {"func": "compare_images", "result": _vm_file(f"{DESKTOP}/photo_mirrored.png"),
             "expected": _cloud(f"{url}/photo_mirrored_gold.png", "photo_mirrored_gold.png")}),
        "vlc": _task(
            "vlc", "vlc",
            "VLC's volume stops at 125%. Let its volume control go up to 200%.",
            [_launch("vlc")],
            {"postconfig": [_launch(["pkill", "vlc"]), _launch("vlc")], "func": "check_qt_max_volume",
             "expected": {"type": "rule", "rules": {"expected_qt_max_volume": 200}},
             "result": {"type": "vlc_config", "dest": "vlcrc"}}),
        "thunderbird": _task(
            "thunderbird", "thunderbird",
            "When I reply to an email, Thunderbird quotes the original message. Make it stop quoting it.",
            [_download(f"{url}/thunderbird-profile.tar.gz", f"{HOME}/thunderbird-profile.tar.gz"),
             {"type": "execute", "parameters": {"command": ["tar", "-xzv", "--recursive-unlink", "-f",
                                                            f"{HOME}/thunderbird-profile.tar.gz", "-C", f"{HOME}/"]}},
             _launch(["/usr/bin/thunderbird"])],
            {"postconfig": [{"type": "close_window", "parameters": {"window_name": "Mail.thunderbird",
                                                                     "strict": True, "by_class": True}},
                            {"type": "sleep", "parameters": {"seconds": 0.5}}],
             "func": "check_thunderbird_prefs", "result": _vm_file(PREFS),
             "expected": {"type": "rule", "rules": {"expect": {"mail.identity.id1.auto_quote":
                                                               {"method": "eq", "ref": False}}}}}),
        "os": _task(
            "os-trash", "os",
            "I no longer need old-notes.txt on my Desktop. Move it to the trash.",
            [{"type": "execute", "parameters": {"command": "mkdir -p ~/Desktop && echo 'call the bank' > "
                                                           "~/Desktop/old-notes.txt", "shell": True}}],
            {"func": "check_include_exclude",
             "result": {"type": "vm_command_line", "shell": True,
                        "command": "if [ -f ~/.local/share/Trash/files/old-notes.txt ] && "
                                   "[ ! -e ~/Desktop/old-notes.txt ]; then echo in-trash; else echo still-there; fi"},
             "expected": {"type": "rule", "rules": {"include": ["in-trash"], "exclude": ["still-there"]}}}),
        "multi_apps": _task(
            "multi", "multi_apps",
            "Chrome shows a table of prices. Put it, header included, into ~/Desktop/prices.csv "
            "(comma-separated); LibreOffice Calc is open for it.",
            [_download(f"{url}/prices.html", f"{DESKTOP}/prices.html"),
             _launch(["google-chrome", f"file://{DESKTOP}/prices.html"]), _launch(["libreoffice", "--calc"])],
            {"func": "compare_csv", "result": _vm_file(f"{DESKTOP}/prices.csv"),
             "expected": _cloud(f"{url}/prices_gold.csv", "prices_gold.csv")},
            apps=["chrome", "libreoffice_calc"]),
    }


# -- what a person would do, scripted (run as the signed-in user in bash, elevated with sudo) --

# Each fix is a metadata value, so at most 500 characters: terse shell and python3.
# `q NAME` closes an application first, as a person would before editing its file: one left open would
# write its own copy over the edit (Chromium its Bookmarks, Thunderbird its prefs.js, as they exit).
# It asks again until the process is gone (one still starting, LibreOffice's oosplash starting
# soffice.bin, appears after a first request), a poll with a deadline of a minute.
_QUIT = 'q(){ for i in $(seq 150);do pkill -U $UID -x "$1"||return 0;sleep .4;done;pkill -9 -U $UID -x "$1";}\n'
_OFFICE = _QUIT + "q oosplash;q soffice.bin\n"

FIXES = {
    "libreoffice_calc": _OFFICE + (
        f"python3 -c 'import openpyxl as o;p=\"{DESKTOP}/sales.xlsx\";w=o.load_workbook(p);s=w[\"Sales\"];"
        "s[\"D4\"]=s[\"B4\"].value+s[\"C4\"].value;w.save(p)'\n"),
    "libreoffice_writer": _OFFICE + (
        f"python3 -c 'import docx;p=\"{DESKTOP}/letter.docx\";d=docx.Document(p);"
        "d.paragraphs[0].runs[0].text=\"Dear Ms Smith,\";d.save(p)'\n"),
    # The title's text in the slide's XML, rewritten with the standard library: every other part of the
    # presentation stays as it was.
    "libreoffice_impress": _OFFICE + f"""python3 - <<'E'
import zipfile as z,os
p="{DESKTOP}/agenda.pptx"
r=z.ZipFile(p);a=[(i,r.read(i)) for i in r.infolist()];r.close()
w=z.ZipFile(p+".n","w",z.ZIP_DEFLATED)
for i,d in a:w.writestr(i,d.replace(b">Draft agenda<",b">Quarterly review<"))
w.close();os.replace(p+".n",p)
E
""",
    "chrome": _QUIT + f"""q chromium
python3 - <<'E'
import json,os
p=os.path.expanduser("~/.config/google-chrome/Default/Bookmarks")
d=json.load(open(p)) if os.path.exists(p) else {{"roots":{{"bookmark_bar":{{"children":[]}}}}}}
d["roots"]["bookmark_bar"]["children"]+=[{{"type":"url","name":"Recipes","url":"file://{DESKTOP}/recipes.html"}}]
os.makedirs(os.path.dirname(p),exist_ok=True);json.dump(d,open(p,"w"))
E
""",
    "gimp": (f"python3 -c 'from PIL import Image,ImageOps;ImageOps.mirror(Image.open(\"{DESKTOP}/photo.png\")"
             f".convert(\"RGB\")).save(\"{DESKTOP}/photo_mirrored.png\")'\n"),
    # Every line naming the setting goes (VLC's commented default too: the last one read wins), and the
    # setting is written under [qt].
    "vlc": _QUIT + r"""q vlc
python3 - <<'E'
import os,re
p=os.path.expanduser("~/.config/vlc/vlcrc")
t=open(p).read() if os.path.exists(p) else ""
t=re.sub(r"(?m)^.*qt-max-volume=.*\n?","",t)
t=t.replace("[qt]","[qt]\nqt-max-volume=200",1) if "[qt]" in t else t+"\n[qt]\nqt-max-volume=200\n"
os.makedirs(os.path.dirname(p),exist_ok=True);open(p,"w").write(t)
E
""",
    "thunderbird": _QUIT + f"""q thunderbird
sed -i '/"mail.identity.id1.auto_quote"/d' {PREFS}
echo 'user_pref("mail.identity.id1.auto_quote", false);' >> {PREFS}
""",
    "os": "gio trash ~/Desktop/old-notes.txt\n",
    "multi_apps": f"printf '%s\\n' {' '.join(f'{a},{b}' for a, b in PRICES)} > {DESKTOP}/prices.csv\n",
}


def write_osworld(root: Path, by_domain: dict[str, dict[str, Any]]) -> Path:
    """OSWorld's layout: evaluation_examples/test_all.json indexing examples/<domain>/<id>.json."""
    base = root / "evaluation_examples"
    for domain, data in by_domain.items():
        write_task(base / "examples" / domain, data)
    index = base / "test_all.json"
    index.write_text(json.dumps({domain: [data["id"]] for domain, data in by_domain.items()}, indent=1))
    return index


@pytest.fixture()
def work() -> Iterator[Path]:
    with scratch_dir("gh-osworld-desktop-e2e-") as d:
        yield d


def _explain(report: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """What each machine of a case showed: the agent, outcome, error and the checks' output."""
    return [{k: a.get(k) for k in ("agent_id", "outcome", "error", "check")}
            for a in report.get("attempts", []) if a.get("key") == key]


@pytest.mark.desktop
@pytest.mark.libvirt
@pytest.mark.slow
@needs_image
@pytest.mark.timeout(2700)
def test_a_task_of_every_domain_validates_on_osworld_desktop(work: Path, served: Served) -> None:
    served.files.update({f"/{name}": data for name, data in documents(work / "documents").items()})
    by_domain = tasks(served.url)
    index = write_osworld(work / "osworld", by_domain)
    cases = work / "cases.yaml"
    imp = subprocess.run([GH_RUNNER, "import", "osworld", str(index), "--start-state", "osworld-desktop",
                          "--out", str(cases), "--files-dir", str(work / "files")],
                         capture_output=True, text=True, timeout=300)
    assert imp.returncode == 0, imp.stdout + imp.stderr
    n = len(by_domain)
    assert f"{n} tasks: {n} imported, 0 skipped" in imp.stdout, imp.stdout
    data = yaml.safe_load(cases.read_text())
    domain_of = {t["id"]: domain for domain, t in by_domain.items()}
    for case in data["cases"]:
        assert case["start_state"] == "osworld-desktop"
        # Every check hands its evaluator to the package in the guest.
        assert "gh_osworld" in case["success"]["check_script"], case["key"]
        case["metadata"]["reference_fix"] = FIXES[domain_of[case["metadata"]["osworld_id"]]]
    cases.write_text(yaml.safe_dump(data))
    report_path = work / "report.json"
    proc = subprocess.run([GH_RUNNER, "validate", str(cases), "--repeat", "1", "--strict",
                           "--config", str(REPO / "examples" / "osworld-runner.yaml"), "--report", str(report_path),
                           "--images-dir", str(IMAGES_DIR)], capture_output=True, text=True, timeout=2600)
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    by_key = {d["key"]: d["validation"] for d in (report.get("validation") or {}).get("data", [])}
    statuses = {domain_of[c["metadata"]["osworld_id"]]: by_key.get(c["key"], {}).get("status")
                for c in data["cases"]}
    not_valid = {domain_of[c["metadata"]["osworld_id"]]: {"validation": by_key.get(c["key"]),
                                                           "machines": _explain(report, c["key"])}
                 for c in data["cases"] if by_key.get(c["key"], {}).get("status") != "valid"}
    assert proc.returncode == 0 and statuses == dict.fromkeys(by_domain, "valid"), (
        f"exit {proc.returncode}, {statuses}\n{json.dumps(not_valid, indent=1)[-12000:]}\n{proc.stdout[-3000:]}")


def test_vs_code_tasks_are_skipped_as_app_missing_on_the_default_start_state(tmp_path: Path) -> None:
    """VS Code is not in Debian, so osworld-desktop lacks it: its task is skipped, naming it; a task the
    image can run is imported onto osworld-desktop, the default start state."""
    vs = _task("vscode", "vscode", "Install the Python extension in VS Code.", [_launch(["code"])],
               {"func": "is_extension_installed",
                "result": {"type": "vm_command_line", "command": ["code", "--list-extensions"]},
                "expected": {"type": "rule", "rules": {"type": "contain", "expected": "ms-python.python"}}})
    trash = tasks("http://127.0.0.1:9")["os"]
    index = write_osworld(tmp_path / "osworld", {"vs_code": vs, "os": trash})
    cases = tmp_path / "cases.yaml"
    imp = subprocess.run([GH_RUNNER, "import", "osworld", str(index), "--out", str(cases),
                          "--files-dir", str(tmp_path / "files")], capture_output=True, text=True, timeout=120)
    assert imp.returncode == 0, imp.stdout + imp.stderr
    line = next(ln for ln in imp.stdout.splitlines() if ln.startswith(vs["id"]))
    assert "skipped: app_missing" in line, line
    assert "vscode" in line.lower().replace("_", "").replace(" ", ""), line
    assert "2 tasks: 1 imported, 1 skipped (app_missing 1)" in imp.stdout, imp.stdout
    (case,) = yaml.safe_load(cases.read_text())["cases"]
    assert case["start_state"] == "osworld-desktop"


# -- the seven sheet_print tasks (calc 4f07fbe9, 0bf05a7d, a01fbce3, 21df9241, 6e99a1ad; multi_apps 881deb30,
# 7e287123), each in the shape of its OSWorld task: a workbook (given, or made by the agent on the Desktop)
# saved and printed to `<stem>-Sheet1.csv` by the postconfig's `libreoffice --convert-to csv`, compared with
# compare_table's sheet_print rule against an expected workbook and the expected printed CSV (a multi
# cloud_file, `gives` the workbook alone). The documents are ours; the answers print what the CSVs say.

_BOOK = """import openpyxl
wb = openpyxl.Workbook()
ws = wb.active
ws.title = "Sheet1"
for row in rows:
    ws.append(row)
for col, fmt in formats.items():
    for cell in ws[col][1:]:
        cell.number_format = fmt
wb.save(path)
"""
# The filter options of OSWorld's tasks: comma, double quote, UTF-8, cells as shown, the first sheet
# (written as <stem>-Sheet1.csv).
_PRINT = "csv:Text - txt - csv (StarCalc):44,34,UTF-8,,,,false,true,true,false,false,1"


@dataclass(frozen=True)
class SheetPrint:
    """One task: its workbook `stem` in `where`, the rows the setup gives (None: the agent makes the book),
    the expected rows and number formats, the CSV LibreOffice prints of them, and the reference fix (python3
    on the closed workbook `p`)."""

    name: str
    domain: str
    where: str
    stem: str
    given: list[list[Any]] | None
    expected: list[list[Any]]
    formats: dict[str, str]
    printed: str
    fix: str
    ignore_case: bool = False
    gold_csv_url_name: str | None = None  # 21df9241 serves the expected CSV under another name than its dest


SHEET_PRINT = [
    SheetPrint("4f07fbe9", "libreoffice_calc", HOME, "Price_Labels",
               [["Item", "Price", "Label"], ["Tea", 3.14159, "Tea costs 3.14159"], ["Jam", 2.5, "Jam costs 2.5"]],
               [["Item", "Price", "Label"], ["Tea", 3.14159, "Tea costs 3.14"], ["Jam", 2.5, "Jam costs 2.50"]],
               {}, "Item,Price,Label\nTea,3.14159,Tea costs 3.14\nJam,2.5,Jam costs 2.50\n",
               's=w.active;s["C2"]="Tea costs 3.14";s["C3"]="Jam costs 2.50"'),
    SheetPrint("0bf05a7d", "libreoffice_calc", HOME, "Old_New_Ids",
               [["Old ID", "New 7 Digit ID"], [1234, None], [56, None], [987654, None]],
               [["Old ID", "New 7 Digit ID"], [1234, "0001234"], [56, "0000056"], [987654, "0987654"]],
               {}, "Old ID,New 7 Digit ID\n1234,0001234\n56,0000056\n987654,0987654\n",
               "s=w.active\nfor r in range(2,5):s.cell(r,2).value=str(s.cell(r,1).value).zfill(7)"),
    SheetPrint("a01fbce3", "libreoffice_calc", HOME, "Team_Shares",
               [["Team", "Share"], ["Red", 0.25], ["Blue", 0.755]],
               [["Team", "Share"], ["Red", 0.25], ["Blue", 0.755]],
               {"B": "0.0%"}, "Team,Share\nRed,25.0%\nBlue,75.5%\n",
               'for c in w.active["B"][1:]:c.number_format="0.0%"'),
    SheetPrint("21df9241", "libreoffice_calc", HOME, "In_Millions",
               [["City", "Population"], ["Lima", 10092000], ["Quito", 2011000]],
               [["City", "Population"], ["Lima", "10.09 M"], ["Quito", "2.01 M"]],
               {}, "city,population\nlima,10.09 m\nquito,2.01 m\n",  # ignore_case: the case differs
               's=w.active;s["B2"]="10.09 M";s["B3"]="2.01 M"', ignore_case=True,
               gold_csv_url_name="In_Millions_gold.csv"),
    SheetPrint("6e99a1ad", "libreoffice_calc", HOME, "Two_Decimals",
               [["Day", "spent"], ["Mon", 12.5], ["Tue", 3.456], ["Wed", 7]],
               [["Day", "spent"], ["Mon", 12.5], ["Tue", 3.456], ["Wed", 7]],
               {"B": "0.00"}, "Day,spent\nMon,12.50\nTue,3.46\nWed,7.00\n",
               'for c in w.active["B"][1:]:c.number_format="0.00"'),
    SheetPrint("881deb30", "multi_apps", DESKTOP, "ECS_Pass_Rates", None,
               [["School", "2021", "2022"], ["HKU", 0.4, 0.45], ["CUHK", 0.35, 0.5]],
               {"B": "0%", "C": "0%"}, "School,2021,2022\nHKU,40%,45%\nCUHK,35%,50%\n",
               'w=o.Workbook();s=w.active;s.title="Sheet1"\n'
               'for r in [["School","2021","2022"],["HKU",.4,.45],["CUHK",.35,.5]]:s.append(r)\n'
               'for c in [*s["B"][1:],*s["C"][1:]]:c.number_format="0%"'),
    SheetPrint("7e287123", "multi_apps", DESKTOP, "GRF-p5y", None,
               [["Year", "Funded", "Applied"], [2021, 12, 40], [2022, 15, 42]],
               {}, "Year,Funded,Applied\n2021,12,40\n2022,15,42\n",
               'w=o.Workbook();s=w.active;s.title="Sheet1"\n'
               'for r in [["Year","Funded","Applied"],[2021,12,40],[2022,15,42]]:s.append(r)'),
]


def sheet_print_documents(work: Path) -> dict[str, bytes]:
    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, bytes] = {}
    for t in SHEET_PRINT:
        books = [(f"{t.stem}_gold.xlsx", t.expected, t.formats)]
        if t.given is not None:
            books.append((f"{t.stem}.xlsx", t.given, {}))
        for name, rows, formats in books:
            make(_BOOK, work, path=str(work / name), rows=rows, formats=formats)
            out[name] = (work / name).read_bytes()
        out[t.gold_csv_url_name or f"{t.stem}_gold-Sheet1.csv"] = t.printed.encode()
    return out


def sheet_print_task(t: SheetPrint, url: str) -> dict[str, Any]:
    book = f"{t.where}/{t.stem}.xlsx"
    config = ([_download(f"{url}/{t.stem}.xlsx", book), _open(book)] if t.given is not None else
              [{"type": "execute", "parameters": {"command": ["mkdir", "-p", t.where]}},
               _launch(["libreoffice", "--calc"])])
    postconfig = [*_save_in(f"{t.stem}.xlsx - LibreOffice Calc"),
                  {"type": "execute", "parameters": {"command": ["libreoffice", "--convert-to", _PRINT, "--outdir",
                                                                 t.where, book]}},
                  {"type": "sleep", "parameters": {"seconds": 0.5}}]
    rule: dict[str, Any] = {"type": "sheet_print", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}
    if t.ignore_case:
        rule["ignore_case"] = True
    evaluator = {
        "postconfig": postconfig, "func": "compare_table",
        "result": {"type": "vm_file", "multi": True, "path": [book, f"{t.where}/{t.stem}-Sheet1.csv"],
                   "dest": [f"{t.stem}.xlsx", f"{t.stem}-Sheet1.csv"]},
        "expected": {"type": "cloud_file", "multi": True,
                     "path": [f"{url}/{t.stem}_gold.xlsx",
                              f"{url}/{t.gold_csv_url_name or t.stem + '_gold-Sheet1.csv'}"],
                     "dest": [f"{t.stem}_gold.xlsx", f"{t.stem}_gold-Sheet1.csv"]},
        "options": {"rules": [rule]}}
    apps = ["libreoffice_calc", "os"] if t.domain == "multi_apps" else None
    return _task(f"sheet_print-{t.name}", t.domain, f"Task of the shape of OSWorld {t.domain} {t.name}: "
                 f"make {book} print as expected.", config, evaluator, apps)


def sheet_print_fix(t: SheetPrint) -> str:
    """Calc closed, then the workbook written as a person's answer would leave it."""
    load = "" if t.given is None else "w=o.load_workbook(p)\n"
    return (_OFFICE + f"python3 - <<'E'\nimport openpyxl as o\np=\"{t.where}/{t.stem}.xlsx\"\n"
            f"{load}{t.fix}\nw.save(p)\nE\n")


@pytest.mark.desktop
@pytest.mark.libvirt
@pytest.mark.slow
@needs_image
@pytest.mark.timeout(2700)
def test_the_sheet_print_tasks_pass_with_the_answer_and_fail_without(work: Path, served: Served) -> None:
    """Issue 48: the expected `<stem>-Sheet1.csv` of a multi cloud_file reaches the check, so each of the seven
    scores 1 with the answer (the reference fix) and 0 untouched (the check before) and under noop."""
    served.files.update({f"/{name}": data for name, data in sheet_print_documents(work / "documents").items()})
    by_id = {t.name: sheet_print_task(t, served.url) for t in SHEET_PRINT}
    base = work / "osworld" / "evaluation_examples"
    for t in SHEET_PRINT:
        write_task(base / "examples" / t.domain, by_id[t.name])
    index = base / "test_all.json"
    grouped: dict[str, list[str]] = {}
    for t in SHEET_PRINT:
        grouped.setdefault(t.domain, []).append(by_id[t.name]["id"])
    index.write_text(json.dumps(grouped))
    cases = work / "cases.yaml"
    imp = subprocess.run([GH_RUNNER, "import", "osworld", str(index), "--start-state", "osworld-desktop",
                          "--out", str(cases), "--files-dir", str(work / "files")],
                         capture_output=True, text=True, timeout=300)
    assert imp.returncode == 0 and "7 tasks: 7 imported, 0 skipped" in imp.stdout, imp.stdout + imp.stderr
    data = yaml.safe_load(cases.read_text())
    name_of = {by_id[t.name]["id"]: t.name for t in SHEET_PRINT}
    fixes = {t.name: sheet_print_fix(t) for t in SHEET_PRINT}
    for case in data["cases"]:
        fix = fixes[name_of[case["metadata"]["osworld_id"]]]
        assert len(fix) <= 500, (name_of[case["metadata"]["osworld_id"]], len(fix))
        case["metadata"]["reference_fix"] = fix
    cases.write_text(yaml.safe_dump(data))
    report_path = work / "report.json"
    proc = subprocess.run([GH_RUNNER, "validate", str(cases), "--repeat", "1", "--strict",
                           "--config", str(REPO / "examples" / "osworld-runner.yaml"), "--report", str(report_path),
                           "--images-dir", str(IMAGES_DIR)], capture_output=True, text=True, timeout=2600)
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    by_key = {d["key"]: d["validation"] for d in (report.get("validation") or {}).get("data", [])}
    key_of = {name_of[c["metadata"]["osworld_id"]]: c["key"] for c in data["cases"]}
    scores = {name: [(a.get("agent_id"), a.get("outcome"), a.get("score"), (a.get("check") or {}).get("before_score"))
                     for a in report.get("attempts", []) if a.get("key") == key] for name, key in key_of.items()}
    print(json.dumps(scores))  # the numbers docs/osworld.md records
    statuses = {name: by_key.get(key, {}).get("status") for name, key in key_of.items()}
    not_valid = {name: {"validation": by_key.get(key), "machines": _explain(report, key)}
                 for name, key in key_of.items() if statuses[name] != "valid"}
    assert proc.returncode == 0 and statuses == dict.fromkeys(key_of, "valid"), (
        f"exit {proc.returncode}, {statuses}\n{json.dumps(not_valid, indent=1)[-12000:]}\n{proc.stdout[-3000:]}")
    for name, machines in scores.items():
        assert sorted((agent, score) for agent, _, score, _ in machines) == [("noop", 0.0), ("reference", 1.0)] \
            and all(before == 0.0 for *_, before in machines), (name, machines)

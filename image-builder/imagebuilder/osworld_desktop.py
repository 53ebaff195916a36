"""osworld-desktop: linux-desktop with OSWorld's applications, built by linux-desktop's builder as a
`Profile` (linux_desktop.py): the same Debian root, hooks and boot proofs, plus

- from Debian: LibreOffice (Calc, Writer, Impress), GIMP, VLC, Thunderbird, Chromium, the tools
  OSWorld's setups call (wmctrl, unzip, git, curl, socat), locales (the session runs in
  en_US.UTF-8), and the Python modules and tools the in-guest checks read documents with
  (poppler-utils for PDFs' text);
- from PyPI, pinned by hash (assets/osworld-desktop/pypi.txt): what Debian 12 does not package,
  installed by the host's pip into the root's /usr/local/lib/python3.11/dist-packages;
- this repository's gh_osworld/ at /usr/lib/python3/dist-packages/gh_osworld (the checks'
  evaluator: `python3 -m gh_osworld SPEC.json`);
- a file store, /usr/share/gh-osworld/files/sha256/<hex>: the files given with `--files-dir DIR`
  (the importer's layout, DIR/sha256/<hex>), each checked against its name; empty without it.

`google-chrome` and `chromium` are one wrapper (assets/osworld-desktop/rootfs/usr/local/bin/google-chrome):
OSWorld's profile path and the DevTools port on 127.0.0.1:9222. The proofs add: the modules import
as the user, the session's locale, Chromium answering on its port when started as `google-chrome`,
LibreOffice running; and they log the session's memory (`free -m`).

The version also covers gh_osworld's sources, pypi.txt and the store's list of files; none of these
is in linux-desktop's version.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
from pathlib import Path

from . import linux_desktop, proc, pyautogui
from .errors import BuildError
from .linux_desktop import Profile
from .pipeline import Script, log

NAME = "osworld-desktop"
ASSETS = Path(__file__).parent / "assets" / "osworld-desktop"
REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "gh_osworld"
PYPI = ASSETS / "pypi.txt"
# Where each part lands in the root.
SITE = "usr/local/lib/python3.11/dist-packages"
PACKAGE_DEST = "usr/lib/python3/dist-packages/gh_osworld"
FILE_STORE = "usr/share/gh-osworld/files"
PACKAGES = [
    "libreoffice-calc", "libreoffice-writer", "libreoffice-impress", "libreoffice-gtk3",
    "gimp", "vlc", "thunderbird", "chromium",
    "wmctrl", "unzip", "git", "curl", "socat", "locales",
    "python3-openpyxl", "python3-docx", "python3-pandas", "python3-pil", "python3-lxml", "python3-numpy",
    "python3-xlsxwriter", "python3-pyatspi",
    # What gh_osworld reads with beyond those: PDFs' text (compare_pdfs, PDF members of archives),
    # the CSS selectors of check_accessibility_tree, YAML files (check_json with is_yaml).
    "poppler-utils", "python3-cssselect", "python3-yaml",
    # The public suffix list, by which Chrome's metrics compare URLs as OSWorld does (metrics/chrome.py).
    "publicsuffix",
    # What the pinned scikit-image (pypi.txt) runs on beside numpy and Pillow.
    "python3-scipy", "python3-packaging",
    # What the tasks' setups `apt install` from the network, which a machine here does not have: in the image,
    # the setup's install finds them present (chrome's jq edit of the Preferences, os's expect, zsh and astyle,
    # multi_apps' sysstat and the clipboard's xsel). Without jq, one chrome task's check printed True untouched.
    "jq", "xsel", "expect", "astyle", "sysstat", "zsh",
    # Ubuntu's video player, the default of OSWorld's snapshot: with VLC the only player, xdg-mime answered
    # vlc.desktop whatever the default, so "make VLC the default" (multi_apps 937087b6) passed untouched.
    "totem",
]
SESSION_ENV = {**linux_desktop.SESSION_ENV, "LANG": "en_US.UTF-8"}
# Measured in this build's proof (docs/desktop-guests.md): the signed-in session uses about 410 MiB,
# 600 with Chromium on about:blank; LibreOffice Calc open beside it adds its share (logged by the
# proof). 3 GiB leaves room for real pages and documents in both.
MEMORY_MIB = 3072
DISK_MIB = 10240  # the root is about 3.5 GB; room for the tasks' files and the applications' profiles
SIZE_LIMIT = 2560 * 1024 * 1024  # the compressed disk
HEX = re.compile(r"[0-9a-f]{64}")
CHROME_WAIT_S = 300  # Chromium's first start under TCG on a loaded host


def _package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def store_files(files_dir: Path | None) -> list[Path]:
    """The files of an importer's store (DIR/sha256/<hex>), by name; a name that is not a sha256 is
    refused (the directory is not the importer's)."""
    if files_dir is None:
        return []
    top = files_dir / "sha256"
    if not top.is_dir():
        raise BuildError(f"--files-dir {files_dir}: no sha256/ in it (the layout `gh-runner import osworld "
                         "--fetch-only --files-dir DIR` writes: DIR/sha256/<hex>)")
    found = sorted(top.iterdir())
    for p in found:
        if not (HEX.fullmatch(p.name) and p.is_file()):
            raise BuildError(f"--files-dir {files_dir}: {p.name!r} in sha256/ is not a file named by its sha256")
    return found


def stage_files(files: list[Path], root: Path) -> None:
    """The store in the root, replacing the last build's: each file copied while its sha256 is
    taken, and refused when that is not its name (a damaged or partial download)."""
    store = root / FILE_STORE
    shutil.rmtree(store, ignore_errors=True)
    (store / "sha256").mkdir(parents=True)
    store.chmod(0o755)
    (store / "sha256").chmod(0o755)
    for src in files:
        dest = store / "sha256" / src.name
        h = hashlib.sha256()
        with src.open("rb") as fin, dest.open("wb") as fout:
            while chunk := fin.read(1 << 20):
                h.update(chunk)
                fout.write(chunk)
        if h.hexdigest() != src.name:
            dest.unlink()
            raise BuildError(f"{src}: its sha256 is {h.hexdigest()}, not the one its name says (a damaged or "
                             "partial download: fetch it again with `gh-runner import osworld --fetch-only`)")
        dest.chmod(0o644)
    if files:
        log(f"file store: {len(files)} files, {sum(p.stat().st_size for p in files) / 2**20:.0f} MiB")


def install_package(root: Path) -> None:
    dest = root / PACKAGE_DEST
    shutil.rmtree(dest, ignore_errors=True)
    for src in _package_files():
        out = dest / src.relative_to(PACKAGE)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out)
        out.chmod(0o644)
    for d in [dest, *(p for p in dest.rglob("*") if p.is_dir())]:
        d.chmod(0o755)


def install_pypi(root: Path, cache: Path) -> None:
    """pypi.txt into the root's site dir with the host's pip: hashes required, no dependencies (they
    come from Debian), the wheels kept in the cache so a rebuild needs no network."""
    wheels = cache / "pypi"
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    common = ["--require-hashes", "--no-deps", "--only-binary=:all:", "-r", str(PYPI)]
    cached = proc.run([*pip, "download", "--no-index", "--find-links", str(wheels), "-d", str(wheels), *common],
                      timeout=120, check=False)
    if cached.returncode != 0:
        log(f"downloading {PYPI.name}'s pins into {wheels}")
        proc.run([*pip, "download", "-d", str(wheels), *common], timeout=600)
    site = root / SITE
    shutil.rmtree(site, ignore_errors=True)
    proc.run([*pip, "install", "--no-index", "--find-links", str(wheels), "--no-compile", "--target", str(site),
              *common], timeout=600)
    shutil.rmtree(site / "bin", ignore_errors=True)


def proofs(as_user):  # type: ignore[no-untyped-def]
    chrome_up = "curl -sf --max-time 5 http://127.0.0.1:9222/json/version | grep -q '\"Browser\"'"
    return [
        Script("measure the signed-in session's memory", "free -m\n", 60, report=True),
        Script(
            "check OSWorld's Python modules and gh_osworld as the user",
            # structural_similarity's module imports scipy (skimage's own imports are lazy).
            as_user('python3 -c "import openpyxl, docx, pptx, pandas, PIL, lxml, gh_osworld.evaluate; '
                    'from skimage.metrics import structural_similarity"') + "\n",
            180,
        ),
        Script(
            "check the session's locale is en_US.UTF-8",
            "set -e\n"
            "tr '\\0' '\\n' < /proc/$(pgrep -u user -x xfce4-session)/environ | grep -qx LANG=en_US.UTF-8 "
            "|| { echo 'the XFCE session does not run in LANG=en_US.UTF-8' >&2; exit 1; }\n"
            + as_user('test "$LANG" = en_US.UTF-8 && test "$(locale charmap)" = UTF-8 && '
                      "locale -a | grep -qx en_US.utf8") + "\n",
            60,
        ),
        Script(
            "check Chromium answers on 127.0.0.1:9222 when started as google-chrome; measure it with LibreOffice Calc",
            # The profile customize.sh seeded is set aside for the proof's own start and put back
            # after it: the image keeps OSWorld's untouched profile, never one Chromium has filled in.
            "mv /home/user/.config/google-chrome /tmp/gh-chrome-seed\n"
            + as_user("setsid google-chrome about:blank >/tmp/gh-chrome.log 2>&1 &") + "\n"
            f"i=0; until {chrome_up}; do i=$((i + 1)); if [ $i -gt {CHROME_WAIT_S} ]; then "
            "echo 'Chromium never answered on 127.0.0.1:9222' >&2; tail -20 /tmp/gh-chrome.log >&2; exit 1; fi; "
            "sleep 1; done\n"
            "free -m\n"
            # With Chromium up, LibreOffice Calc opened too, for the memory the two take in the session;
            # Calc is closed as a person would (its untitled document unchanged: no question), so its
            # first-start profile stays and no recovery is offered later.
            + as_user("setsid soffice --calc >/tmp/gh-soffice.log 2>&1 &") + "\n"
            f"i=0; until {as_user('wmctrl -lx | grep -qi libreoffice-calc')}; do i=$((i + 1)); "
            f"if [ $i -gt {CHROME_WAIT_S} ]; then echo 'no LibreOffice Calc window' >&2; "
            "tail -20 /tmp/gh-soffice.log >&2; exit 1; fi; sleep 1; done\n"
            "sleep 10\n"  # NOTE: let Calc settle after its window maps: the figure is what it holds at rest
            "free -m\n"
            + as_user("wmctrl -c 'LibreOffice Calc'") + "\n"
            "i=0; while pgrep -u user -x soffice.bin >/dev/null; do i=$((i + 1)); "
            "if [ $i -gt 60 ]; then echo 'LibreOffice did not close' >&2; exit 1; fi; sleep 1; done\n"
            # Stopped, and the profile it made replaced by the seeded one: every machine's first start
            # is a clean one, on the profile OSWorld's setups edit.
            "pkill -u user -f /usr/lib/chromium/chromium; i=0; "
            "while pgrep -u user -f /usr/lib/chromium/chromium >/dev/null; do i=$((i + 1)); "
            "[ $i -gt 30 ] && pkill -9 -u user -f /usr/lib/chromium/chromium; sleep 1; done\n"
            "rm -rf /home/user/.config/google-chrome /tmp/gh-chrome.log /tmp/gh-soffice.log\n"
            "mv /tmp/gh-chrome-seed /home/user/.config/google-chrome\n",
            CHROME_WAIT_S * 2 + 180, report=True,
        ),
        Script("check LibreOffice runs", as_user("soffice --version | grep -q LibreOffice") + "\n", 180),
    ]


def profile(files_dir: Path | None = None) -> Profile:
    files = store_files(files_dir)
    store_mib = (sum(p.stat().st_size for p in files) >> 20) + (64 if files else 0)

    def stage(root: Path, cache: Path) -> None:
        install_package(root)
        install_pypi(root, cache)
        pyautogui.install(root, cache)  # again: install_pypi emptied the site dir
        stage_files(files, root)

    base = linux_desktop.linux_desktop_profile()
    return Profile(
        name=NAME, packages=(*base.packages, *PACKAGES), assets=(*base.assets, ASSETS),
        sources=(*base.sources, Path(__file__), *_package_files()),
        memory_mib=MEMORY_MIB, disk_mib=DISK_MIB, size_limit=SIZE_LIMIT, session_env=SESSION_ENV,
        description=f"{base.description} with OSWorld's applications (LibreOffice, GIMP, VLC, Thunderbird, "
                    "Chromium) and gh_osworld",
        inputs=lambda: {"files": [p.name for p in files]},
        stage=stage, proofs=proofs, extra_disk_mib=lambda: store_mib,
    )

"""The accessibility read (GET {machine.url}/accessibility) on real desktops: time (p50/p90) and size,
and our linearized text beside OSWorld's own on the same trees.

    .venv/bin/python bench/a11y_read.py --images-dir DIR [--reads 10] [--keep-venv DIR]

1. For each of linux-desktop and osworld-desktop in DIR (one that is missing is said to be "not
   measured"): a machine from the image (QemuProvider, TCG here), Mousepad opened with a file, then
   `--reads` reads of the tree one after another as the runner does them
   (QemuMachine.accessibility_tree, its bounds). One row per image: reads, p50 and p90 seconds,
   bytes (p50 and largest), elements.
2. Fidelity: a throwaway venv under /var/tmp (removed at the end; --keep-venv reuses one and leaves
   it) with OSWorld's published package `desktop-env` (DESKTOP_ENV, --no-deps) and Pillow (as it pins it); its
   `mm_agents.agent.linearize_accessibility_tree` loaded with empty stand-ins for the model SDKs
   that module imports at its top (none used by that function). Each tree read above, and a
   constructed one with the edge cases (quotes, hidden, unnamed, off-screen nodes), goes through
   theirs and ours (gh_server/agents/model/a11y.py): one row per tree, lines each and whether the
   texts are identical.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from gh_runner.machine_requests import ACCESSIBILITY_MAX_BYTES, ACCESSIBILITY_TIMEOUT  # noqa: E402
from gh_server.agents.model import a11y  # noqa: E402
from providers.base import MachineSource  # noqa: E402
from providers.qemu import QemuMachine, QemuProvider  # noqa: E402
from providers.qemu import atspi_tree as T  # noqa: E402

DESKTOP_ENV = "desktop-env==1.0.2"
IMAGES = ["linux-desktop", "osworld-desktop"]
BOOT_TIMEOUT = 1800.0
# Run in the venv: OSWorld's linearizer on each file named in argv, as JSON {file: text}.
ORACLE = r"""
import importlib.abc, importlib.machinery, json, sys, types

class _Any:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return _Any()
    def __getattr__(self, name): return _Any()

class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # The model SDKs mm_agents/agent.py imports at its top: not installed, not used by the linearizer.
    NAMES = ("dotenv", "backoff", "dashscope", "google", "openai", "requests", "tiktoken", "groq")
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.NAMES:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = lambda attr: _Any
        return m
    def exec_module(self, module): pass

sys.meta_path.append(_StandIn())
from mm_agents.agent import linearize_accessibility_tree
print(json.dumps({f: linearize_accessibility_tree(open(f).read(), "ubuntu") for f in sys.argv[1:]}))
"""


def constructed() -> str:
    shown = ["showing", "visible", "enabled"]
    return T.to_xml([T.Node("application", "edge cases", children=[
        T.Node("frame", "A window", states=shown, extents=(0, 0, 800, 600), children=[
            T.Node("push button", 'Say "hi"', states=shown, extents=(1, 2, 3, 4)),
            T.Node("text", "", states=["showing", "visible", "editable"], extents=(0, 10, 50, 20),
                   text='a "quoted"\ttext'),
            T.Node("push button", "Hidden", states=["visible", "enabled"], extents=(1, 1, 5, 5)),
            T.Node("push button", "", states=shown, extents=(1, 1, 5, 5)),
            T.Node("push button", "Off", states=shown, extents=(-1, 1, 5, 5)),
            T.Node("check box", "Tick", states=["showing", "visible", "checkable"], extents=(1, 1, 5, 5)),
            T.Node("label", "", states=shown, extents=(1, 1, 5, 5), text="a label"),
            T.Node("document web", "Page", states=shown, extents=(0, 0, 10, 10)),
            T.Node("table cell", "A1", states=shown, extents=(0, 0, 10, 10), attributes={"class": "x"}),
        ])])], ACCESSIBILITY_MAX_BYTES)


async def measure(images_dir: Path, image: str, reads: int, out: Path, state: Path) -> dict[str, object]:
    provider = QemuProvider(images_dir, state, f"a11yb{secrets.token_hex(2)}", "qemu:///system")
    await provider.start()
    machine = None
    try:
        machine = await provider.create_machine(f"at_{secrets.token_hex(4)}", MachineSource(image=image),
                                                timeout=BOOT_TIMEOUT)
        assert isinstance(machine, QemuMachine)
        await machine.wait_ready(BOOT_TIMEOUT)
        await machine.run_script("printf 'a line to find\\n' > /tmp/a11y-bench.txt; "
                                 "setsid mousepad /tmp/a11y-bench.txt >/dev/null 2>&1 &", timeout=60)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # the window is in the tree (its first start is slow under TCG)
            if "a line to find" in await machine.accessibility_tree(ACCESSIBILITY_TIMEOUT, ACCESSIBILITY_MAX_BYTES):
                break
        seconds, sizes, elements = [], [], 0
        xml = ""
        for _ in range(reads):
            started = time.monotonic()
            xml = await machine.accessibility_tree(ACCESSIBILITY_TIMEOUT, ACCESSIBILITY_MAX_BYTES)
            seconds.append(time.monotonic() - started)
            sizes.append(len(xml.encode()))
            elements = sum(1 for _ in ET.fromstring(xml).iter())
        (out / f"{image}.xml").write_text(xml)
        q = statistics.quantiles(seconds, n=10) if len(seconds) > 1 else seconds * 9
        return {"image": image, "reads": reads, "p50_s": round(statistics.median(seconds), 2),
                "p90_s": round(q[8], 2), "bytes_p50": int(statistics.median(sizes)), "bytes_max": max(sizes),
                "elements": elements}
    finally:
        if machine is not None:
            await machine.destroy()
        await provider.close()


def oracle(venv: Path, files: list[Path]) -> dict[str, str]:
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", DESKTOP_ENV], check=True, timeout=600)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "Pillow~=11.0.0"], check=True, timeout=600)
    got = subprocess.run([str(py), "-c", ORACLE, *map(str, files)], capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        raise SystemExit(f"OSWorld's linearizer failed:\n{got.stderr[-3000:]}")
    result: dict[str, str] = json.loads(got.stdout)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images-dir", type=Path)
    ap.add_argument("--reads", type=int, default=10)
    ap.add_argument("--keep-venv", type=Path)
    ap.add_argument("--record", type=Path, help="write each tree read and OSWorld's text of it here "
                                                "(tests/gateway/data: test_model_a11y.py's recorded trees)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gh-a11y-bench-", dir="/var/tmp"))
    work.chmod(0o755)  # QEMU (libvirt-qemu) reaches the machines' overlays under it
    try:
        (work / "constructed.xml").write_text(constructed())
        rows = []
        for image in IMAGES:
            if args.images_dir is None or not (args.images_dir / image).is_dir():
                print(f"{image}: not measured (not in {args.images_dir})")
                continue
            state = work / f"state-{image}"
            state.mkdir()
            rows.append(asyncio.run(measure(args.images_dir, image, args.reads, work, state)))
        print("image\treads\tp50 s\tp90 s\tbytes p50\tbytes max\telements")
        for r in rows:
            print("\t".join(str(r[k]) for k in ("image", "reads", "p50_s", "p90_s", "bytes_p50", "bytes_max",
                                                  "elements")))
        files = sorted(work.glob("*.xml"))
        venv = args.keep_venv or work / "venv"
        theirs = oracle(venv, files)
        print("\ntree\tlines (OSWorld)\tlines (ours)\tidentical")
        for f in files:
            ours = a11y.linearize(f.read_text())
            them = theirs[str(f)]
            if args.record is not None and f.stem != "constructed":
                (args.record / f"a11y-{f.stem}.xml").write_text(f.read_text())
                (args.record / f"a11y-{f.stem}.osworld.txt").write_text(them)
            print(f"{f.stem}\t{len(them.splitlines())}\t{len(ours.splitlines())}\t{ours == them}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

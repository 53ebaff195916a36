"""Our exports read by the peers' own code: ATIF by Harbor's published models, OSWorld's layout by its
show_result.py when a checkout is at hand.

    .venv/bin/python bench/atif_harbor.py [--write-schema] [--keep-venv DIR] [--report DIR]
                                          [--osworld-checkout DIR]

1. A throwaway venv under /var/tmp (removed at the end; --keep-venv reuses one and leaves it) with Harbor
   from PyPI (HARBOR_VERSION) installed --no-deps and --ignore-requires-python (it asks for Python 3.12; its
   trajectory models need only pydantic, which is installed beside it), so nothing of Harbor's reaches our
   venv and CI stays offline: the suite checks against the schema recorded here.
2. Harbor's `Trajectory.model_json_schema()` compared with tests/export/harbor_atif_schema.json (the suite's
   recorded copy); --write-schema rewrites the copy from the live package.
3. `Trajectory.model_validate` (the schema and the rules its validators add) on our ATIF export of the
   recorded replay of tests/export/recorded.py (with each model call's tokens on its step, with calls
   that had no frame of their own, and as recorded before calls were kept), and on every trajectory.json
   of `gh-runner export --format atif` output given with --report.
4. With --osworld-checkout (a clone of xlang-ai/OSWorld), its show_result.py `get_result` over our OSWorld
   export of recorded replays, its printed rates side by side with ours.
About 20 s with a warm pip cache.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from export import recorded  # noqa: E402

from gh_server import trajectories as traj  # noqa: E402

HARBOR_VERSION = "0.25.0"
SCHEMA = REPO / "tests" / "export" / "harbor_atif_schema.json"

CHECK = r"""
import json, sys
from harbor.models.trajectories import Trajectory
args = json.loads(sys.stdin.read())
out = {"schema": Trajectory.model_json_schema(), "results": []}
for name, t in args["trajectories"]:
    try:
        Trajectory.model_validate(t)
        out["results"].append([name, None])
    except Exception as e:
        out["results"].append([name, str(e)[:2000]])
print(json.dumps(out))
"""

SHOW = r"""
import contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
import show_result
buf = io.StringIO()
error = None
with contextlib.redirect_stdout(buf):
    try:
        got = show_result.get_result(sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[2])
    except Exception as e:  # its fixed domain groups (Office, Daily...) need those domains present
        got, error = None, f"{type(e).__name__}: {e}"
print(json.dumps({"printed": buf.getvalue(), "result": got, "error": error}))
"""


def _venv(keep: Path | None) -> tuple[Path, bool]:
    venv = keep or Path(tempfile.mkdtemp(prefix="gh-bench-harbor-", dir="/var/tmp"))
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--ignore-requires-python",
                        f"harbor=={HARBOR_VERSION}"], check=True, timeout=600)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "pydantic>=2"], check=True, timeout=600)
    return venv, keep is None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-schema", action="store_true")
    ap.add_argument("--keep-venv", type=Path, default=None)
    ap.add_argument("--report", type=Path, action="append", default=[], help="a `gh-runner export --format atif` dir")
    ap.add_argument("--osworld-checkout", type=Path, default=None)
    args = ap.parse_args()

    started = time.monotonic()
    venv, remove = _venv(args.keep_venv)
    try:
        installed = time.monotonic() - started
        unframed = {"model": {**recorded.MODEL_TOTALS, "calls": [*recorded.CALLS, None, recorded.CALLS[0]]}}
        ours = [("recorded", traj.atif_trajectory(recorded.replay())),
                ("recorded, not assisted, no answer", traj.atif_trajectory(
                    recorded.replay(assisted=False, takeovers=None, answer=None))),
                ("recorded, calls without a frame, no answer", traj.atif_trajectory(
                    recorded.replay(answer=None, metrics=unframed))),
                ("recorded before calls were kept", traj.atif_trajectory(
                    recorded.replay(metrics={"model": recorded.MODEL_TOTALS})))]
        for d in args.report:
            ours += [(str(p), json.loads(p.read_text())) for p in sorted(d.rglob("trajectory.json"))]
        done = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK], input=json.dumps({"trajectories": ours}),
                              capture_output=True, text=True, check=True, timeout=120)
        live = json.loads(done.stdout)
        recorded_doc = json.loads(SCHEMA.read_text())
        same = live["schema"] == recorded_doc["schema"]
        print(f"harbor {HARBOR_VERSION} (venv {installed:.1f} s): recorded schema "
              f"{'matches' if same else 'DIFFERS from'} the package's Trajectory.model_json_schema()")
        if args.write_schema and not same:
            recorded_doc.update(harbor_version=HARBOR_VERSION, schema=live["schema"])
            SCHEMA.write_text(json.dumps(recorded_doc, indent=1, sort_keys=True) + "\n")
            print(f"  rewrote {SCHEMA.relative_to(REPO)}")
        failed = 0
        for name, error in live["results"]:
            print(f"  Trajectory.model_validate({name}): {'valid' if error is None else 'INVALID: ' + error}")
            failed += error is not None
        if args.osworld_checkout is not None:
            failed += _show_result(venv, args.osworld_checkout)
        return 1 if failed or not same else 0
    finally:
        if remove:
            shutil.rmtree(venv, ignore_errors=True)


def _show_result(venv: Path, checkout: Path) -> int:
    out = Path(tempfile.mkdtemp(prefix="gh-bench-osworld-", dir="/var/tmp"))
    try:
        base = {"assisted": False, "takeovers": None}
        runs = [recorded.replay(**base, score=0.5, outcome="failed"),
                recorded.replay(**base, attempt_id="at_2", key="t2", category="chrome", score=1.0)]
        traj.write_files(traj.export_files(traj.ExportFormat.OSWORLD, [(r, recorded.png) for r in runs]), out)
        done = subprocess.run([str(venv / "bin" / "python"), "-c", SHOW, str(checkout), str(out),
                               traj.OSWORLD_ACTION_SPACE, "claude-cu", traj.OSWORLD_OBSERVATION],
                              capture_output=True, text=True, check=True, timeout=120)
        got = json.loads(done.stdout)
        print("OSWorld show_result.py over our export (ours: os 0.5, chrome 1.0, all 0.75):")
        print("  " + got["printed"].strip().replace("\n", "\n  "))
        if got["error"]:
            print(f"  it stopped: {got['error']}")
        return 0 if got["result"] == [0.5, 1.0] or sorted(got["result"] or []) == [0.5, 1.0] else 1
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# The test command: sets up the host (scripts/setup.sh), then lint, types, the whole suite and the
# desktop smoke. Arguments go to every pytest run.
#
# linux-desktop, the guest every GUI feature stands on, is proven on every run, not only on demand:
# - Its image is built beside the suite, in the background at the lowest CPU and I/O priority, into
#   its own images dir (scripts/desktop-image.sh says why). The builder keys it by its build inputs
#   (image-builder/imagebuilder/linux_desktop.py): a host that built the same inputs before finds it
#   current in seconds; a fresh host takes about 15 minutes beside the suite, well inside it.
# - The desktop smoke runs after the suite, once the image is there: the `desktop_smoke` tests
#   (`gh-runner selftest --image linux-desktop`, one desktop case passed by a GUI-only agent through
#   the hypervisor, one model-agent step). Their runner keeps its state dir across runs on this host
#   ($GH_TEST_DESKTOP_STATE_DIR), so the desktop's warm snapshot (a boot to the signed-in session and
#   a 2 GiB memory save) is made once per image, not on every run. Measured on 2 cores: the smoke
#   takes about 3 minutes with the snapshot kept, 5-6 on a host's first run.
# A build or smoke that fails fails the run, with its log printed, after the suite has had its say.
#
# GH_TEST_DESKTOP=1 runs every desktop test (`-m desktop`, the smoke among them) instead of the
# smoke: about 30 minutes more on a 2-core host, past what CI allows on top of the suite.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
# Where a run's time goes (setup, the suite, the build beside it, the smoke), for a run near its budget.
phase() { printf '\033[1m[test]\033[0m %s at %s s\n' "$*" "$(( $(date +%s) - started ))" >&2; }
bash scripts/setup.sh || exit $?
phase "setup done"
export GH_IMAGES_DIR=${GH_IMAGES_DIR:-/var/tmp/gh-runner/images}
export GH_DESKTOP_IMAGES_DIR=${GH_DESKTOP_IMAGES_DIR:-/var/tmp/gh-runner/desktop-images}
export GH_TEST_DESKTOP_STATE_DIR=${GH_TEST_DESKTOP_STATE_DIR:-/var/tmp/gh-runner/desktop-state}
if [ "${GH_TEST_DESKTOP:-0}" = 1 ]; then desktop_tests=desktop; else desktop_tests=desktop_smoke; fi

build_log=$(mktemp /tmp/gh-desktop-build.XXXXXX.log)
# A process group of its own (setsid), so that stopping it stops the builder's QEMU and mmdebstrap too.
setsid nice -n 19 ionice -c 3 bash scripts/desktop-image.sh >"$build_log" 2>&1 &
build_pid=$!
mypy_log=$(mktemp /tmp/gh-mypy.XXXXXX.log)
mypy_pid=""
# Whatever happens, no build or mypy is left running behind the run, and no log of theirs stays.
# (The desktop state dir stays on purpose: it is the warm snapshot's cache.)
trap '[ -n "$build_pid" ] && kill -- -"$build_pid" 2>/dev/null; [ -n "$mypy_pid" ] && kill "$mypy_pid" 2>/dev/null; rm -f "$build_log" "$mypy_log"' EXIT

rc=0
.venv/bin/ruff check . || rc=1
# mypy from a clean clone takes about 70 s of one core: it runs beside the suite, at the lowest CPU
# priority (the suite waits on guests and timeouts often enough to leave it the cycles), and its
# report is printed after the suite's.
nice -n 19 .venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
# The slowest tests are listed at the end: where the time of a run that creeps past its budget goes.
.venv/bin/pytest -q -p no:cacheprovider --durations=25 -m "not desktop" "$@" || rc=1
wait "$mypy_pid" || rc=1
mypy_pid=""
cat "$mypy_log"
phase "suite done"

# The desktop smoke (or, with GH_TEST_DESKTOP=1, every desktop test) on the image built beside the suite.
if wait "$build_pid"; then
  build_pid=""
  tail -n 2 "$build_log"
  phase "linux-desktop ready; the desktop smoke (-m $desktop_tests)"
  mkdir -p "$GH_TEST_DESKTOP_STATE_DIR"
  chmod 755 "$GH_TEST_DESKTOP_STATE_DIR"  # QEMU (libvirt-qemu) reaches the warm snapshot through it
  GH_IMAGES_DIR=$GH_DESKTOP_IMAGES_DIR .venv/bin/pytest -q -p no:cacheprovider --durations=10 -m "$desktop_tests" "$@"
  r=$?; [ $r = 0 ] || [ $r = 5 ] || rc=1  # 5: the arguments chose no desktop test
  phase "desktop smoke done"
else
  build_pid=""
  echo "building linux-desktop failed; its log:" >&2
  tail -n 60 "$build_log" >&2
  rc=1
fi
exit $rc

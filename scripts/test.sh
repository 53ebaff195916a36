#!/usr/bin/env bash
# The test command: sets up the host (scripts/setup.sh), then lint, types and the whole suite.
#
# The linux-desktop image (tests marked `desktop`) takes 10-15 minutes to build on a fresh 2-core
# machine, most of it installing packages. It is built in the background, at the lowest CPU and
# I/O priority, into its own images dir (scripts/desktop-image.sh says why), while the rest of the
# suite runs; the desktop tests run once it is there, with that dir as their images dir. A build
# that fails fails the run (its log is printed), after the rest of the suite has had its say.
# Arguments go to both pytest runs.
#
# GH_TEST_DESKTOP=1 turns this on. It is off by default (issue 22): measured on a fresh 2-core machine,
# the build took 911 s beside the suite (40 min) and the desktop tests 29 min more, past CI's 40.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit $?
export GH_IMAGES_DIR=${GH_IMAGES_DIR:-/var/tmp/gh-runner/images}
desktop=${GH_TEST_DESKTOP:-0}

build_log=$(mktemp /tmp/gh-desktop-build.XXXXXX.log)
build_pid=""
if [ "$desktop" = 1 ]; then
  nice -n 19 ionice -c 3 bash scripts/desktop-image.sh >"$build_log" 2>&1 &
  build_pid=$!
fi
mypy_log=$(mktemp /tmp/gh-mypy.XXXXXX.log)
mypy_pid=""
# Whatever happens, no build or mypy is left running behind the run.
trap '[ -n "$build_pid" ] && kill "$build_pid" 2>/dev/null; [ -n "$mypy_pid" ] && kill "$mypy_pid" 2>/dev/null; rm -f "$build_log" "$mypy_log"' EXIT

rc=0
.venv/bin/ruff check . || rc=1
# mypy from a clean clone takes about 70 s of one core: it runs beside the suite, at the lowest CPU
# priority (the suite waits on guests and timeouts often enough to leave it the cycles), and its
# report is printed after the suite's.
nice -n 19 .venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
# The slowest tests are listed at the end: where the time of a run that creeps past 40 minutes goes.
.venv/bin/pytest -q -p no:cacheprovider --durations=25 -m "not desktop" "$@" || rc=1
wait "$mypy_pid" || rc=1
mypy_pid=""
cat "$mypy_log"

if [ "$desktop" = 1 ]; then
  if wait "$build_pid"; then
    build_pid=""
    tail -n 3 "$build_log"
    export GH_DESKTOP_IMAGES_DIR=${GH_DESKTOP_IMAGES_DIR:-/var/tmp/gh-runner/desktop-images}
    GH_IMAGES_DIR=$GH_DESKTOP_IMAGES_DIR \
      .venv/bin/pytest -q -p no:cacheprovider -m desktop "$@"
    r=$?; [ $r = 0 ] || [ $r = 5 ] || rc=1  # 5: the arguments chose no desktop test
  else
    build_pid=""
    echo "building linux-desktop failed; its log:" >&2
    tail -n 60 "$build_log" >&2
    rc=1
  fi
fi
exit $rc

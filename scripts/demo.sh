#!/usr/bin/env bash
# The main job: `gh-runner local` runs the example cases on the linux-tiny image against the
# built-in agents `noop` and `reference`, with an embedded control plane and runner.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export GH_IMAGES_DIR=${GH_IMAGES_DIR:-/var/tmp/gh-runner/images}
.venv/bin/gh-runner local examples/linux-basics.yaml --agents noop,reference --repeat 2 \
  --images-dir "$GH_IMAGES_DIR" "$@"
# Then what a pass rate is worth: validate three cases made to show it (one valid, one broken, one whose
# setup rolls a die). Two tries per agent keep it short; use --repeat 3 or more to be surer of "flaky".
exec .venv/bin/gh-runner validate examples/validation.yaml --repeat 2 --images-dir "$GH_IMAGES_DIR"

#!/usr/bin/env bash
# The main job: `gh-runner local` runs the example cases on the linux-tiny image against the
# built-in agents `noop` and `reference`, with an embedded control plane and runner.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export GH_IMAGES_DIR=${GH_IMAGES_DIR:-/var/tmp/gh-runner/images}
exec .venv/bin/gh-runner local examples/linux-basics.yaml --agents noop,reference --repeat 2 \
  --images-dir "$GH_IMAGES_DIR" "$@"

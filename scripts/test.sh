#!/usr/bin/env bash
# The test command: sets up the host (scripts/setup.sh), then lint, types and the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export GH_IMAGES_DIR=${GH_IMAGES_DIR:-/var/tmp/gh-runner/images}
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/pytest -q -p no:cacheprovider "$@"

#!/usr/bin/env bash
# Builds the linux-desktop image (Debian 12 XFCE, signed in; docs/desktop-guests.md) into
# $GH_IMAGES_DIR when it is missing or its packages changed. Cached by version: when the image is
# current this returns in about a second. A fresh build takes 10-15 minutes on a 2-core host
# (mmdebstrap of ~500 packages, one boot to the signed-in session with its proofs, compression);
# the downloaded packages and the configured root are kept in /var/cache/gh-runner-build.
set -euo pipefail
cd "$(dirname "$0")/.."
export GH_IMAGES_DIR=${GH_IMAGES_DIR:-/var/tmp/gh-runner/images}
if ! command -v mmdebstrap >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi
started=$(date +%s)
.venv/bin/python image-builder/build linux-desktop --out "$GH_IMAGES_DIR"
printf '\033[1m[setup]\033[0m linux-desktop ready in %s s\n' "$(( $(date +%s) - started ))" >&2

#!/usr/bin/env bash
# Builds the linux-desktop image (Debian 12 XFCE, signed in; docs/desktop-guests.md) into its own
# images dir, $GH_DESKTOP_IMAGES_DIR (default /var/tmp/gh-runner/desktop-images), when it is missing
# or its packages changed, and links linux-tiny from $GH_IMAGES_DIR beside it. Its own dir: a
# runner keeps every image of its images dir hot (the pool), and the demo's and the suite's runners
# on linux-tiny have no use for a 2 GiB desktop booted beside them.
#
# Cached by version: when the image is current this returns in about a second. A fresh build takes
# 10-15 minutes on a 2-core host (mmdebstrap of ~500 packages, one boot to the signed-in session
# with its proofs, compression); the downloaded packages and the configured root are kept in
# /var/cache/gh-runner-build.
set -euo pipefail
cd "$(dirname "$0")/.."
export GH_IMAGES_DIR=${GH_IMAGES_DIR:-/var/tmp/gh-runner/images}
out=${GH_DESKTOP_IMAGES_DIR:-/var/tmp/gh-runner/desktop-images}
if ! command -v mmdebstrap >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi
mkdir -p "$out"
chmod 755 "$out"  # QEMU (libvirt-qemu) reaches the images through it
started=$(date +%s)
.venv/bin/python image-builder/build linux-desktop --out "$out"
# linux-tiny beside it, hard links to the built one (same files, no copy), refreshed when it changed.
if [ -d "$GH_IMAGES_DIR/linux-tiny" ] && ! cmp -s "$GH_IMAGES_DIR/linux-tiny/build-inputs.json" "$out/linux-tiny/build-inputs.json"; then
  rm -rf "$out/linux-tiny"
  cp -al "$GH_IMAGES_DIR/linux-tiny" "$out/linux-tiny" 2>/dev/null || cp -a "$GH_IMAGES_DIR/linux-tiny" "$out/linux-tiny"
fi
printf '\033[1m[setup]\033[0m linux-desktop ready in %s (%s s)\n' "$out" "$(( $(date +%s) - started ))" >&2

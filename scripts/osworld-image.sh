#!/usr/bin/env bash
# Builds the osworld-desktop image (linux-desktop with OSWorld's applications and gh_osworld;
# docs/desktop-guests.md, docs/osworld.md) into its own images dir, $GH_OSWORLD_IMAGES_DIR (default
# /var/tmp/gh-runner/osworld-images), when it is missing or its inputs changed, and links linux-tiny
# from $GH_IMAGES_DIR beside it. With $GH_OSWORLD_FILES_DIR set (the importer's store,
# DIR/sha256/<hex>: `gh-runner import osworld --fetch-only --files-dir DIR`) those files go into the
# image's file store; without it the store is empty.
#
# Not run by scripts/test.sh: a fresh build takes about half an hour on a 2-core host (see
# docs/desktop-guests.md for the measured figures), more than CI's budget. Cached by version like
# scripts/desktop-image.sh: a current image returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
export GH_IMAGES_DIR=${GH_IMAGES_DIR:-/var/tmp/gh-runner/images}
out=${GH_OSWORLD_IMAGES_DIR:-/var/tmp/gh-runner/osworld-images}
if ! command -v mmdebstrap >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi
mkdir -p "$out"
chmod 755 "$out"  # QEMU (libvirt-qemu) reaches the images through it
files=()
if [ -n "${GH_OSWORLD_FILES_DIR:-}" ]; then files=(--files-dir "$GH_OSWORLD_FILES_DIR"); fi
started=$(date +%s)
.venv/bin/python image-builder/build osworld-desktop --out "$out" "${files[@]}"
# linux-tiny beside it, hard links to the built one (same files, no copy), refreshed when it changed.
if [ -d "$GH_IMAGES_DIR/linux-tiny" ] && ! cmp -s "$GH_IMAGES_DIR/linux-tiny/build-inputs.json" "$out/linux-tiny/build-inputs.json"; then
  rm -rf "$out/linux-tiny"
  cp -al "$GH_IMAGES_DIR/linux-tiny" "$out/linux-tiny" 2>/dev/null || cp -a "$GH_IMAGES_DIR/linux-tiny" "$out/linux-tiny"
fi
printf '\033[1m[setup]\033[0m osworld-desktop ready in %s (%s s)\n' "$out" "$(( $(date +%s) - started ))" >&2

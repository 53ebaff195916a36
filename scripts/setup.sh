#!/usr/bin/env bash
# Sets up this host for gh-runner development, tests and the demo. Idempotent; safe to run often.
# On a fresh Debian 12 machine it installs the apt packages, leaves /dev/kvm as udev would, makes
# libvirt answer (systemd's units where systemd is PID 1, `libvirtd -d` only where it is not), makes
# the venv and builds the linux-tiny image.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export GH_IMAGES_DIR=${GH_IMAGES_DIR:-/var/tmp/gh-runner/images}

log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

APT_PACKAGES=(
  qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-clients libvirt-dev pkg-config
  gcc  # linux-tiny's one program of its own (image-builder/imagebuilder/assets/linux-tiny/src)
  e2fsprogs cpio zstd xz-utils genisoimage chromium novnc postgresql systemd
  mmdebstrap  # the linux-desktop image's root, from Debian's packages (scripts/desktop-image.sh)
  nftables dnsmasq-base  # the isolated network: its host firewall (nft), its DHCP (libvirt runs dnsmasq)
  haproxy  # the load balancer in front of several gh-server processes (docs/operations.md, tests/gateway/topology.py)
  docker-registry apache2-utils  # an OCI registry for start states and images (docs/start-states.md; tests/registry start one on loopback)
  python3  # the system interpreter the gh-agent uid can run (tests' command agents; the venv may be under /root)
  # the osworld-desktop guest's Python modules, Debian's as there: tests/osworld_guest runs gh_osworld on them
  python3-openpyxl python3-docx python3-pandas python3-pil python3-lxml python3-numpy python3-xlsxwriter
  python3-cssselect python3-yaml poppler-utils publicsuffix
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
if [ ${#missing[@]} -gt 0 ]; then
  log "installing apt packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# /dev/kvm as udev would leave it (root:kvm 0660). A host without udev may leave it root:root 0600:
# libvirtd then probes QEMU as root (KVM works) but checks the result as libvirt-qemu (it does not),
# finds its capability cache stale and probes again on every call, so every start waits tens of
# seconds. Only when nothing manages the device: udev's rules own it where udev runs.
if [ -e /dev/kvm ] && ! { [ -S /run/udev/control ] || pgrep -x systemd-udevd >/dev/null; }; then
  getent group kvm >/dev/null || { log "creating group kvm"; $SUDO groupadd --system kvm; }
  if [ "$(stat -c '%G %a' /dev/kvm)" != "kvm 660" ]; then
    log "/dev/kvm was $(stat -c '%U:%G %a' /dev/kvm): setting root:kvm 0660, as udev would"
    $SUDO chgrp kvm /dev/kvm
    $SUDO chmod 0660 /dev/kvm
  fi
  if id libvirt-qemu >/dev/null 2>&1 && ! id -nG libvirt-qemu | tr ' ' '\n' | grep -qx kvm; then
    log "adding libvirt-qemu to group kvm"
    $SUDO usermod -aG kvm libvirt-qemu
  fi
fi

# gh-server starts command agents (the agents under test: untrusted) in group gh-agent, each with a uid
# of its own, so they cannot read its data dir, database or keys (docs/security.md).
if ! getent group gh-agent >/dev/null; then log "creating group gh-agent"; $SUDO groupadd --system gh-agent; fi
if ! getent passwd gh-agent >/dev/null; then
  log "creating user gh-agent"
  $SUDO useradd --system --gid gh-agent --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gh-agent
fi

# libvirt: the system's units where systemd runs, our own daemons only where nothing manages them.
bash scripts/libvirt-up.sh

# Python: one venv in the repository, reinstalled when pyproject.toml changes.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then log "creating .venv"; "$PY" -m venv .venv; fi
stamp=.venv/.gh-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing Python packages into .venv"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi

# What the osworld-desktop guest takes from PyPI (pypi.txt, pinned by hash), where tests/osworld_guest/kit.py
# puts it on the guest Python's path; reinstalled only when the pin changes.
GUEST_PYTHON_DIR=/var/lib/gh-runner/guest-python
pins=image-builder/imagebuilder/assets/osworld-desktop/pypi.txt
want=$(sha256sum "$pins" | cut -d' ' -f1)
if [ "$(cat "$GUEST_PYTHON_DIR/.gh-installed" 2>/dev/null)" != "$want" ]; then
  log "installing the guest's PyPI pins into $GUEST_PYTHON_DIR"
  $SUDO .venv/bin/pip install -q --require-hashes --no-deps --upgrade --target "$GUEST_PYTHON_DIR" -r "$pins"
  echo "$want" | $SUDO tee "$GUEST_PYTHON_DIR/.gh-installed" >/dev/null
fi

# The linux-tiny image (cached: a second build is instant).
log "linux-tiny image in $GH_IMAGES_DIR"
.venv/bin/python image-builder/build linux-tiny --out "$GH_IMAGES_DIR"

# The linux-desktop image (tests marked `desktop`, examples/desktop-basics.yaml): cached like
# linux-tiny, a fresh build takes 10-15 minutes. The test command builds it beside the suite
# (scripts/test.sh); GH_SETUP_DESKTOP=1 builds it here, before anything else runs.
if [ "${GH_SETUP_DESKTOP:-0}" = 1 ]; then
  log "linux-desktop image in $GH_IMAGES_DIR"
  bash scripts/desktop-image.sh
fi

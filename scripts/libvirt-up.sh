#!/usr/bin/env bash
# Makes libvirt answer on qemu:///system, the way this host manages its daemons.
# Where systemd is PID 1 it uses the system's own socket-activated units (virtlogd.socket,
# libvirtd.socket) and never starts a second, unmanaged daemon beside them. Only where there is no
# systemd (containers, this development sandbox) does it start `virtlogd -d` and `libvirtd -d`.
# Idempotent; says what it changed. GH_SYSTEMD_RUN_DIR exists for the tests of both branches.
set -euo pipefail
SYSTEMD_RUN_DIR=${GH_SYSTEMD_RUN_DIR:-/run/systemd/system}
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

if [ -d "$SYSTEMD_RUN_DIR" ]; then
  for daemon in virtlogd libvirtd; do
    if systemctl is-active --quiet "$daemon.service" || systemctl is-active --quiet "$daemon.socket"; then
      continue
    fi
    log "enabling $daemon.socket (systemd starts $daemon on its first connection)"
    $SUDO systemctl enable --now "$daemon.socket"
  done
else
  # Each daemon runs with the system's PATH, never the caller's: libvirtd finds QEMU on its PATH, so a
  # test's fake QEMU (tests/fakekvm.py) first on it became every guest's QEMU until libvirtd restarted.
  daemon_env=(env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
  for daemon in virtlogd libvirtd; do
    if ! pgrep -x "$daemon" >/dev/null; then
      log "starting $daemon (no systemd here)"
      $SUDO "${daemon_env[@]}" "$(command -v "$daemon")" -d
    fi
  done
fi
for _ in $(seq 1 100); do
  timeout 5 virsh -c qemu:///system version >/dev/null 2>&1 && exit 0
  sleep 0.1
done
timeout 10 virsh -c qemu:///system version >/dev/null || { log "libvirtd does not answer on qemu:///system"; exit 1; }

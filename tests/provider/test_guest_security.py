"""What a guest can do to its neighbours and to the runner's host: real libvirt, QEMU, linux-tiny.

- disks are shared with QEMU only (0640/0440, QEMU's group, 0750 directories) and QEMU still
  opens them (the machine boots; a machine boots from a saved version);
- a machine that writes past its cap is stopped with a typed error;
- on the `isolated` network two guests cannot reach each other and a guest cannot reach a
  listening host port, while the host still reaches each guest on the WinRM port (and no other),
  and a guest still gets its address by DHCP and is found by its lease (as WinRM finds it).

linux-tiny has no network driver in its image (its manifest says `network: none`), so the network
test loads virtio_net from the very kernel package the image was built from (the builder's cache)
into the guest, and gives the guests static addresses on the isolated subnet.
"""

from __future__ import annotations

import asyncio
import base64
import grp
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from kit.libvirt import started
from kit.poll import until
from kit.scratch import traversable_tmpdir

from providers.base import MachineSource
from providers.errors import MachineLimit, MachineLimitExceeded
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.network import BRIDGE
from providers.qemu.winrm import machine_address

from .conftest import Machines, make_provider

pytestmark = pytest.mark.asyncio(loop_scope="module")

KERNEL_DEBS = Path("/var/cache/gh-runner-build/debs")
NET_MODULES = ("kernel/net/core/failover.ko", "kernel/drivers/net/net_failover.ko", "kernel/drivers/net/virtio_net.ko")


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def qemu_group() -> int:
    return grp.getgrnam("libvirt-qemu").gr_gid


async def test_disks_are_shared_with_qemu_only_and_qemu_opens_them(provider: QemuProvider,
                                                                   machines: Machines) -> None:
    m = await machines.create()
    assert mode(provider.state_dir) == 0o711 and mode(provider.machines_dir) == 0o711
    assert mode(m.dir) == 0o750 and m.dir.stat().st_gid == qemu_group()
    assert mode(m.overlay) == 0o640 and m.overlay.stat().st_gid == qemu_group()
    r = await m.run_script("echo secret > /typed; sync; echo ok", timeout=60)
    assert r.stdout.strip() == "ok"
    saved = await m.save("ss_perm", 1, with_memory=False)
    vdir = saved.disk_path.parent
    assert mode(vdir) == 0o750 and vdir.stat().st_gid == qemu_group()
    assert mode(saved.disk_path) == 0o440 and saved.disk_path.stat().st_gid == qemu_group()
    assert mode(vdir.parent) == 0o750 and mode(provider.states.root) == 0o711
    # QEMU (libvirt-qemu) opens the saved disk as the backing file of a new machine.
    again = await machines.create(MachineSource(image="linux-tiny", start_state_id="ss_perm", version=1))
    r = await again.run_script("cat /typed", timeout=60)
    assert r.stdout.strip() == "secret"
    await provider.delete_version("ss_perm", 1)


async def test_a_machine_over_its_write_cap_is_stopped_with_a_typed_error(provider: QemuProvider,
                                                                         machines: Machines) -> None:
    provider.write_cap_bytes = 48 * 1024 * 1024
    try:
        m = await machines.create()
    finally:
        provider.write_cap_bytes = None
    with pytest.raises(MachineLimitExceeded) as caught:
        await m.run_script("dd if=/dev/zero of=/fill bs=1M count=160 conv=fsync 2>&1; echo done", timeout=300)
    assert caught.value.limit == MachineLimit.DISK_WRITE_CAP
    assert "over its cap of 48 MiB" in str(caught.value)
    assert await m.domain.state() is None  # the domain is gone, not just paused
    with pytest.raises(MachineLimitExceeded):
        await m.screenshot()


# -- the isolated network ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def net_modules() -> dict[str, bytes]:
    """virtio_net and its dependencies, from the kernel package linux-tiny was built from."""
    kver = yaml.safe_load((Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images")) / "linux-tiny" /
                           "build-inputs.json").read_text())["inputs"]["kernel"]
    debs = sorted(KERNEL_DEBS.glob(f"linux-image-{kver}_*.deb"))
    if not debs:
        pytest.fail(f"no kernel package for {kver} in {KERNEL_DEBS}: build linux-tiny (scripts/setup.sh)")
    out = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(debs[-1])], capture_output=True, check=True, timeout=120)
    import io

    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tf:
        for member in tf:
            for rel in NET_MODULES:
                if member.name.endswith(f"/{kver}/{rel}"):
                    f = tf.extractfile(member)
                    assert f is not None
                    found[rel] = f.read()
    assert set(found) == set(NET_MODULES), sorted(found)
    return found


def _isolated_image(images_dir: Path) -> Path:
    imgs = traversable_tmpdir("gh-iso-images-")
    d = imgs / "linux-tiny"
    d.mkdir(mode=0o755)
    for f in (images_dir / "linux-tiny").iterdir():
        if f.name != "image.yaml":
            (d / f.name).symlink_to(f)
    manifest = yaml.safe_load((images_dir / "linux-tiny" / "image.yaml").read_text())
    manifest["network"] = "isolated"
    (d / "image.yaml").write_text(yaml.safe_dump(manifest))
    return imgs


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def iso_provider(images_dir: Path, state_root: Path, runner_name: str) -> AsyncIterator[QemuProvider]:
    """linux-tiny with `network: isolated` (its files linked, its manifest changed)."""
    imgs = _isolated_image(images_dir)
    try:
        async with started(make_provider(imgs, state_root, runner_name, "iso")) as p:
            yield p
    finally:
        shutil.rmtree(imgs, ignore_errors=True)


DHCP_SCRIPT = """#!/bin/sh
[ "$1" = bound ] || [ "$1" = renew ] || exit 0
ifconfig "$interface" "$ip" netmask "$subnet" up
"""


async def _net_up(m: QemuMachine, modules: dict[str, bytes], address: str | None) -> None:
    """Load the NIC driver, configure eth0 (a static address, or DHCP when None), listen on 5985."""
    for rel in NET_MODULES:
        b64 = base64.b64encode(modules[rel]).decode()
        name = rel.rsplit("/", 1)[1]
        chunks = [b64[i:i + 120000] for i in range(0, len(b64), 120000)]
        for i, chunk in enumerate(chunks):
            op = ">" if i == 0 else ">>"
            r = await m.run_script(f"printf '%s' '{chunk}' {op} /tmp/{name}.b64", timeout=60)
            assert r.exit_code == 0, r.stderr
        r = await m.run_script(f"base64 -d /tmp/{name}.b64 > /tmp/{name} && insmod /tmp/{name}", timeout=60)
        assert r.exit_code == 0, r.stdout + r.stderr
    if address is None:
        configure = (f"printf '%s' '{DHCP_SCRIPT}' > /tmp/dhcp.sh && chmod +x /tmp/dhcp.sh && "
                     "ip link set eth0 up && udhcpc -i eth0 -s /tmp/dhcp.sh -n -q -t 10 -T 2 >/dev/null 2>&1 && ")
    else:
        configure = f"ip link set eth0 up && ip addr add {address}/24 dev eth0 && "
    r = await m.run_script(
        "for i in $(seq 50); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done; " + configure +
        # a listener on the WinRM port: the host must still reach it (host-initiated), guests must not
        "(echo hello-from-guest | nc -l -p 5985 >/dev/null 2>&1 &) ; "
        "(echo other-port | nc -l -p 8080 >/dev/null 2>&1 &) ; echo up", timeout=60)
    assert r.stdout.strip().endswith("up"), r.stdout + r.stderr


def _host_reaches(address: str, port: int = 5985, timeout: float = 60.0) -> bytes:
    import time

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=5) as s:
                return s.recv(100)
        except OSError as e:
            last = e
            time.sleep(0.5)
    raise AssertionError(f"the host could not reach {address}:{port}: {last}")


async def test_isolated_guests_reach_neither_each_other_nor_the_host(iso_provider: QemuProvider,
                                                                    net_modules: dict[str, bytes]) -> None:
    ms = Machines(iso_provider)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    host_port = listener.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = listener.accept()
                accepted.append(peer)
                conn.close()
            except TimeoutError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        a, b = await asyncio.gather(ms.create(), ms.create())
        # b takes its address by DHCP and is found by its lease, as the WinRM channel finds a guest.
        await asyncio.gather(_net_up(a, net_modules, "192.168.239.5"), _net_up(b, net_modules, None))
        b_addr = await asyncio.to_thread(machine_address, b)
        probe = ("nc -w 3 {addr} {port} </dev/null && echo CONNECTED; "
                 "ping -c 1 -W 2 {addr} >/dev/null 2>&1 && echo PINGED; echo probed")
        to_b = await a.run_script(probe.format(addr=b_addr, port=5985), timeout=120)
        assert to_b.stdout.strip().endswith("probed"), to_b.stderr
        assert "hello-from" not in to_b.stdout and "CONNECTED" not in to_b.stdout and "PINGED" not in to_b.stdout
        to_host = await a.run_script(probe.format(addr="192.168.239.1", port=host_port), timeout=120)
        assert "CONNECTED" not in to_host.stdout and "PINGED" not in to_host.stdout
        assert accepted == []
        # The controls: both guests' links are up, and host-initiated connections (WinRM's) get through.
        assert (await asyncio.to_thread(_host_reaches, b_addr)).startswith(b"hello-from")
        assert (await asyncio.to_thread(_host_reaches, "192.168.239.5")).startswith(b"hello-from")
        # Of what the host opens towards a guest, only WinRM's ports leave the host.
        with pytest.raises(OSError):
            await asyncio.to_thread(socket.create_connection, (b_addr, 8080), 5)
        ports = (await asyncio.to_thread(subprocess.run, ["bridge", "-d", "link", "show", "master", BRIDGE],
                                         capture_output=True, text=True, timeout=30)).stdout
        assert ports.count("isolated on") >= 2, ports
    finally:
        stop.set()
        t.join(timeout=5)
        listener.close()
        await ms.destroy_all()


async def test_console_log_is_capped_and_read_by_its_tail(machines: Machines) -> None:
    """virtlogd writes the serial console (libvirt's stdio_handler "logd") and rotates it at its
    max_size (2 MiB by default, max_backups 3): a guest printing without end fills at most a few
    MiB. The runner reads only the tail, whatever the size."""
    import tracemalloc

    m = await machines.create()
    r = await m.run_script("head -c 5000000 /dev/zero | tr '\\0' 'x' > /dev/ttyS0; echo END-OF-FLOOD > /dev/ttyS0; "
                           "echo done", timeout=600)
    assert r.stdout.strip() == "done", r.stderr
    # The guest's serial bytes reach virtlogd's file after the script has returned (QEMU's chardev, then
    # virtlogd's own write): wait for the last line, as a reader of the log would.
    await until(lambda: m.console_tail(300).endswith("END-OF-FLOOD"), 60, "the flood's last line in the log")
    files = sorted(p.name for p in m.dir.iterdir() if p.name.startswith("console.log"))
    sizes = {p.name: p.stat().st_size for p in m.dir.iterdir() if p.name.startswith("console.log")}
    assert "console.log.0" in files, sizes  # rotated
    assert all(size <= 2 * 1024 * 1024 for size in sizes.values()), sizes
    assert sum(sizes.values()) <= 4 * 2 * 1024 * 1024, sizes
    tracemalloc.start()
    tail = m.console_tail(300)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert tail.endswith("END-OF-FLOOD") and peak < 64 * 1024, peak

"""`gh-runner doctor` on a good host and on broken ones, against the real libvirt and a real
websocket server; asserts what it prints (the fix commands) and its exit code."""

from __future__ import annotations

import email.utils
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakekvm import on_path
from kit.net import free_port, wait_healthy
from kit.scratch import traversable_tmpdir
from pydantic import SecretStr
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

from gh_runner import doctor
from providers.qemu import accel

REPO = Path(__file__).resolve().parents[2]
GOOD_TOKEN = "gh_rn_doctor_good_3b1f"
REVOKED_TOKEN = "gh_rn_doctor_revoked_9c2e"


@dataclass
class Cfg:
    images_dir: Path
    state_dir: Path
    server: str | None = None
    token: Any = None
    token_file: Path | None = None
    slots: int = 1
    libvirt_uri: str = "qemu:///system"
    disk_reserve_mib: int = 2048
    extra: dict[str, Any] = field(default_factory=dict)


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Under /var/tmp with traversable parents: the KVM probe's files must be reachable by libvirt-qemu.
    d = traversable_tmpdir("gh-doctor-test-")
    try:
        yield d
    finally:
        subprocess.run(["chattr", "-R", "-i", str(d)], capture_output=True, timeout=30, check=False)
        shutil.rmtree(d)


def fake_image(images: Path, name: str = "probe", disk: bytes = b"disk bytes", sha: str | None = None) -> Path:
    """A firmware-boot image (no kernel for the accelerator decision to boot): valid unless `sha` is given."""
    d = images / name
    d.mkdir(parents=True)
    (d / "disk.qcow2").write_bytes(disk)
    (d / "image.yaml").write_text(
        f"name: {name}\nos: linux\nversion: '1'\nshell: sh\nguest_channels: [qemu-ga]\nboot: {{kind: bios}}\n"
        f"memory_mib: 64\nvcpus: 1\ndisk: {{file: disk.qcow2, sha256: '{sha or hashlib.sha256(disk).hexdigest()}'}}\n"
    )
    return d


class FakeControlPlane:
    """Just enough of gh-server for doctor: /healthz with a Date header and the runner handshake."""

    def __init__(self, clock_offset: float = 0.0) -> None:
        self.clock_offset = clock_offset
        self.server: Server = serve(self._handler, "127.0.0.1", 0, process_request=self._process)
        self.port = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def _date(self) -> str:
        return email.utils.formatdate(time.time() + self.clock_offset, usegmt=True)

    def _process(self, conn: ServerConnection, request: Request) -> Response | None:
        if request.path == "/healthz":
            r = conn.respond(200, "ok\n")
            del r.headers["Date"]
            r.headers["Date"] = self._date()
            return r
        if request.path != "/v1/runners/connect":
            return conn.respond(404, "not found\n")
        auth = request.headers.get("Authorization", "")
        if auth not in (f"Bearer {GOOD_TOKEN}", f"Bearer {REVOKED_TOKEN}"):
            return conn.respond(401, "bad token\n")
        return None

    def _handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        if ws.request.headers.get("Authorization") == f"Bearer {REVOKED_TOKEN}":
            ws.close(4001, "token revoked")
            return
        for _ in ws:  # hold the session until the client leaves
            pass

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


@pytest.fixture
def control_plane() -> Iterator[FakeControlPlane]:
    cp = FakeControlPlane()
    try:
        yield cp
    finally:
        cp.close()


def run_doctor(cfg: Cfg) -> tuple[int, str, dict[str, str]]:
    buf = io.StringIO()
    rc = doctor.main(cfg, out=buf, tcg_timeout=60, net_timeout=10)
    text = buf.getvalue()
    status = {}
    for line in text.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) >= 2 and parts[0] in ("OK", "WARN", "FAIL", "SKIP"):
            status[parts[1]] = parts[0]
    assert GOOD_TOKEN not in text and REVOKED_TOKEN not in text, "doctor printed the token"
    return rc, text, status


@pytest.mark.libvirt
@pytest.mark.slow
def test_good_host(workdir: Path, control_plane: FakeControlPlane) -> None:
    fake_image(workdir / "images")
    token = workdir / "token"
    token.write_text(GOOD_TOKEN + "\n")
    token.chmod(0o600)
    cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state", server=control_plane.url,
              token=SecretStr(GOOD_TOKEN), token_file=token)
    rc, text, status = run_doctor(cfg)
    assert rc == 0, text
    assert status == {"libvirt": "OK", "kvmdev": "OK", "caps": "OK", "images": "OK", "creds": "SKIP",
                      "kvm": status["kvm"], "disk": "OK", "state": "OK", "server": "OK", "clock": "OK",
                      "registry": "SKIP"}, text  # no registry configured: said, not failed
    assert status["kvm"] in ("OK", "WARN"), text
    if status["kvm"] == "WARN":
        assert "falls back to TCG" in text
    assert "probe 1" in text and "token accepted" in text
    assert not list(workdir.glob("state/.doctor-*")), "doctor left its write probe behind"


@pytest.mark.libvirt
@pytest.mark.slow
def test_good_host_boots_the_linux_image_kernel_for_the_kvm_probe(images_dir: Path, workdir: Path) -> None:
    cfg = Cfg(images_dir=images_dir, state_dir=workdir / "state")
    rc, text, status = run_doctor(cfg)
    assert rc == 0, text
    assert status["images"] == "OK" and "linux-tiny" in text
    # Under KVM the provider's probe boots it; on a nested host like CI's, the TCG fallback does.
    assert "a KVM guest booted a kernel" in text or "through libvirt a Linux kernel booted" in text, text


@pytest.mark.libvirt
@pytest.mark.slow
def test_doctor_shows_the_accelerator_decision_and_what_it_stands_on(images_dir: Path, workdir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """On a host whose KVM runs firmware but never a Linux kernel: the runner's decision (TCG), why,
    and that TCG runs a guest through libvirt; then the runner's kept decision, and how to redo it."""
    fake = on_path(workdir / "fake", monkeypatch)
    state = workdir / "state"
    state.mkdir()
    cfg = Cfg(images_dir=images_dir, state_dir=state)
    rc, text, status = run_doctor(cfg)
    assert rc == 0 and status["kvm"] == "WARN", text
    kvm = next(ln for ln in text.splitlines() if ln.startswith("WARN  kvm"))
    assert "tcg: a Linux kernel booted under KVM never printed" in kvm, kvm
    assert "the runner falls back to TCG" in kvm and "through libvirt a Linux kernel booted" in kvm, kvm
    assert fake.calls() == ["kvm kernel=1"] and not (state / accel.CACHE_NAME).exists()  # doctor keeps nothing

    accel.decide(images_dir / "linux-tiny" / "vmlinuz", state / accel.CACHE_NAME)  # as the runner's start does
    monkeypatch.setattr(accel, "_kept", {})  # another process: only the file
    _, text, status = run_doctor(cfg)
    assert status["kvm"] == "WARN" and "never printed" in text and "kept from earlier this boot" in text, text
    assert f"to decide again: rm {state / accel.CACHE_NAME} and restart gh-runner" in text, text
    assert len(fake.calls()) == 2  # the runner's decision booted once; doctor read it


def test_cli_doctor_subcommand(workdir: Path) -> None:
    """`gh-runner doctor` as operators type it: flags reach the checks, the exit code is the verdict."""
    fake_image(workdir / "images", name="broken", sha="1" * 64)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GH_RUNNER_")}
    env.pop("CREDENTIALS_DIRECTORY", None)
    r = subprocess.run(
        [sys.executable, "-m", "gh_local.cli", "doctor", "--images-dir", str(workdir / "images"),
         "--state-dir", str(workdir / "state"), "--libvirt-uri", "qemu+unix:///system?socket=/nonexistent/sock"],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL  libvirt  cannot reach libvirt at qemu+unix:///system?socket=/nonexistent/sock" in r.stdout
    assert "FAIL  images" in r.stdout and "checksum mismatch" in r.stdout
    assert "check(s) failed: libvirt, images" in r.stdout


def test_no_libvirt(workdir: Path) -> None:
    fake_image(workdir / "images")
    cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state",
              libvirt_uri="qemu+unix:///system?socket=/nonexistent/libvirt-sock")
    rc, text, status = run_doctor(cfg)
    assert rc == 1
    assert status["libvirt"] == "FAIL" and status["kvm"] == "SKIP"
    assert "cannot reach libvirt at qemu+unix:///system?socket=/nonexistent/libvirt-sock" in text
    assert "fix: systemctl enable --now libvirtd" in text
    assert text.rstrip().endswith("check(s) failed: libvirt")


@pytest.mark.libvirt
def test_bad_image_checksum(workdir: Path) -> None:
    fake_image(workdir / "images", name="good")
    fake_image(workdir / "images", name="broken", sha="0" * 64)
    cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state")
    rc, text, status = run_doctor(cfg)
    assert rc == 1
    assert status["images"] == "FAIL"
    assert "broken/image.yaml: checksum mismatch for disk.qcow2" in text
    assert "fix: rebuild or re-copy the broken image" in text
    assert "check(s) failed: images" in text


def test_missing_images_dir(workdir: Path) -> None:
    cfg = Cfg(images_dir=workdir / "nope", state_dir=workdir / "state", libvirt_uri="test:///default")
    rc, text, status = run_doctor(cfg)
    assert rc == 1 and status["images"] == "FAIL"
    assert f"fix: mkdir -p {workdir / 'nope'} && image-builder/build linux-tiny --out {workdir / 'nope'}" in text


@pytest.mark.libvirt
def test_unwritable_state_dir(workdir: Path) -> None:
    fake_image(workdir / "images")
    state = workdir / "state"
    state.mkdir()
    # We run as root, which ignores permission bits: the immutable flag stops even root.
    r = subprocess.run(["chattr", "+i", str(state)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.fail(f"chattr +i is needed to make a directory root cannot write: {r.stderr}")
    cfg = Cfg(images_dir=workdir / "images", state_dir=state)
    rc, text, status = run_doctor(cfg)
    assert rc == 1 and status["state"] == "FAIL"
    assert f"state dir not writable by root: {state}: Operation not permitted" in text
    assert f"fix: chown -R root {state}" in text


def test_token_file_readable_by_others(workdir: Path) -> None:
    fake_image(workdir / "images")
    token = workdir / "token"
    token.write_text(GOOD_TOKEN)
    token.chmod(0o644)
    cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state", token_file=token,
              libvirt_uri="test:///default")
    rc, text, status = run_doctor(cfg)
    assert rc == 1 and status["state"] == "FAIL"
    assert f"token file {token} is mode 0644" in text and f"fix: chmod 600 {token}" in text


def test_state_dir_qemu_cannot_traverse(workdir: Path) -> None:
    fake_image(workdir / "images")
    locked = workdir / "locked"
    locked.mkdir(mode=0o700)
    locked.chmod(0o700)
    cfg = Cfg(images_dir=workdir / "images", state_dir=locked / "state", libvirt_uri="test:///default")
    rc, text, status = run_doctor(cfg)
    assert rc == 1 and status["state"] == "FAIL"
    assert f"libvirt-qemu cannot enter {locked}" in text and f"fix: chmod o+x {locked}" in text


def test_wrong_token(workdir: Path, control_plane: FakeControlPlane) -> None:
    fake_image(workdir / "images")
    cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state", server=control_plane.url,
              token=SecretStr("gh_rn_not_the_right_one"), libvirt_uri="test:///default")
    rc, text, status = run_doctor(cfg)
    assert rc == 1 and status["server"] == "FAIL"
    assert "token refused (HTTP 401)" in text and "fix: issue a new runner token" in text
    assert "gh_rn_not_the_right_one" not in text


def test_revoked_token_closed_after_handshake(workdir: Path, control_plane: FakeControlPlane) -> None:
    fake_image(workdir / "images")
    cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state", server=control_plane.url,
              token=SecretStr(REVOKED_TOKEN), libvirt_uri="test:///default")
    rc, text, status = run_doctor(cfg)
    assert rc == 1 and status["server"] == "FAIL" and "close code 4001" in text


def test_against_the_real_control_plane(workdir: Path) -> None:
    """doctor against a real `gh-server`: a registered runner's token is accepted, another refused."""
    admin = "gh_ak_doctor_admin_key_5d1c9e0f7a"
    data = workdir / "server"
    port = free_port()
    env = {**os.environ, "GH_SERVER_API_KEY": admin}
    srv = subprocess.Popen([sys.executable, "-m", "gh_server.cli", "--data-dir", str(data), "--port", str(port)],
                           env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, proc=srv, timeout=60)
        r = httpx.post(f"{base}/v1/runners", json={"name": "doctor-test"},
                       headers={"Authorization": f"Bearer {admin}"}, timeout=10)
        r.raise_for_status()
        token = r.json()["token"]
        fake_image(workdir / "images")
        cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state", server=base,
                  token=SecretStr(token), libvirt_uri="test:///default")
        buf = io.StringIO()
        rc = doctor.main(cfg, out=buf, net_timeout=10)
        text = buf.getvalue()
        assert rc == 0 and "OK    server" in text and "token accepted" in text and "OK    clock" in text, text
        assert token not in text
        cfg.token = SecretStr("gh_rn_" + "x" * 32)
        _rc, text, status = run_doctor(cfg)
        assert status["server"] == "FAIL" and "token refused" in text, text
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def test_server_unreachable(workdir: Path) -> None:
    fake_image(workdir / "images")
    cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state", server="ws://127.0.0.1:9",
              token=SecretStr(GOOD_TOKEN), libvirt_uri="test:///default")
    rc, text, status = run_doctor(cfg)
    assert rc == 1 and status["server"] == "FAIL" and status["clock"] == "SKIP"
    assert "fix: curl -sS http://127.0.0.1:9/healthz" in text


def test_clock_off(workdir: Path) -> None:
    cp = FakeControlPlane(clock_offset=-3600)
    try:
        fake_image(workdir / "images")
        cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state", server=cp.url,
                  token=SecretStr(GOOD_TOKEN), libvirt_uri="test:///default")
        rc, text, status = run_doctor(cfg)
    finally:
        cp.close()
    assert rc == 1 and status["server"] == "OK" and status["clock"] == "FAIL"
    m = re.search(r"this host's clock is \+(\d+) s off the server's", text)
    assert m and abs(int(m.group(1)) - 3600) <= 2, text
    assert "fix: timedatectl set-ntp true" in text


def test_not_enough_disk_for_the_slots(workdir: Path) -> None:
    fake_image(workdir / "images")
    free = shutil.disk_usage(workdir).free
    slots = min(256, int(free // doctor.slot_bytes({})) + 2)
    if slots * doctor.slot_bytes({}) <= free:
        pytest.fail("this filesystem has more free space than 256 slots need; the check cannot be provoked")
    cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state", slots=slots, libvirt_uri="test:///default")
    rc, text, status = run_doctor(cfg)
    assert rc == 1 and status["disk"] == "FAIL"
    m = re.search(r"fix: free space under \S+, or set slots: (\d+) in the config", text)
    assert m and 1 <= int(m.group(1)) < slots, text


def test_a_small_state_dir_runs_with_a_warning(workdir: Path) -> None:
    """A real 1600 MiB tmpfs (tmpfs allocates nothing up front): one linux slot fits, so the runner
    runs there, with its reserve scaled down to a tenth of the filesystem, and doctor says so."""
    import subprocess

    fake_image(workdir / "images")
    mnt = workdir / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1600m", "tmpfs", str(mnt)], check=True, timeout=30)
    try:
        cfg = Cfg(images_dir=workdir / "images", state_dir=mnt / "state", libvirt_uri="test:///default")
        _, text, status = run_doctor(cfg)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True, timeout=30)
    assert status["disk"] == "WARN", text
    assert "the runner keeps 160 MiB free, not the configured disk_reserve_mib 2048" in text, text


def test_env_credentials_directory_token_checked(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = workdir / "creds"
    creds.mkdir()
    (creds / "gh-runner-token").write_text(GOOD_TOKEN)
    os.chmod(creds / "gh-runner-token", 0o640)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    fake_image(workdir / "images")
    cfg = Cfg(images_dir=workdir / "images", state_dir=workdir / "state", libvirt_uri="test:///default")
    rc, text, status = run_doctor(cfg)
    assert rc == 1 and status["state"] == "FAIL" and "mode 0640" in text

"""doctor and Windows images: the credentials file is readable by the runner's service user and by
no one else; an image no guest channel can run is named."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
from imagebuilder import windows10

from providers.qemu import hostchecks

# "nobody" stands in for the gh-runner service user: it exists on every Debian host, is not root,
# and its primary group is nogroup.
SERVICE = pwd.getpwnam("nobody")


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> hostchecks.HostContext:
    monkeypatch.setattr(hostchecks, "SERVICE_USER", SERVICE.pw_name)
    c = hostchecks.HostContext("qemu:///system", tmp_path)
    c.manifests["win10-22h2"] = windows10.manifest("22h2-x", "0" * 64, 1 << 30)
    return c


def _creds(ctx: hostchecks.HostContext, mode: int, gid: int) -> Path:
    p = ctx.images_dir / windows10.CREDENTIALS_FILE
    p.write_text("username: gh\npassword: pw\n")
    os.chown(p, 0, gid)
    p.chmod(mode)
    return p


def test_the_service_group_with_0640_is_fine(ctx: hostchecks.HostContext) -> None:
    _creds(ctx, 0o640, SERVICE.pw_gid)
    c = hostchecks.check_credentials(ctx)
    assert c.status == "OK" and "readable by nobody only" in c.detail


def test_a_root_only_file_from_a_sudo_build_fails_and_says_how_to_fix(ctx: hostchecks.HostContext) -> None:
    p = _creds(ctx, 0o600, 0)
    c = hostchecks.check_credentials(ctx)
    assert c.status == "FAIL" and f"nobody cannot read the credentials file {p} (root:root 0600)" in c.detail
    assert c.fix == f"chgrp nobody {p} && chmod 0640 {p}"


def test_a_file_every_user_can_read_fails(ctx: hostchecks.HostContext) -> None:
    p = _creds(ctx, 0o644, SERVICE.pw_gid)
    c = hostchecks.check_credentials(ctx)
    assert c.status == "FAIL" and f"{p} is mode 0644: every user can read it" in c.detail


def test_a_missing_file_fails_and_images_without_winrm_skip(ctx: hostchecks.HostContext) -> None:
    c = hostchecks.check_credentials(ctx)
    assert c.status == "FAIL" and "No such file" in c.detail and "image-builder/build windows-10" in (c.fix or "")
    ctx.manifests.clear()
    assert hostchecks.check_credentials(ctx).status == "SKIP"


def test_an_image_no_guest_channel_can_run_fails_the_images_check() -> None:
    import hashlib
    import shutil
    import tempfile

    from providers.manifest import dump_manifest

    images = Path(tempfile.mkdtemp(prefix="gh-doctor-win-", dir="/var/tmp"))
    try:
        images.chmod(0o755)
        (images / "win10-22h2").mkdir()
        (images / "win10-22h2" / "disk.qcow2").write_bytes(b"disk")
        m = windows10.manifest("22h2-x", hashlib.sha256(b"disk").hexdigest(), 1 << 30)
        m = m.model_copy(update={"guest_channels": ["qemu-ga"]})
        (images / "win10-22h2" / "image.yaml").write_text(dump_manifest(m))
        c = hostchecks.check_images(hostchecks.HostContext("qemu:///system", images))
        assert c.status == "FAIL" and "image 'win10-22h2': no guest channel runs its powershell scripts" in c.detail
    finally:
        shutil.rmtree(images)

"""The image manifest model refuses bad manifests with a message that names the problem."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from providers.manifest import (
    ImageManifest,
    ManifestError,
    dump_manifest,
    load_manifest,
    parse_manifest,
)

DISK = b"not really a qcow2, but the checksum is what is checked"


def _linux(**over: object) -> dict[str, object]:
    m: dict[str, object] = {
        "name": "linux-tiny", "os": "linux", "version": "abc123", "shell": "sh", "guest_channels": ["qemu-ga"],
        "boot": {"kind": "direct-kernel", "kernel": "vmlinuz", "initrd": "initrd.img", "cmdline": "root=/dev/vda"},
        "machine": "pc", "memory_mib": 256, "vcpus": 1, "video": "vga",
        "disk": {"file": "disk.qcow2", "sha256": hashlib.sha256(DISK).hexdigest()},
        "tablet": "virtio",
    }
    m.update(over)
    return m


def _write(tmp_path: Path, manifest: dict[str, object], files: dict[str, bytes] | None = None) -> Path:
    d = tmp_path / str(manifest.get("name", "x"))
    d.mkdir()
    (d / "image.yaml").write_text(yaml.safe_dump(manifest))
    default = {"disk.qcow2": DISK, "vmlinuz": b"k", "initrd.img": b"i"}
    for name, data in (files if files is not None else default).items():
        (d / name).write_bytes(data)
    return d


def test_a_valid_manifest_loads_and_round_trips(tmp_path: Path) -> None:
    m = load_manifest(_write(tmp_path, _linux()))
    assert m.name == "linux-tiny" and m.tablet == "virtio"
    assert m.checksum == "sha256:" + hashlib.sha256(DISK).hexdigest()
    assert parse_manifest(dump_manifest(m)) == m


def test_tablet_defaults_to_usb_for_manifests_written_before_it_existed() -> None:
    data = _linux()
    del data["tablet"]
    assert ImageManifest.model_validate(data).tablet == "usb"


def test_missing_disk_is_refused_with_its_name(tmp_path: Path) -> None:
    d = _write(tmp_path, _linux(), {"vmlinuz": b"k", "initrd.img": b"i"})
    with pytest.raises(ManifestError, match=r"missing file 'disk.qcow2'"):
        load_manifest(d)


def test_missing_kernel_is_refused(tmp_path: Path) -> None:
    d = _write(tmp_path, _linux(), {"disk.qcow2": DISK, "initrd.img": b"i"})
    with pytest.raises(ManifestError, match=r"missing file 'vmlinuz'"):
        load_manifest(d)


def test_checksum_mismatch_is_refused_and_says_what_to_do(tmp_path: Path) -> None:
    d = _write(tmp_path, _linux(), {"disk.qcow2": DISK + b"tampered", "vmlinuz": b"k", "initrd.img": b"i"})
    with pytest.raises(ManifestError, match=r"checksum mismatch for disk.qcow2.*rebuild the image"):
        load_manifest(d)
    assert load_manifest(d, verify_checksum=False).name == "linux-tiny"


def test_unknown_os_is_refused_naming_the_field(tmp_path: Path) -> None:
    d = _write(tmp_path, _linux(os="plan9"))
    with pytest.raises(ManifestError, match=r"os: Input should be 'linux' or 'windows'"):
        load_manifest(d)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"shell": "powershell"}, "a linux image runs scripts with shell 'sh'"),
        ({"guest_channels": ["winrm"]}, "needs a 'winrm' section"),
        ({"tablet": "ps2"}, "tablet"),
        ({"disk": {"file": "disk.qcow2", "sha256": "nothex"}}, "disk.sha256"),
        ({"surprise": 1}, "surprise"),
        ({"memory_mib": 1}, "memory_mib"),
    ],
)
def test_inconsistent_or_unknown_fields_are_refused(tmp_path: Path, over: dict[str, object], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        load_manifest(_write(tmp_path, _linux(**over)))


def test_file_names_must_stay_inside_the_image_directory(tmp_path: Path) -> None:
    d = _write(tmp_path, _linux(disk={"file": "../disk.qcow2", "sha256": hashlib.sha256(DISK).hexdigest()}))
    with pytest.raises(ManifestError, match="plain name"):
        load_manifest(d)


def test_name_must_match_the_directory(tmp_path: Path) -> None:
    d = _write(tmp_path, _linux())
    other = d.rename(tmp_path / "other-name")
    with pytest.raises(ManifestError, match="does not match its directory"):
        load_manifest(other)


def test_not_yaml_and_no_manifest_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no manifest"):
        load_manifest(tmp_path)
    with pytest.raises(ManifestError, match="not valid YAML"):
        parse_manifest("name: [unclosed")
    with pytest.raises(ManifestError, match="must be a YAML mapping"):
        parse_manifest("- a list")


def test_windows_manifest_needs_a_credentials_reference_not_a_password() -> None:
    data = {
        "name": "win10-22h2", "os": "windows", "version": "1", "shell": "powershell",
        "guest_channels": ["winrm", "qemu-ga"], "boot": {"kind": "uefi"}, "machine": "q35",
        "memory_mib": 4096, "vcpus": 2, "disk": {"file": "disk.qcow2", "sha256": "0" * 64},
        "winrm": {"credentials": "win10-22h2.credentials", "password": "hunter2"},
    }
    with pytest.raises(ManifestError, match="password"):
        parse_manifest(yaml.safe_dump(data))
    data["winrm"] = {"credentials": "win10-22h2.credentials"}
    assert parse_manifest(yaml.safe_dump(data)).winrm is not None


@pytest.mark.parametrize("ref", ["/etc/shadow", "../secrets.yaml", "a/../../b", "~/.creds", "", "dir/"])
def test_winrm_credentials_must_stay_inside_the_images_dir(ref: str) -> None:
    data = {
        "name": "win10-22h2", "os": "windows", "version": "1", "shell": "powershell",
        "guest_channels": ["winrm"], "boot": {"kind": "bios"}, "machine": "q35", "memory_mib": 4096, "vcpus": 2,
        "disk": {"file": "disk.qcow2", "sha256": "0" * 64}, "winrm": {"credentials": ref},
    }
    with pytest.raises(ManifestError, match=r"winrm.credentials: Value error, must be a relative path"):
        parse_manifest(yaml.safe_dump(data))
    data["winrm"] = {"credentials": "creds/win10-22h2.credentials.yaml"}
    assert parse_manifest(yaml.safe_dump(data)).winrm is not None

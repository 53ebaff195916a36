"""`gh-runner images push NAME` / `images pull REF`: the linux-tiny image through a real registry
(htpasswd + TLS), as an operator runs them (the CLI in a subprocess, settings from the environment)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from registry.server import RegistryProcess

REPO = Path(__file__).resolve().parents[2]


def gh_runner(args: list[str], reg: RegistryProcess, state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GH_RUNNER_")}
    env.update({"GH_RUNNER_REGISTRY_URL": reg.url, "GH_RUNNER_REGISTRY_REPOSITORY": "lab/gh",
                "GH_RUNNER_STATE_DIR": str(state)})
    if reg.credentials_file is not None and reg.ca_file is not None:
        env["GH_RUNNER_REGISTRY_CREDENTIALS_FILE"] = str(reg.credentials_file)
        env["GH_RUNNER_REGISTRY_CA_FILE"] = str(reg.ca_file)
    return subprocess.run([str(Path(sys.executable).parent / "gh-runner"), *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO, check=False)


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_push_then_pull_a_whole_image(secure_registry: RegistryProcess, images_dir: Path, tmp_path: Path) -> None:
    pushed = gh_runner(["images", "push", "linux-tiny", "--images-dir", str(images_dir)], secure_registry, tmp_path)
    assert pushed.returncode == 0, pushed.stderr
    assert f"{secure_registry.host}/lab/gh/images/linux-tiny@sha256:" in pushed.stdout
    other = tmp_path / "other-host-images"
    other.mkdir()
    ref = f"{secure_registry.host}/lab/gh/images/linux-tiny:latest"
    pulled = gh_runner(["images", "pull", ref, "--images-dir", str(other)], secure_registry, tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    assert "verified" in pulled.stdout
    for f in (images_dir / "linux-tiny").iterdir():
        if f.is_file():
            assert digest(other / "linux-tiny" / f.name) == digest(f), f.name
    assert not (other / ".incoming" / "linux-tiny").exists()
    listed = gh_runner(["images", "--json", "--images-dir", str(other)], secure_registry, tmp_path)
    assert '"name": "linux-tiny"' in listed.stdout
    again = gh_runner(["images", "pull", "linux-tiny", "--images-dir", str(other)], secure_registry, tmp_path)
    assert again.returncode == 0 and "already there" in again.stdout


def test_pull_of_a_missing_image_fails_plainly(plain_registry: RegistryProcess, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    r = gh_runner(["images", "pull", f"{plain_registry.host}/lab/gh/images/nothing:v1", "--images-dir",
                   str(images)], plain_registry, tmp_path)
    assert r.returncode == 1 and "not found" in r.stderr
    assert list(images.iterdir()) == []

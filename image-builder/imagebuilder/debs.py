"""Debian packages as build inputs: resolve with apt, download once into a cache, extract.

The cache is keyed by the exact file name and sha256 apt reports, so a second build with the
same package lists never touches the network, and a newer package in the lists is fetched.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import proc
from .errors import BuildError

DEFAULT_CACHE = Path(os.environ.get("GH_BUILD_CACHE", "/var/cache/gh-runner-build"))
_URI_LINE = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+) (?P<size>\d+) SHA256:(?P<sha>[0-9a-f]{64})$")


@dataclass(frozen=True)
class Deb:
    package: str
    filename: str
    size: int
    sha256: str

    @property
    def version(self) -> str:
        # name_version_arch.deb with ':' escaped as %3a by apt
        return self.filename.split("_")[1].replace("%3a", ":")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def resolve_metapackage(meta: str) -> str:
    """The concrete package a metapackage (e.g. linux-image-amd64) depends on right now."""
    out = proc.text(["apt-cache", "depends", meta], timeout=60)
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends:"):
            return line.split(":", 1)[1].strip()
    raise BuildError(f"apt-cache knows no dependency of {meta} (run apt-get update)")


def resolve(packages: list[str]) -> list[Deb]:
    """Ask apt (offline, from its package lists) which file and hash each package is."""
    cp = proc.run(["apt-get", "download", "--print-uris", *packages], timeout=120, check=False)
    if cp.returncode != 0:
        err = cp.stderr.decode(errors="replace").strip()
        raise BuildError(f"apt cannot resolve {', '.join(packages)}: {err[-400:]} (run apt-get update first)")
    debs = []
    for line in cp.stdout.decode().splitlines():
        m = _URI_LINE.match(line.strip())
        if m:
            pkg = m["file"].split("_")[0]
            debs.append(Deb(pkg, m["file"], int(m["size"]), m["sha"]))
    found = {d.package for d in debs}
    missing = [p for p in packages if p not in found]
    if missing:
        raise BuildError(f"apt gave no download for {', '.join(missing)}")
    return debs


class DebCache:
    def __init__(self, root: Path = DEFAULT_CACHE) -> None:
        self.root = root

    def path(self, deb: Deb) -> Path:
        return self.root / "debs" / deb.filename

    def fetch(self, debs: list[Deb]) -> dict[str, Path]:
        """Make every package present and verified in the cache; download only what is missing."""
        want = [d for d in debs if not self._valid(d)]
        if want:
            self._download(want)
        return {d.package: self.path(d) for d in debs}

    def _valid(self, deb: Deb) -> bool:
        p = self.path(deb)
        return p.is_file() and p.stat().st_size == deb.size and _sha256(p) == deb.sha256

    def _download(self, debs: list[Deb]) -> None:
        dest = self.root / "debs"
        dest.mkdir(parents=True, exist_ok=True)
        # apt-get download drops privileges to _apt, which must be able to write here.
        tmp = Path(tempfile.mkdtemp(prefix="dl-", dir=dest))
        try:
            os.chmod(tmp, 0o777)
            proc.run(["apt-get", "download", "-q", *[f"{d.package}={d.version}" for d in debs]], cwd=tmp, timeout=900)
            for d in debs:
                got = tmp / d.filename
                if not got.is_file():
                    raise BuildError(f"apt-get download did not produce {d.filename}")
                if _sha256(got) != d.sha256:
                    raise BuildError(f"{d.filename}: sha256 does not match apt's package list")
                os.replace(got, self.path(d))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def extract(deb_path: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    proc.run(["dpkg-deb", "-x", deb_path, dest], timeout=300)
    return dest


def owning_packages(paths: list[str]) -> dict[str, str]:
    """The Debian package that installed each host file, in one dpkg-query call (each path is
    tried in both /usr-merged spellings)."""
    spellings: dict[str, str] = {}
    for path in paths:
        for p in (path, os.path.realpath(path)):
            for c in (p, p[4:] if p.startswith("/usr/") else "/usr" + p):
                spellings.setdefault(c, path)
    cp = proc.run(["dpkg-query", "-S", *spellings], timeout=60, check=False)
    owners: dict[str, str] = {}
    for line in cp.stdout.decode(errors="replace").splitlines():
        pkgs, _, file = line.partition(": ")
        if file in spellings and not line.startswith("diversion"):
            owners.setdefault(spellings[file], pkgs.split(",")[0].split(":")[0].strip())
    missing = [p for p in paths if p not in owners]
    if missing:
        raise BuildError(f"no Debian package owns {', '.join(missing)}; cannot take it from a package")
    return owners


def apt_state() -> str:
    """A fingerprint of apt's package lists and dpkg's status: package resolution is a function of
    these, so an unchanged fingerprint lets an up-to-date check skip apt (which takes seconds)."""
    h = hashlib.sha256()
    lists = Path("/var/lib/apt/lists")
    files = sorted(lists.glob("*_Packages*")) + sorted(lists.glob("*Release")) + [Path("/var/lib/dpkg/status")]
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()

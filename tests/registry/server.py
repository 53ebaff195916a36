"""A real OCI registry for tests: Debian's `docker-registry` (CNCF distribution 2.8) on loopback.

`RegistryProcess.start(tmp, auth=True)` makes, when asked, a self-signed CA and a server certificate
for 127.0.0.1 (openssl) and an htpasswd file (bcrypt, apache2-utils' htpasswd), writes the
registry's config.yml with filesystem storage under `tmp`, starts `docker-registry serve`, and
polls `GET /v2/` until it answers (with a deadline). `stop()` kills it (and is what "the registry
goes down mid-run" does).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kit.net import free_port, wait_answering

USER = "labrunner"
PASSWORD = "s3cret-registry-pw"
START_TIMEOUT = 30.0


def _run(argv: list[str], **kw: object) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60, **kw)  # type: ignore[call-overload]


def make_ca_and_cert(d: Path) -> tuple[Path, Path, Path]:
    """A CA (ca.pem) and a server certificate for 127.0.0.1 and localhost signed by it."""
    ca_key, ca, key, csr, cert = d / "ca.key", d / "ca.pem", d / "server.key", d / "server.csr", d / "server.pem"
    _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
          "-days", "2", "-subj", "/CN=gh-runner test CA"])
    _run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
          "-subj", "/CN=127.0.0.1"])
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
    _run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
          "-out", str(cert), "-days", "2", "-extfile", str(ext)])
    return ca, cert, key


@dataclass
class RegistryProcess:
    root: Path
    port: int
    tls: bool
    auth: bool
    ca_file: Path | None = None
    credentials_file: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    _config: Path = field(default=Path())

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def storage(self) -> Path:
        return self.root / "storage"

    @classmethod
    def start(cls, root: Path, *, auth: bool = False) -> RegistryProcess:
        if shutil.which("docker-registry") is None:
            raise RuntimeError("docker-registry is not installed (scripts/setup.sh installs it)")
        root.mkdir(parents=True, exist_ok=True)
        reg = cls(root=root, port=free_port(), tls=auth, auth=auth)
        http_cfg: dict[str, object] = {"addr": f"127.0.0.1:{reg.port}"}
        cfg: dict[str, object] = {
            "version": 0.1, "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(reg.storage)}, "delete": {"enabled": True}},
            "http": http_cfg,
        }
        if auth:
            ca, cert, key = make_ca_and_cert(root)
            http_cfg["tls"] = {"certificate": str(cert), "key": str(key)}
            htpasswd = root / "htpasswd"
            _run(["htpasswd", "-Bbc", str(htpasswd), USER, PASSWORD])
            cfg["auth"] = {"htpasswd": {"realm": "gh-test", "path": str(htpasswd)}}
            reg.ca_file = ca
            reg.credentials_file = root / "registry-credentials"
            reg.credentials_file.write_text(f"{USER}:{PASSWORD}\n")
            reg.credentials_file.chmod(0o600)
        reg._config = root / "config.yml"
        reg._config.write_text(yaml.safe_dump(cfg))
        reg.run()
        return reg

    def run(self) -> None:
        """(Re)start the process on the same port and storage, and wait until it answers."""
        log = (self.root / "registry.log").open("ab")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(self._config)], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL)
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else True
        try:
            wait_answering(self.url + "/v2/", what="docker-registry", proc=self.proc, log=self.root / "registry.log",
                           timeout=START_TIMEOUT, ok=(200, 401), verify=verify)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def blob_file(self, digest: str) -> Path:
        """Where distribution keeps a blob's bytes (to tamper with it)."""
        hexd = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

"""A throwaway PostgreSQL cluster for the tests: initdb + pg_ctl under a temp dir, as the postgres user,
listening only on a unix socket in that dir. Fails (never skips) with the reason when it cannot start."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass


@dataclass
class PgCluster:
    root: str
    socket_dir: str
    port: int
    bindir: str

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@/{dbname}?host={self.socket_dir}&port={self.port}"

    def psql(self, sql: str) -> None:
        _run_as_postgres(
            [
                os.path.join(self.bindir, "psql"),
                "-h",
                self.socket_dir,
                "-p",
                str(self.port),
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ]
        )

    def create_db(self) -> str:
        name = "gh_" + uuid.uuid4().hex[:12]
        self.psql(f"CREATE DATABASE {name}")
        return name

    def stop(self) -> None:
        subprocess.run(
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                os.path.join(self.bindir, "pg_ctl"),
                "-D",
                os.path.join(self.root, "data"),
                "-m",
                "immediate",
                "-w",
                "-t",
                "30",
                "stop",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def _bindir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): apt-get install postgresql"
        )
    return os.path.dirname(found[-1])


def _run_as_postgres(cmd: list[str], timeout: float = 120) -> None:
    r = subprocess.run(
        ["runuser", "-u", "postgres", "--", *cmd], capture_output=True, text=True, timeout=timeout, check=False
    )
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")


def start_cluster() -> PgCluster:
    bindir = _bindir()
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError("no postgres user on this machine (Debian's postgresql package creates it)") from None
    root = tempfile.mkdtemp(prefix="gh-pg-", dir="/var/tmp")
    os.chmod(root, 0o755)
    shutil.chown(root, "postgres", "postgres")
    data = os.path.join(root, "data")
    sock = os.path.join(root, "sock")
    os.mkdir(sock)
    shutil.chown(sock, "postgres", "postgres")
    port = 5432 + (os.getpid() % 1000) + 1000
    try:
        _run_as_postgres(
            [os.path.join(bindir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"]
        )
        opts = f"-c listen_addresses='' -c unix_socket_directories={sock} -p {port} -c fsync=off -c max_connections=200"
        _run_as_postgres(
            [
                os.path.join(bindir, "pg_ctl"),
                "-D",
                data,
                "-o",
                opts,
                "-l",
                os.path.join(root, "log"),
                "-w",
                "-t",
                "60",
                "start",
            ]
        )
    except Exception:
        log = os.path.join(root, "log")
        tail = open(log).read()[-2000:] if os.path.exists(log) else ""
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {tail}") from None
    return PgCluster(root=root, socket_dir=sock, port=port, bindir=bindir)

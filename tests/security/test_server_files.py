"""gh-server's own files: the data dir 0700, the SQLite database (and its WAL) 0600, the generated admin
key in its 0600 file and printed only to a terminal (under a service, stdout is the journal)."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

from gh_server import db
from gh_server.app import create_state
from gh_server.auth import ensure_admin_key
from gh_server.settings import Settings


def _fresh(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir, admin_api_key=None, gateway=False)


def test_data_dir_0700_and_database_0600_even_when_made_open() -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        data_dir = Path(d) / "data"
        data_dir.mkdir(mode=0o755)
        os.chmod(data_dir, 0o755)  # as an operator's `mkdir` under umask 022 leaves it
        st = create_state(_fresh(data_dir))
        try:
            db.upgrade(st.engine)
            ensure_admin_key(st, io.StringIO())
            assert data_dir.stat().st_mode & 0o777 == 0o700
            files = {p.name: p.stat().st_mode & 0o777 for p in data_dir.iterdir()}
            assert files["gh-server.db"] == 0o600
            assert files.get("gh-server.db-wal", 0o600) == 0o600  # SQLite copies the database's mode
            assert files["admin-api-key"] == 0o600
            assert all(mode & 0o077 == 0 for mode in files.values()), files
        finally:
            st.engine.dispose()


def test_generated_admin_key_is_printed_only_to_a_terminal() -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        st = create_state(_fresh(Path(d) / "data"))
        try:
            db.upgrade(st.engine)
            out = io.StringIO()  # a pipe or the journal: not a terminal
            key = ensure_admin_key(st, out)
            assert key is not None and key not in out.getvalue()
            assert (Path(d) / "data" / "admin-api-key").read_text().strip() == key
        finally:
            st.engine.dispose()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        st = create_state(_fresh(Path(d) / "data"))
        master, slave = os.openpty()
        try:
            db.upgrade(st.engine)
            with os.fdopen(slave, "w", closefd=True) as tty:
                key = ensure_admin_key(st, tty)
            assert key is not None
            seen = b""
            while key.encode() not in seen:
                chunk = os.read(master, 4096)
                assert chunk, "the terminal got no key"
                seen += chunk
        finally:
            os.close(master)
            st.engine.dispose()

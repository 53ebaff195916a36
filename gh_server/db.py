"""Engine, sessions and schema migrations (alembic, scripts in gh_server/migrations)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from gh_server.settings import Settings

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Bound values (scripts, customer secret facts, token hashes) never appear in a database error's text,
# which may end up in a log.
HIDE_PARAMETERS = True


def prepare_data_dir(data_dir: Path) -> None:
    """The data dir holds the database, the admin key and the replay signing key: gh-server's alone (0700),
    whatever mode an operator made it with, so no other local user (and no agent) can look inside."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)


def _private_file(path: Path) -> None:
    # Made 0600 before SQLite opens it: SQLite gives its -wal and -shm files the database's mode.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)


def make_engine(settings: Settings) -> Engine:
    url = settings.sqlalchemy_url
    prepare_data_dir(settings.data_dir)
    if url.startswith("sqlite"):
        if settings.database_url is None:
            _private_file(settings.data_dir / "gh-server.db")
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": settings.db_busy_timeout},
            hide_parameters=HIDE_PARAMETERS,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            # WAL lets the API read while the scheduler writes; FKs make ON DELETE CASCADE real.
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(settings.db_busy_timeout * 1000)}")
            cur.close()

        return engine
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        connect_args={"connect_timeout": 10},
        hide_parameters=HIDE_PARAMETERS,
    )


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(engine: Engine | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if engine is not None:
        cfg.attributes["connection_engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`; existing data is kept (migrations are additive)."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()

"""Engine, sessions and schema migrations (alembic, scripts in gh_server/migrations)."""

from __future__ import annotations

import os
import sqlite3
from enum import StrEnum
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, exc, text
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


class DbHealth(StrEnum):
    OK = "ok"
    LOCKED = "locked"  # another writer holds SQLite's lock: writes wait, then answer 503
    UNREACHABLE = "unreachable"


def is_locked(exc: BaseException) -> bool:
    """SQLite's "database is locked" / "busy": a writer held the lock past the busy timeout."""
    text = str(getattr(exc, "orig", exc)).lower()
    return "locked" in text or "busy" in text


def probe(engine: Engine, settings: Settings, timeout: float = 0.5) -> DbHealth:
    """Can a request read, and (SQLite) take the write lock, within `timeout`? For /healthz."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            if engine.dialect.name != "sqlite":
                return DbHealth.OK
            raw = conn.connection.driver_connection
            assert raw is not None
            raw.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            try:
                raw.execute("BEGIN IMMEDIATE")  # the write lock, given back at once
                raw.execute("ROLLBACK")
            finally:
                raw.execute(f"PRAGMA busy_timeout={int(settings.db_busy_timeout * 1000)}")
    except (exc.OperationalError, sqlite3.OperationalError) as e:
        return DbHealth.LOCKED if is_locked(e) else DbHealth.UNREACHABLE
    except exc.SQLAlchemyError:
        return DbHealth.UNREACHABLE
    return DbHealth.OK


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

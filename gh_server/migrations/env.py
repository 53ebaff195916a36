"""Alembic environment: uses the connection gh_server.db hands over (or a URL from -x url=...)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from gh_server.models import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    conn = config.attributes.get("connection")
    if conn is not None:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or "sqlite:///:memory:"
    engine = create_engine(url)
    with engine.begin() as c:
        context.configure(connection=c, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()

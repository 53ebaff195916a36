"""console_sessions: the console's sign-ins (a hash of the cookie's secret, the key, the CSRF token, expiry)

See gh_server/console_sessions.py: a session is valid only while its API key is not revoked.

Revision ID: 0009_console_sessions
Revises: 0008_runner_paused
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import gh_server.models

revision: str = "0009_console_sessions"
down_revision: str | None = "0008_runner_paused"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("secret_hash", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(32), sa.ForeignKey("api_keys.id", ondelete="CASCADE"), nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("created_at", gh_server.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", gh_server.models.UTCDateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_console_sessions_key_id", "console_sessions", ["key_id"])
    op.create_index("ix_console_sessions_expires_at", "console_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_console_sessions_expires_at", "console_sessions")
    op.drop_index("ix_console_sessions_key_id", "console_sessions")
    op.drop_table("console_sessions")

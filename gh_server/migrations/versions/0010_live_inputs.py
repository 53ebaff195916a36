"""live_inputs: what a person sent an open start state's machine through a live view (who, when, how many)

Written once per view that delivered input (gh_server/live/inputs.py); shown as `inputs` on
GET /v1/start_states/{id}. The text typed is never stored.

Revision ID: 0010_live_inputs
Revises: 0009_console_sessions
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import gh_server.models

revision: str = "0010_live_inputs"
down_revision: str | None = "0009_console_sessions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "live_inputs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("start_state_id", sa.String(32), sa.ForeignKey("start_states.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("key_name", sa.String(200), nullable=False),
        sa.Column("started_at", gh_server.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("ended_at", gh_server.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("key_events", sa.Integer(), nullable=False),
        sa.Column("pointer_events", sa.Integer(), nullable=False),
        sa.Column("clipboard_events", sa.Integer(), nullable=False),
    )
    op.create_index("ix_live_inputs_start_state_id", "live_inputs", ["start_state_id"])


def downgrade() -> None:
    op.drop_index("ix_live_inputs_start_state_id", table_name="live_inputs")
    op.drop_table("live_inputs")

"""machine_grants and machine_relay: several gh-server processes on one database

Revision ID: 0004_scaleout
Revises: 0003_trust
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gh_server.models import UTCDateTime

revision: str = "0004_scaleout"
down_revision: str | None = "0003_trust"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "machine_grants",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("attempt_id", sa.String(32), nullable=False),
        sa.Column("runner_id", sa.String(32), nullable=False),
        sa.Column("start_state_id", sa.String(32), nullable=True),
        sa.Column("max_steps", sa.Integer(), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("questions", sa.Integer(), nullable=False),
        sa.Column("approvals", sa.Integer(), nullable=False),
        sa.Column("secret_typed", sa.Boolean(), nullable=False),
        sa.Column("customer_error", sa.Text(), nullable=True),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_machine_grants_attempt_id", "machine_grants", ["attempt_id"])
    op.create_index("ix_machine_grants_expires_at", "machine_grants", ["expires_at"])
    op.create_table(
        "machine_relay",
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("runner_id", sa.String(32), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("claimed_by", sa.String(64), nullable=True),
        sa.Column("response", sa.JSON(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_machine_relay_runner_id", "machine_relay", ["runner_id"])


def downgrade() -> None:
    op.drop_table("machine_relay")
    op.drop_table("machine_grants")

"""Results you can trust (gh_server/trust.py): test_cases.validation and attempt_labels.

Revision ID: 0003_trust
Revises: 0002_start_state_description
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import gh_server.models

revision: str = "0003_trust"
down_revision: str | None = "0002_start_state_description"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("test_cases") as batch:
        batch.add_column(sa.Column("validation", sa.JSON(), nullable=True))
    op.create_table(
        "attempt_labels",
        sa.Column("attempt_id", sa.String(length=32), sa.ForeignKey("attempts.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False, server_default=""),
        sa.Column("labelled_by", sa.String(length=32), nullable=True),
        sa.Column("created_at", gh_server.models.UTCDateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("attempt_labels")
    with op.batch_alter_table("test_cases") as batch:
        batch.drop_column("validation")

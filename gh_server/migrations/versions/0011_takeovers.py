"""attempts.assisted and attempts.takeovers: a person held the machine during the task

An assisted attempt is scored and shown, and counted apart from the agent's passes (docs/server-api.md,
"Assisted attempts"); `takeovers` lists each hold: who, when, how it ended, and the person's steps
(counts, named keys and clicks, never the text typed).

Revision ID: 0011_takeovers
Revises: 0010_live_inputs
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_takeovers"
down_revision: str | None = "0010_live_inputs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("assisted", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("takeovers", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("takeovers")
        batch.drop_column("assisted")

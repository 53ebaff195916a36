"""runners.scores: the runner's hello said it reads a check's score (a decimal last line, checkpoints)

A runner from before scores reads a check's `0.5` as the case's error, so a case that may score between 0
and 1 is leased only to a runner with this set (gh_server/attempts/matching.py). Rows from before this
revision are False until their runner says hello again.

Revision ID: 0014_runner_scores
Revises: 0013_save_points
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_runner_scores"
down_revision: str | None = "0013_save_points"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runners") as batch:
        batch.add_column(sa.Column("scores", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("runners") as batch:
        batch.drop_column("scores")

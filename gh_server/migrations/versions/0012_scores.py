"""attempts.score and attempts.checkpoints: a try scores in [0, 1]

`score` is the check's score or its checkpoints' weighted mean (docs/agents.md, "Scores"), a column so
results average it in SQL; `checkpoints` lists each one's name, weight, score and score before the task.
Attempts finished before this revision keep a null score: results read their outcome (1 passed, 0 failed).

Revision ID: 0012_scores
Revises: 0011_takeovers
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_scores"
down_revision: str | None = "0011_takeovers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("score", sa.Float(), nullable=True))
        batch.add_column(sa.Column("checkpoints", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("checkpoints")
        batch.drop_column("score")

"""attempts.save_points: a try's machine saved mid-task

Each entry is {save_point_id, step, created_at, bytes}, as the runner reports it in the attempt's result
(gh_wire.protocol.SavePoint); the save point itself is a start-state version on that runner
(docs/start-states.md, "Save points"). Attempts before this revision have none.

Revision ID: 0013_save_points
Revises: 0012_scores
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_save_points"
down_revision: str | None = "0012_scores"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("save_points", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("save_points")

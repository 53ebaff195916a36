"""test_runs.queue_timeout_seconds: a run may bound how long its attempts wait in the queue

An attempt queued longer ends as `error` with its queued_reason (gh_server/queue_wait.py).

Revision ID: 0006_queue_timeout
Revises: 0005_grant_ends
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_queue_timeout"
down_revision: str | None = "0005_grant_ends"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("test_runs") as batch:
        batch.add_column(sa.Column("queue_timeout_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("test_runs") as batch:
        batch.drop_column("queue_timeout_seconds")

"""machine_grants.step_limit_hit and machine_failure: how an agent's task ended, seen by every process

A step past the case's limit ends the task even when that request reached another gh-server
process than the one running the agent; a machine failure under the agent makes its giving up ours.

Revision ID: 0005_grant_ends
Revises: 0004_scaleout
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_grant_ends"
down_revision: str | None = "0004_scaleout"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("machine_grants") as batch:
        batch.add_column(sa.Column("step_limit_hit", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("machine_failure", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("machine_grants") as batch:
        batch.drop_column("machine_failure")
        batch.drop_column("step_limit_hit")

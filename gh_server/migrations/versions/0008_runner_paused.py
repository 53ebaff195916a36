"""runners.paused: why a connected runner takes no leases (hypervisor_down), for the runners list

A runner whose hypervisor stopped answering pauses itself (gh_runner/hypervisor.py) and says so in its heartbeats;
the API shows it as the runner's `paused`.

Revision ID: 0008_runner_paused
Revises: 0007_registry
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_runner_paused"
down_revision: str | None = "0007_registry"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runners") as batch:
        batch.add_column(sa.Column("paused", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runners") as batch:
        batch.drop_column("paused")

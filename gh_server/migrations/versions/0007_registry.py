"""start_state_versions.registry_ref and runners.registry: start states shared through an OCI registry

A version a runner pushed to its registry (docs/start-states.md) can be leased to any runner with that registry
and the base image; `registry_ref` is where it is (host/prefix/states@sha256:...), `runners.registry`
the registry a runner pulls from (host/prefix, from its hello).

Revision ID: 0007_registry
Revises: 0006_queue_timeout
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_registry"
down_revision: str | None = "0006_queue_timeout"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("start_state_versions") as batch:
        batch.add_column(sa.Column("registry_ref", sa.String(length=600), nullable=True))
    with op.batch_alter_table("runners") as batch:
        batch.add_column(sa.Column("registry", sa.String(length=300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runners") as batch:
        batch.drop_column("registry")
    with op.batch_alter_table("start_state_versions") as batch:
        batch.drop_column("registry_ref")

"""datasets: the manifest of a dataset in the store (its URL and SHA-256)

Revision ID: 0012_dataset_manifest
Revises: 0011_alerts
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_dataset_manifest"
down_revision = "0011_alerts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: rows from before this revision have no manifest; the first job on such a
    # dataset registers it again, which writes one.
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("manifest_url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("manifest_sha256", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("manifest_sha256")
        batch.drop_column("manifest_url")

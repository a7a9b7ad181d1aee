"""datasets: the archive of a dataset's files in the store (its URL and SHA-256)

Revision ID: 0007_dataset_archive
Revises: 0006_merge_heads
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_dataset_archive"
down_revision = "0006_merge_heads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: a dataset registered on one machine with a local store has no archive, and
    # rows from before this revision keep working from their folder.
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("archive_url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("archive_sha256", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("archive_sha256")
        batch.drop_column("archive_url")

"""sweeps: their own tags and note, set at submit and edited on the Sweeps page

Revision ID: 0014_sweep_labels
Revises: 0013_sweeps
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_sweep_labels"
down_revision = "0013_sweeps"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Not null with empty defaults: every sweep from before this revision has none. A sweep's
    # tags are few and lists of sweeps are short: a JSON list, not rows of their own.
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("tags", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("note", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("note")
        batch.drop_column("tags")

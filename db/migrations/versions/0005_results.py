"""results: a finished job's interpretation on its validation set

Revision ID: 0005_results
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_results"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "results",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("classes", sa.JSON(), nullable=False),
        sa.Column("confusion", sa.JSON(), nullable=False),
        sa.Column("per_class", sa.JSON(), nullable=False),
        sa.Column("top_losses", sa.JSON(), nullable=False),
        sa.Column("predictions", sa.JSON(), nullable=False),
        sa.Column("accuracy", sa.Float(), nullable=False),
        sa.Column("valid_loss", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )


def downgrade() -> None:
    op.drop_table("results")

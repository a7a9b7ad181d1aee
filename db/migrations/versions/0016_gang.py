"""multi-host jobs: a job's hosts and slice, and the hosts of each attempt

Revision ID: 0016_gang
Revises: 0015_profile_captures
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_gang"
down_revision = "0015_profile_captures"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain columns: adding them is one ALTER on SQLite, not a table copy. Every job so far
    # runs on one host.
    op.add_column("jobs", sa.Column("hosts", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("jobs", sa.Column("slice_name", sa.String(200), nullable=True))
    op.create_table(
        "job_hosts",
        sa.Column(
            "job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("lease", sa.Integer(), nullable=False),
        sa.Column("host", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("joined_at", sa.DateTime(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
        sa.Column("ready_at", sa.DateTime(), nullable=True),
        sa.Column("progress_at", sa.DateTime(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "lease", "host"),
    )


def downgrade() -> None:
    op.drop_table("job_hosts")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("slice_name")
        batch.drop_column("hosts")

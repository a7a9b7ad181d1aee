"""profile captures: requests to record a running job's next steps with a profiler

Revision ID: 0015_profile_captures
Revises: 0014_sweep_labels
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_profile_captures"
down_revision = "0014_sweep_labels"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "profile_captures",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requested_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("first_step", sa.Integer(), nullable=True),
        sa.Column("last_step", sa.Integer(), nullable=True),
        sa.Column("tool", sa.String(32), nullable=False, server_default=""),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
    )
    op.create_index("ix_profile_captures_job_id", "profile_captures", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_profile_captures_job_id", table_name="profile_captures")
    op.drop_table("profile_captures")

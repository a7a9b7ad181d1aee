"""jobs: a note; job_tags: a job's free tags, one row each, found by tag

Revision ID: 0009_tags_notes
Revises: 0008_scale_indexes
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_tags_notes"
down_revision = "0008_scale_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Not null with an empty default: every job from before this revision has an empty note.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=False, server_default=""))
    # One row per tag, so that "jobs tagged X" is a range of an index, not a scan of JSON.
    op.create_table(
        "job_tags",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("tag", sa.String(50), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "tag"),
    )
    op.create_index("ix_job_tags_tag_job_id", "job_tags", ["tag", "job_id"])


def downgrade() -> None:
    op.drop_index("ix_job_tags_tag_job_id", table_name="job_tags")
    op.drop_table("job_tags")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("note")

"""jobs: the claim's index in the claim's order, an index for lists by status; metrics: names
in byte order on Postgres

Revision ID: 0008_scale_indexes
Revises: 0007_dataset_archive
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_scale_indexes"
down_revision = "0007_dataset_archive"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The claim orders by `priority DESC, id`. The old (status, priority, id) index could not
    # give that order (a backward scan gives `priority DESC, id DESC`), so Postgres walked every
    # queued row and SQLite sorted them in a temporary B-tree: a claim cost grew with the queue.
    op.drop_index("ix_jobs_claim", table_name="jobs")
    op.create_index("ix_jobs_claim", "jobs", ["status", sa.text("priority DESC"), "id"])
    op.create_index("ix_jobs_status_id", "jobs", ["status", "id"])
    if op.get_bind().dialect.name == "postgresql":
        # In a linguistic collation (en_US.UTF-8, say) punctuation may sort apart from byte
        # order, and a prefix such as `epoch/` is no range of the index. SQLite's default
        # (BINARY) is byte order already. The indexes on the column are rebuilt.
        op.alter_column(
            "metrics",
            "name",
            type_=sa.String(64, collation="C"),
            existing_type=sa.String(64),
            existing_nullable=False,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(
            "metrics",
            "name",
            type_=sa.String(64),
            existing_type=sa.String(64, collation="C"),
            existing_nullable=False,
        )
    op.drop_index("ix_jobs_status_id", table_name="jobs")
    op.drop_index("ix_jobs_claim", table_name="jobs")
    op.create_index("ix_jobs_claim", "jobs", ["status", "priority", "id"])

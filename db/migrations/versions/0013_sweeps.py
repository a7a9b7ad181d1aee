"""sweeps: hyperparameter searches; jobs: the sweep and trial number of a sweep's trial

Revision ID: 0013_sweeps
Revises: 0012_dataset_manifest
Create Date: 2026-12-04

Optuna's own tables (its study storage) are not made here: `db.study.set_up`, called by
`python -m db upgrade` after these migrations, makes them with Optuna's own Alembic.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_sweeps"
down_revision = "0012_dataset_manifest"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("study_name", sa.String(100), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("driver", sa.String(200), nullable=True),
        sa.Column("driver_until", sa.DateTime(), nullable=True),
        sa.Column("driver_token", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("study_name", name="uq_sweeps_study_name"),
    )
    # Plain columns (no foreign key): adding them is one ALTER on SQLite, not a table copy.
    op.add_column("jobs", sa.Column("sweep_id", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("trial_number", sa.Integer(), nullable=True))
    op.create_index("ux_jobs_sweep_trial", "jobs", ["sweep_id", "trial_number"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_jobs_sweep_trial", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("trial_number")
        batch.drop_column("sweep_id")
    op.drop_table("sweeps")

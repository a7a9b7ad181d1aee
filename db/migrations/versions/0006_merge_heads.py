"""merge the dashboard index and the results table into one line of history

Revision ID: 0006_merge_heads
Revises: 0002_dashboard, 0005_results
Create Date: 2026-12-03
"""

from __future__ import annotations

revision = "0006_merge_heads"
down_revision = ("0002_dashboard", "0005_results")
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Both branches revised 0001 independently; this revision only joins them so that
    # `alembic heads` is one and every later migration has one parent.
    pass


def downgrade() -> None:
    pass

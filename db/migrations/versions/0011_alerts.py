"""alert_destinations: where alerts go (Apprise URLs) and for which events; alert_outbox: one
row per alert to send, drained exactly once by whichever process claims it

Revision ID: 0011_alerts
Revises: 0010_api_tokens
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_alerts"
down_revision = "0010_api_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_destinations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("shown_url", sa.Text(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", name="uq_alert_destinations_name"),
    )
    op.create_table(
        "alert_outbox",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("event_key", sa.String(200), nullable=False),
        sa.Column("destination_id", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("title", sa.String(300), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("claimed_by", sa.String(200), nullable=True),
        sa.Column("claimed_until", sa.DateTime(), nullable=True),
        sa.Column("sent_at", sa.DateTime(), nullable=True),
        sa.Column("gave_up_at", sa.DateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["destination_id"], ["alert_destinations.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("event_key", "destination_id", name="uq_alert_outbox_event"),
    )
    # The drain reads the pending rows, oldest due first.
    op.create_index("ix_alert_outbox_pending", "alert_outbox", ["sent_at", "gave_up_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_alert_outbox_pending", table_name="alert_outbox")
    op.drop_table("alert_outbox")
    op.drop_table("alert_destinations")

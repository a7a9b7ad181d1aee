"""Alembic environment: runs migrations on the engine `db.migrate` hands over."""

from __future__ import annotations

from alembic import context

from db.engine import get_engine
from db.models import Base

config = context.config
engine = config.attributes.get("engine") or get_engine()

with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    context.run_migrations()

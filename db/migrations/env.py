"""Alembic environment: runs migrations on the engine `db.migrate` hands over."""

from __future__ import annotations

from alembic import context

from db.engine import get_engine
from db.migrate import VERSION_TABLE
from db.models import Base

config = context.config
engine = config.attributes.get("engine") or get_engine()

with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # Not Alembic's default: Optuna's storage runs its own Alembic in this database.
        version_table=VERSION_TABLE,
        # Optuna's tables are Optuna's; comparisons of the schema look at traindeck's only.
        include_name=lambda name, type_, _parent: type_ != "table" or name in Base.metadata.tables,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    context.run_migrations()

"""Apply the Alembic migrations (`python -m db upgrade`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, inspect

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    # "head", not "heads": a second head is a mistake that tests/db/test_migrations.py catches,
    # and Alembic refuses "head" when there are two, instead of hiding it.
    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    command.downgrade(alembic_config(engine), revision)


def is_migrated(engine: Engine) -> bool:
    """Whether the schema exists at all (a quick check before a friendlier error message)."""
    return inspect(engine).has_table("jobs")

"""Apply the Alembic migrations (`python -m db upgrade`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Where Alembic keeps traindeck's revision. Databases made before sweeps kept it in Alembic's
# default `alembic_version`, which Optuna's storage (db.study) uses for its own revision.
VERSION_TABLE = "traindeck_alembic_version"
LEGACY_VERSION_TABLE = "alembic_version"


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring traindeck's tables to `revision`; at the head, Optuna's tables too (db.study)."""
    from db import study

    config = alembic_config(engine)
    _move_legacy_version_table(engine, config)
    # "head", not "heads": a second head is a mistake that tests/db/test_migrations.py catches,
    # and Alembic refuses "head" when there are two, instead of hiding it.
    command.upgrade(config, revision)
    if revision == "head":
        study.set_up(engine)


def _move_legacy_version_table(engine: Engine, config: Config) -> None:
    """Move traindeck's revision from `alembic_version` to its own table, once. Only a row
    naming one of traindeck's revisions moves: Optuna's revision stays where Optuna keeps it."""
    ours = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
    with engine.begin() as connection:
        tables = inspect(connection)
        if tables.has_table(VERSION_TABLE) or not tables.has_table(LEGACY_VERSION_TABLE):
            return
        rows = connection.execute(text(f"SELECT version_num FROM {LEGACY_VERSION_TABLE}"))
        revisions = list(rows.scalars())
        if not revisions or not set(revisions) <= ours:
            return
        connection.execute(
            text(f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) PRIMARY KEY)")
        )
        for revision in revisions:
            connection.execute(
                text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES (:revision)"),
                {"revision": revision},
            )
        connection.execute(text(f"DROP TABLE {LEGACY_VERSION_TABLE}"))


def downgrade(engine: Engine, revision: str) -> None:
    command.downgrade(alembic_config(engine), revision)


def is_migrated(engine: Engine) -> bool:
    """Whether the schema exists at all (a quick check before a friendlier error message)."""
    return inspect(engine).has_table("jobs")

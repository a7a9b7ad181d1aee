"""The migration history: one head, an empty database reaches it, and a database left at any
earlier revision upgrades to it keeping its rows. Runs on SQLite and on the real Postgres.

Optuna's study storage (db.study) lives in the same database: no table is shared, each
Alembic keeps its revision in its own table, and `upgrade` is the one command that sets both
up, on a new database and on one made before sweeps existed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from optuna.storages import RDBStorage
from sqlalchemy import Engine, inspect, text

from db import study
from db.engine import create_db_engine
from db.migrate import LEGACY_VERSION_TABLE, VERSION_TABLE, alembic_config, upgrade
from db.models import Base
from tests.conftest import BACKENDS, _admin_engine, _postgres_url

SCRIPTS = ScriptDirectory.from_config(alembic_config(None))
HEAD = SCRIPTS.get_current_head()
EARLIER = [[rev.revision] for rev in SCRIPTS.walk_revisions() if rev.revision != HEAD]
# Databases made before the merge revision stand at both branch tips at once.
EARLIER.append(["0002_dashboard", "0005_results"])


@pytest.fixture(params=BACKENDS)
def empty_engine(request: pytest.FixtureRequest, data_dir) -> Iterator[Engine]:
    if request.param == "sqlite":
        engine = create_db_engine(f"sqlite:///{data_dir / 'empty.db'}")
        yield engine
        engine.dispose()
        return
    request.getfixturevalue("postgres_template")  # skips when Postgres is absent
    name = f"traindeck_migrate_{uuid.uuid4().hex[:12]}"
    admin = _admin_engine()
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    engine = create_db_engine(_postgres_url(name))
    yield engine
    engine.dispose()
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _context(connection) -> MigrationContext:
    """traindeck's migration context: its own version table, its own tables (not Optuna's)."""
    ours = Base.metadata.tables
    return MigrationContext.configure(
        connection,
        opts={
            "version_table": VERSION_TABLE,
            "include_name": lambda name, kind, _parent: kind != "table" or name in ours,
        },
    )


def _revision(engine: Engine) -> set[str]:
    with engine.connect() as connection:
        return set(_context(connection).get_current_heads())


def test_the_history_has_one_head():
    assert len(SCRIPTS.get_heads()) == 1, f"two heads: {SCRIPTS.get_heads()}; add a merge revision"


def test_an_empty_database_upgrades_to_the_head_and_matches_the_models(empty_engine):
    upgrade(empty_engine)
    assert _revision(empty_engine) == {HEAD}
    with empty_engine.connect() as connection:
        differences = compare_metadata(_context(connection), Base.metadata)
    assert differences == [], "the models and the migrations disagree"


@pytest.mark.parametrize("revisions", EARLIER, ids="+".join)
def test_a_database_at_an_earlier_revision_upgrades_keeping_its_rows(empty_engine, revisions):
    for revision in revisions:
        upgrade(empty_engine, revision)
    assert _revision(empty_engine) == set(revisions)
    now = datetime.now(UTC).replace(tzinfo=None)
    with empty_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO jobs (name, spec, status, priority, attempts, lease, max_attempts,"
                " cancel_requested, created_at, epoch, step, total_epochs, total_steps)"
                " VALUES ('kept', '{}', 'succeeded', 0, 1, 1, 3, false, :now, 1, 30, 1, 30)"
            ),
            {"now": now},
        )
        job_id = connection.execute(text("SELECT id FROM jobs")).scalar_one()
        connection.execute(
            text(
                "INSERT INTO metrics (job_id, name, step, value, wall_time)"
                " VALUES (:job, 'batch/train_loss', 0, 1.5, 0)"
            ),
            {"job": job_id},
        )
    upgrade(empty_engine)
    assert _revision(empty_engine) == {HEAD}
    with empty_engine.connect() as connection:
        assert connection.execute(text("SELECT name FROM jobs")).scalars().all() == ["kept"]
        assert connection.execute(text("SELECT value FROM metrics")).scalars().all() == [1.5]


# --- Optuna's tables beside ours --------------------------------------------------------
def _optuna_revision(engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _optuna_accepts(engine) -> None:
    """Optuna's own compatibility check passes on the database (it raises otherwise)."""
    storage = RDBStorage(engine.url.render_as_string(hide_password=False))
    assert storage.get_current_version() == storage.get_head_version()
    storage.engine.dispose()


def test_no_table_is_both_traindecks_and_optunas():
    ours = set(Base.metadata.tables) | {VERSION_TABLE}
    optunas = study.table_names() | {LEGACY_VERSION_TABLE}
    assert ours & optunas == set()


def test_upgrade_sets_up_both_histories_on_an_empty_database(empty_engine):
    upgrade(empty_engine)
    upgrade(empty_engine)  # a second time changes nothing
    assert _revision(empty_engine) == {HEAD}
    tables = set(inspect(empty_engine).get_table_names())
    assert study.table_names() <= tables
    assert _optuna_revision(empty_engine) not in (None, HEAD)
    _optuna_accepts(empty_engine)


def test_a_database_from_before_sweeps_moves_its_revision_and_gains_optunas_tables(
    empty_engine,
):
    upgrade(empty_engine, "0010_api_tokens")
    with empty_engine.begin() as connection:  # as such a database was: the default table
        connection.execute(text(f"ALTER TABLE {VERSION_TABLE} RENAME TO {LEGACY_VERSION_TABLE}"))
    upgrade(empty_engine)
    assert _revision(empty_engine) == {HEAD}
    _optuna_accepts(empty_engine)
    with empty_engine.connect() as connection:
        legacy = connection.execute(text(f"SELECT version_num FROM {LEGACY_VERSION_TABLE}"))
        assert HEAD not in set(legacy.scalars()), "only Optuna's revision is left there"

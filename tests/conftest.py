"""Fixtures shared by every room's tests: a fresh, migrated database per test.

`engine` runs each test twice: on a SQLite file and on a new database of the real
PostgreSQL server (127.0.0.1:5432, user postgres). Postgres databases are copied from a
migrated template, which takes a fraction of running the migrations each time.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from datasets.register import register_folder
from db.engine import create_db_engine, dispose_engines
from db.migrate import upgrade
from tests.support.workers import digits_subset

POSTGRES_ADMIN_URL = os.environ.get(
    "TRAINDECK_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
BACKENDS = ("sqlite", "postgres")
# Tests that stop, kill and resume jobs expect a checkpoint after every epoch (the default
# writes at most once a minute); workers started by tests inherit this.
os.environ.setdefault("TRAINDECK_CHECKPOINT_INTERVAL", "0")


def _postgres_url(database: str) -> str:
    return POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + "/" + database


def _admin_engine() -> Engine:
    # pool_pre_ping: a fault test restarts the server, which kills pooled connections.
    return create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """A migrated template database, made once per test session."""
    name = f"traindeck_template_{os.getpid()}"
    try:
        admin = _admin_engine()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL}: {exc}")
    template_engine = create_db_engine(_postgres_url(name))
    upgrade(template_engine)
    template_engine.dispose()
    yield name
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private TRAINDECK_DATA for the test."""
    path = tmp_path / "data"
    path.mkdir()
    monkeypatch.setenv("TRAINDECK_DATA", str(path))
    return path


@pytest.fixture(params=BACKENDS)
def database_url(
    request: pytest.FixtureRequest, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The URL of a fresh, migrated database (also exported as DATABASE_URL)."""
    if request.param == "sqlite":
        url = f"sqlite:///{data_dir / 'traindeck.db'}"
        engine = create_db_engine(url)
        upgrade(engine)
        engine.dispose()
        monkeypatch.setenv("DATABASE_URL", url)
        yield url
        dispose_engines()
        return
    template = request.getfixturevalue("postgres_template")
    name = f"traindeck_test_{uuid.uuid4().hex[:12]}"
    admin = _admin_engine()
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    url = _postgres_url(name)
    monkeypatch.setenv("DATABASE_URL", url)
    yield url
    dispose_engines()
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_db_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_engine(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """A fresh migrated SQLite database only, for tests that do not care about the backend."""
    url = f"sqlite:///{data_dir / 'traindeck.db'}"
    monkeypatch.setenv("DATABASE_URL", url)
    engine = create_db_engine(url)
    upgrade(engine)
    yield engine
    engine.dispose()
    dispose_engines()


@pytest.fixture
def small_digits(sqlite_engine: Engine, data_dir: Path) -> Callable[..., str]:
    """Register a subset of the digits as a dataset; returns its name."""

    def make(per_class: int = 40, classes: int = 10, name: str = "digits-small") -> str:
        register_folder(sqlite_engine, name, digits_subset(data_dir, per_class, classes))
        return name

    return make


@pytest.fixture
def gcs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """A Cloud Storage emulator with an empty bucket `traindeck-test`, and TRAINDECK_STORE on it."""
    from tests.support.gcs import GcsEmulator

    emulator = GcsEmulator(tmp_path_factory.mktemp("gcs") / "objects").start()
    try:
        emulator.create_bucket("traindeck-test")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
        monkeypatch.setenv("TRAINDECK_STORE", "gs://traindeck-test/td")
        import fsspec

        fsspec.filesystem("gs").clear_instance_cache()
        yield emulator
    finally:
        emulator.stop()

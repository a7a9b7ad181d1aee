"""The one engine factory, and the transaction helpers every query in `db/` goes through.

SQLite: WAL mode (readers never block the writer), a busy timeout, and write transactions
opened with `BEGIN IMMEDIATE`. A deferred transaction that reads and then writes cannot wait
for the lock it needs to upgrade to and fails at once with "database is locked"; an immediate
one takes the write lock up front and so waits out the busy timeout instead. Read-only
transactions (`read_tx`) stay deferred so that the dashboard never queues behind a worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.exc import SQLAlchemyError as DatabaseError

from common import config
from common.errors import first_line, mask_passwords
from common.settings import SettingsError

# Other rooms name these through `db.engine`: only `db/` imports SQLAlchemy (.importlinter).
__all__ = [
    "DatabaseError",
    "Engine",
    "OperationalError",
    "ProgrammingError",
    "mask_passwords",
    "printable_url",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

_READ_ONLY = "traindeck_read_only"

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


class DatabaseUrlError(SettingsError):
    """DATABASE_URL names a database traindeck cannot use: a SettingsError (so a ValueError),
    which every command ends with as one line and exit code 2."""


def printable_url(url: str) -> str:
    """A database URL fit to show a person: the password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return mask_passwords(url)


def normalize_url(url: str) -> str:
    """Accept `postgres://` and `postgresql://` and use the psycopg 3 driver for them."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def is_sqlite(engine: Engine | Connection) -> bool:
    return engine.dialect.name == "sqlite"


def create_db_engine(url: str | None = None) -> Engine:
    """A new engine for `url` (default: `DATABASE_URL` or the SQLite file in the data folder)."""
    url = normalize_url(url or config.database_url())
    try:
        parsed = make_url(url)
    except Exception:
        # Neither the URL nor the parser's complaint (which quotes a piece of it) is shown
        # as it is: either can hold the password.
        raise DatabaseUrlError(
            f"DATABASE_URL is not a database URL: {mask_passwords(url)!r}"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url, parsed.database)
    if backend == "postgresql":
        return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)
    raise DatabaseUrlError(f"DATABASE_URL must be sqlite:/// or postgresql://, got {backend!r}")


def get_engine(url: str | None = None) -> Engine:
    """The process-wide engine for `url`, created on first use."""
    url = normalize_url(url or config.database_url())
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = create_db_engine(url)
        return engine


def dispose_engines() -> None:
    """Close every cached engine (tests, and a child process after fork)."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def _sqlite_engine(url: str, database: str | None) -> Engine:
    if database and database != ":memory:" and not database.startswith("file:"):
        folder = Path(database).expanduser().resolve().parent
        if folder == config.data_dir():
            config.ensure_data_dir()
        else:
            config.ensure_folder(folder, "database folder", "DATABASE_URL")
    busy_timeout_ms = int(config.sqlite_busy_timeout_s() * 1000)
    engine = create_engine(url, connect_args={"timeout": busy_timeout_ms / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        # Let SQLAlchemy's "begin" event below, not the sqlite3 module, open transactions.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        if connection.get_execution_options().get(_READ_ONLY):
            connection.exec_driver_sql("BEGIN")
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


@contextmanager
def write_tx(engine: Engine) -> Iterator[Connection]:
    """A transaction that may write: committed on success, rolled back on error."""
    with engine.begin() as connection:
        yield connection


@contextmanager
def read_tx(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction (deferred on SQLite, so it never waits for a writer)."""
    with engine.connect() as connection:
        connection = connection.execution_options(**{_READ_ONLY: True})
        with connection.begin():
            yield connection


# Words in the driver's message when the database is busy or away for a while (SQLite locked
# past its busy timeout, a Postgres server restarting), not wrong.
_UNAVAILABLE_MESSAGES = (
    "database is locked",
    "database is busy",
    "connection",
    "server closed",
    "the database system is",
)


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database is busy or unreachable, worth another try later."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, InterfaceError):
        return True
    if isinstance(exc, OperationalError):
        message = str(exc.orig or exc).lower()
        return any(words in message for words in _UNAVAILABLE_MESSAGES)
    return False


def database_problem(exc: BaseException) -> str:
    """What a command tells a person whose database could not be used.

    "database unavailable" only when it is (`is_unavailable`: busy, unreachable, restarting);
    any other error of the database (a statement it refused, say) says so instead, so that
    nobody goes looking for an outage that is not there.
    """
    text = first_line(exc)
    if "no such table" in text or ("does not exist" in text and "relation" in text):
        return "the database has no traindeck tables yet; run `python -m db upgrade`"
    if is_unavailable(exc):
        return f"database unavailable: {text}"
    return f"database error: {text}"


def retry_with_backoff(
    action: Callable[[], T],
    what: str,
    *,
    retryable: Callable[[BaseException], bool],
    give_up: Callable[[], bool],
    max_backoff_s: float,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> T:
    """`action()`, tried again after 0.5 s, 1 s, 2 s … (at most `max_backoff_s`) while its
    error is `retryable`. Any other error is raised at once, and so is a retryable one once
    `give_up()` says so (a stop request). `on_retry(error, delay)` hears of each retry."""
    delay = 0.5
    while True:
        try:
            return action()
        except Exception as exc:
            if not retryable(exc) or give_up():
                raise
            log.warning("could not %s, retrying in %.1f s: %s", what, delay, first_line(exc))
            if on_retry is not None:
                on_retry(exc, delay)
            time.sleep(delay)
            delay = min(max_backoff_s, delay * 2)


def retry_while_unavailable(
    action: Callable[[], T],
    what: str,
    *,
    give_up: Callable[[], bool] = lambda: False,
    max_backoff_s: float = 10.0,
) -> T:
    """`action()`, tried again with backoff while the database is busy or unreachable."""
    return retry_with_backoff(
        action, what, retryable=is_unavailable, give_up=give_up, max_backoff_s=max_backoff_s
    )

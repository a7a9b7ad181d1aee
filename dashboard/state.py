"""What every page shares: the database engine, and the checks that the settings, the
database and the store are usable.

Other pages get the engine with `from dashboard.state import get_engine`.
"""

from __future__ import annotations

from typing import NoReturn

import streamlit as st

from common import config, store
from common.errors import first_line
from common.settings import SettingsError, settings
from dashboard.format import plain
from db.engine import DatabaseError, Engine, printable_url
from db.engine import get_engine as db_get_engine
from db.migrate import is_migrated


@st.cache_resource(show_spinner=False)
def _engine_for(url: str) -> Engine:
    return db_get_engine(url)


def get_engine() -> Engine:
    """The process-wide engine for `DATABASE_URL` (or the SQLite file in the data folder)."""
    return _engine_for(config.database_url())


def _stop_for_setting(exc: SettingsError) -> NoReturn:
    st.error("traindeck cannot use a setting in its environment:", icon=":material/error:")
    st.code(str(exc), language=None, wrap_lines=True)  # a value is text, not Markdown
    st.stop()


def require_settings() -> None:
    """Stop the page with the one-line message when a setting in the environment cannot be
    used (`common.settings`)."""
    try:
        settings()
    except SettingsError as exc:
        _stop_for_setting(exc)


def require_database() -> Engine:
    """The engine, or a clear message and a stopped page when a setting, the database or the
    data folder cannot be used."""
    try:
        url = config.database_url()
        config.ensure_data_dir()  # uploads, checkpoints and exports are read and written there
        engine = get_engine()
        migrated = is_migrated(engine)
    except SettingsError as exc:  # DatabaseUrlError among them
        _stop_for_setting(exc)
    except config.DataFolderError as exc:
        st.error("traindeck cannot use its data folder:", icon=":material/error:")
        st.code(str(exc), language=None, wrap_lines=True)  # a path is text, not Markdown
        st.stop()
    except DatabaseError as exc:
        reason = first_line(exc)
        st.error(f"Cannot reach the database at {plain(printable_url(url))}: {plain(reason)}")
        st.stop()
    require_store()
    if not migrated:
        st.error(
            f"The database at {plain(printable_url(url))} has no tables yet. "
            "Create them with `python -m db upgrade`, then reload this page."
        )
        st.stop()
    return engine


@st.cache_resource(ttl=600, show_spinner=False)
def _store_reachable(url: str) -> bool:
    store.check_reachable()  # a StoreError is not cached: the next page load checks again
    return True


def require_store() -> None:
    """Stop the page with one line when the store (a bucket) is missing or refused."""
    try:
        _store_reachable(store.store_url())
    except store.StoreError as exc:
        st.error("traindeck cannot use its store:", icon=":material/error:")
        st.code(str(exc), language=None, wrap_lines=True)  # a URL is text, not Markdown
        st.stop()

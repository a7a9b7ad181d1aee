"""Configuration read from the environment, with the defaults the README documents."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0
DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
DEFAULT_SQLITE_BUSY_TIMEOUT_S = 30.0


def data_dir() -> Path:
    """The folder holding the SQLite file, datasets, checkpoints and exports (`TRAINDECK_DATA`)."""
    return Path(os.environ.get("TRAINDECK_DATA", "data")).expanduser().resolve()


class DataFolderError(OSError):
    """A folder traindeck must write to cannot be created or written; the message names it,
    the setting that chose it, and why."""


def ensure_folder(path: Path, what: str, setting: str) -> Path:
    """`path`, created if missing, or a DataFolderError when it cannot be created or written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise DataFolderError(f"cannot create the {what} {path} ({setting}): {reason}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise DataFolderError(f"cannot write to the {what} {path} ({setting}): Permission denied")
    return path


def ensure_data_dir() -> Path:
    """The data folder, created if missing, or a DataFolderError saying why it cannot be."""
    return ensure_folder(data_dir(), "data folder", "TRAINDECK_DATA")


def database_url() -> str:
    """`DATABASE_URL`, or a SQLite file under the data folder."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        return url
    return f"sqlite:///{data_dir() / 'traindeck.db'}"


def _positive_float_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be greater than 0, got {raw!r}")
    return value


def heartbeat_timeout_s() -> float:
    """Seconds without a heartbeat after which a running job counts as abandoned."""
    return _positive_float_env("TRAINDECK_HEARTBEAT_TIMEOUT", DEFAULT_HEARTBEAT_TIMEOUT_S)


def heartbeat_interval_s() -> float:
    """Seconds between two heartbeats of a worker."""
    return _positive_float_env("TRAINDECK_HEARTBEAT_INTERVAL", DEFAULT_HEARTBEAT_INTERVAL_S)


def sqlite_busy_timeout_s() -> float:
    """How long a SQLite write waits for another writer's lock before it fails."""
    return _positive_float_env("TRAINDECK_SQLITE_BUSY_TIMEOUT", DEFAULT_SQLITE_BUSY_TIMEOUT_S)

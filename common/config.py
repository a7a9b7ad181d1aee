"""The settings most code needs, as functions: thin reads of `common.settings.settings()`,
which checks every environment variable at once (a bad one is a one-line SettingsError)."""

from __future__ import annotations

import os
from pathlib import Path

from common.settings import Settings, settings

DEFAULT_HEARTBEAT_TIMEOUT_S: float = Settings.model_fields["heartbeat_timeout_s"].default
DEFAULT_HEARTBEAT_INTERVAL_S: float = Settings.model_fields["heartbeat_interval_s"].default
DEFAULT_SQLITE_BUSY_TIMEOUT_S: float = Settings.model_fields["sqlite_busy_timeout_s"].default


def data_dir() -> Path:
    """The folder holding the SQLite file, datasets, checkpoints and exports (`TRAINDECK_DATA`),
    resolved against the current folder."""
    return settings().data.expanduser().resolve()


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
    url = settings().database_url
    if url is not None:
        return url.get_secret_value()
    return f"sqlite:///{data_dir() / 'traindeck.db'}"


def heartbeat_timeout_s() -> float:
    """Seconds without a heartbeat after which a running job counts as abandoned."""
    return settings().heartbeat_timeout_s


def heartbeat_interval_s() -> float:
    """Seconds between two heartbeats of a worker."""
    return settings().heartbeat_interval_s


def sqlite_busy_timeout_s() -> float:
    """How long a SQLite write waits for another writer's lock before it fails."""
    return settings().sqlite_busy_timeout_s


def alert_retention_days() -> float:
    """Days a sent or abandoned alert stays in the outbox before a drainer deletes it."""
    return settings().alert_retention_days


def loader_workers() -> int | None:
    """DataLoader worker processes a job uses when the worker's setting says; else None."""
    return settings().loader_workers


def checkpoint_interval_s() -> float:
    """Seconds between two checkpoint writes of a job (its spec may say otherwise)."""
    return settings().checkpoint_interval_s


def jobs_per_process() -> int:
    """How many jobs with the same graphs one XLA job process may serve in turn."""
    return settings().jobs_per_process


def xla_read_every() -> int:
    """Training steps between two reads of the loss from an XLA device."""
    return settings().xla_read_every


def system_metrics_interval_s() -> float:
    """Seconds between two samples of a running job's system metrics (0: none are taken)."""
    return settings().system_metrics_interval_s


def tpu_metrics_address() -> str:
    """HOST:PORT of libtpu's runtime metrics service (gRPC) on a TPU VM."""
    return settings().tpu_metrics_address


def gang_start_timeout_s() -> float:
    """How long an attempt of a multi-host job waits for every host at the start barrier."""
    return settings().gang_start_timeout_s


def progress_timeout_s() -> float:
    """How long a host's job process of a multi-host job may train no step before the attempt
    is given up (a hung process still has a beating worker)."""
    return settings().progress_timeout_s

"""Every setting traindeck reads from the environment, checked in one place.

`settings()` reads the environment each time it is called (it keeps the result only while the
variables stay the same) and checks every variable at once, so a mistake in any of them stops
any command, not just the one that happens to read it. A variable that is empty or blank counts
as unset. A value that cannot be used is a `SettingsError` (a ValueError) whose message is one
line naming the variable, showing its value (a secret only with its password masked) and
saying what it accepts:

    TRAINDECK_SESSION_HOURS='abc' is not valid: a number of hours greater than 0 (...)

Commands end with that line and exit code 2 (`common.entry.run_main`); the dashboard shows it
and stops. The README's Configuration table lists these variables.

Read where they are used, not here, because they are not traindeck's settings: PJRT_DEVICE,
CPU_NUM_DEVICES, TPU_ACCELERATOR_TYPE, TPU_WORKER_ID and TPU_WORKER_HOSTNAMES (torch_xla's and
the TPU VM's own; the last two are checked by worker.tpu_slice), GCE_METADATA_HOST
(google-auth's), STREAMLIT_* (Streamlit's), TRAINDECK_FAILPOINTS (set by tests only), and the
environment handed on to child processes; and Google's own (GOOGLE_CLOUD_PROJECT,
GOOGLE_APPLICATION_CREDENTIALS, CLOUDSDK_CONFIG), which google-auth reads.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from common.errors import mask_passwords

SECONDS = "a number of seconds greater than 0 (at most 86400, a day)"
MAX_SECONDS = 86_400.0
MAX_SESSION_HOURS = 8_760.0
DATABASE_URL_FORMS = "sqlite:///PATH or postgresql://USER[:PASSWORD]@HOST[:PORT]/DB"
_DATABASE_URL = re.compile(r"^(?:sqlite(?:\+\w+)?|postgres|postgresql(?:\+\w+)?)://")
_EMAIL_OR_DOMAIN = re.compile(r"^[^@\s]*@[^@\s]+$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_.])?$")
MEGABYTES = "a whole number of megabytes, at least 1"
MEGAPIXELS = "a whole number of megapixels, at least 1"
STORE_URL_FORMS = "gs://BUCKET or gs://BUCKET/PREFIX (unset: a folder under the data folder)"
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class SettingsError(ValueError):
    """An environment variable holds a value traindeck cannot use; the message is one line
    naming it and what it accepts."""


def _setting(default: Any, variable: str, accepts: str, **constraints: Any) -> Any:
    """A field read from `variable`; `accepts` is what the error says a good value is."""
    return Field(default, validation_alias=variable, description=accepts, **constraints)


class Settings(BaseSettings):
    """traindeck's settings, one field per environment variable (the alias is its name)."""

    model_config = SettingsConfigDict(
        case_sensitive=True, env_ignore_empty=True, frozen=True, extra="ignore"
    )

    # Where things are kept.
    data: Path = _setting(Path("data"), "TRAINDECK_DATA", "a folder path")
    database_url: SecretStr | None = _setting(
        None, "DATABASE_URL", f"a database URL, {DATABASE_URL_FORMS}"
    )
    sqlite_busy_timeout_s: float = _setting(
        30.0, "TRAINDECK_SQLITE_BUSY_TIMEOUT", SECONDS, gt=0, le=MAX_SECONDS, allow_inf_nan=False
    )
    dataset_roots: Annotated[tuple[Path, ...], NoDecode] = _setting(
        (), "TRAINDECK_DATASET_ROOTS", f"folder paths separated by {os.pathsep!r}"
    )
    upload_max_files: int = _setting(
        5_000, "TRAINDECK_UPLOAD_MAX_FILES", "a whole number of files, at least 1", ge=1
    )
    upload_max_mb: int = _setting(
        500, "TRAINDECK_UPLOAD_MAX_MB", "a whole number of megabytes, at least 1", ge=1
    )

    # URL datasets: where the worker may download from, and how much (datasets.download).
    url_allow: Annotated[tuple[str, ...], NoDecode] = _setting(
        (),
        "TRAINDECK_URL_ALLOW",
        "host names, IP addresses and networks (10.0.0.0/8) of internal mirrors, separated by "
        "commas or spaces",
    )
    url_max_mb: int = _setting(2_000, "TRAINDECK_URL_MAX_MB", MEGABYTES, ge=1)
    url_max_unpacked_mb: int = _setting(2_000, "TRAINDECK_URL_MAX_UNPACKED_MB", MEGABYTES, ge=1)
    url_max_files: int = _setting(
        50_000, "TRAINDECK_URL_MAX_FILES", "a whole number of files, at least 1", ge=1
    )

    # Checking a dataset's images (datasets.image_checks): the pixels of one image, and the
    # pixels decoded to check one dataset.
    image_max_megapixels: int = _setting(50, "TRAINDECK_IMAGE_MAX_MEGAPIXELS", MEGAPIXELS, ge=1)
    check_max_megapixels: int = _setting(5_000, "TRAINDECK_CHECK_MAX_MEGAPIXELS", MEGAPIXELS, ge=1)

    # The store: where the files that cross machines live (common.store).
    store: str | None = _setting(None, "TRAINDECK_STORE", f"a store URL, {STORE_URL_FORMS}")
    checkpoints_kept: int = _setting(
        2, "TRAINDECK_CHECKPOINTS_KEPT", "a whole number of checkpoints, at least 1", ge=1
    )
    keep_checkpoints: bool = _setting(False, "TRAINDECK_KEEP_CHECKPOINTS", "true or false")
    dataset_cache_gb: float = _setting(
        50.0,
        "TRAINDECK_DATASET_CACHE_GB",
        "a number of gigabytes greater than 0",
        gt=0,
        allow_inf_nan=False,
    )

    # The worker.
    heartbeat_interval_s: float = _setting(
        5.0, "TRAINDECK_HEARTBEAT_INTERVAL", SECONDS, gt=0, le=MAX_SECONDS, allow_inf_nan=False
    )
    heartbeat_timeout_s: float = _setting(
        60.0, "TRAINDECK_HEARTBEAT_TIMEOUT", SECONDS, gt=0, le=MAX_SECONDS, allow_inf_nan=False
    )
    checkpoint_interval_s: float = _setting(
        60.0,
        "TRAINDECK_CHECKPOINT_INTERVAL",
        "a number of seconds, 0 (every epoch) or more (at most 86400, a day)",
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
    )
    # DataLoader worker processes of a job; unset: none under 5,000 images, else one per spare
    # CPU core (worker.data.loader_workers).
    loader_workers: int | None = _setting(
        None,
        "TRAINDECK_LOADER_WORKERS",
        "a whole number of DataLoader worker processes, 0 to 64",
        ge=0,
        le=64,
    )
    # A worker on a host of a multi-host TPU pod slice (worker.tpu_slice): the slice's name
    # (else the TPU's name in the metadata, else host 0's name in TPU_WORKER_HOSTNAMES); how
    # long an attempt waits for every host's job process at the start barrier; how long a
    # host's job process may train no step before the whole attempt is requeued (a hung host
    # still beats).
    slice_name: str | None = _setting(
        None,
        "TRAINDECK_SLICE",
        "a name for this machine's TPU slice, the same on each of its hosts (at most 200 "
        "printable characters)",
        pattern=r"^[^\x00-\x1f\x7f]{1,200}$",
    )
    gang_start_timeout_s: float = _setting(
        600.0, "TRAINDECK_GANG_START_TIMEOUT", SECONDS, gt=0, le=MAX_SECONDS, allow_inf_nan=False
    )
    progress_timeout_s: float = _setting(
        900.0, "TRAINDECK_PROGRESS_TIMEOUT", SECONDS, gt=0, le=MAX_SECONDS, allow_inf_nan=False
    )
    # On XLA a job process whose job succeeded may serve the next job with the same graphs,
    # so XLA's in-memory cache spares it the compiles (worker.job_channel); 1: never.
    jobs_per_process: int = _setting(
        10,
        "TRAINDECK_JOBS_PER_PROCESS",
        "a whole number of jobs, at least 1 (at most 1000)",
        ge=1,
        le=1_000,
    )
    # On XLA the training loss stays on the device and is read in chunks (worker.device_values).
    xla_read_every: int = _setting(
        10,
        "TRAINDECK_XLA_READ_EVERY",
        "a whole number of training steps, at least 1 (at most 10000)",
        ge=1,
        le=10_000,
    )
    # A running job's system metrics (worker.system_metrics): seconds between two samples, and
    # where libtpu's runtime metrics service answers on a TPU VM.
    system_metrics_interval_s: float = _setting(
        5.0,
        "TRAINDECK_SYSTEM_METRICS_INTERVAL",
        "a number of seconds, 0 (off) or from 1 to 86400",
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
    )
    tpu_metrics_address: str = _setting(
        "localhost:8431",
        "TRAINDECK_TPU_METRICS_ADDRESS",
        "HOST:PORT, e.g. localhost:8431",
        pattern=r"^\S+:[0-9]{1,5}$",
    )

    # Cloud TPU VMs (cloud.tpu, cloud.watch and the TPU VMs page).
    tpu_api_endpoint: str | None = _setting(
        None,
        "TRAINDECK_TPU_API_ENDPOINT",
        "an address like https://tpu.googleapis.com or http://127.0.0.1:8080",
    )
    tpu_credentials: str | None = _setting(
        None,
        "TRAINDECK_TPU_CREDENTIALS",
        "the path of a service-account key file, or 'anonymous' (a local API endpoint only)",
    )
    tpu_project: str | None = _setting(None, "TRAINDECK_TPU_PROJECT", "a Google Cloud project ID")
    tpu_zone: str | None = _setting(None, "TRAINDECK_TPU_ZONE", "a zone, e.g. us-central2-b")
    source_url: str | None = _setting(
        None, "TRAINDECK_SOURCE_URL", "the git or .tar.gz URL new TPU VMs fetch traindeck from"
    )
    worker_database_url: SecretStr | None = _setting(
        None, "TRAINDECK_WORKER_DATABASE_URL", f"a database URL, {DATABASE_URL_FORMS}"
    )

    # Alerts (alerts.drain): how long a sent or abandoned alert stays in the outbox.
    alert_retention_days: float = _setting(
        30.0,
        "TRAINDECK_ALERT_RETENTION_DAYS",
        "a number of days greater than 0 (at most 3650)",
        gt=0,
        le=3650,
        allow_inf_nan=False,
    )

    # The dashboard.
    port: int = _setting(8501, "TRAINDECK_PORT", "a port number from 1 to 65535", ge=1, le=65535)
    address: str = _setting(
        "127.0.0.1",
        "TRAINDECK_ADDRESS",
        "a host name or IP address to listen on, without spaces",
        pattern=r"^\S+$",
    )
    auth: Literal["auto", "required"] = _setting("auto", "TRAINDECK_AUTH", "'auto' or 'required'")
    # Its format is checked by dashboard.auth (a malformed hash means nobody can sign in).
    password_hash: SecretStr | None = _setting(
        None, "TRAINDECK_PASSWORD_HASH", "the hash `python -m dashboard.auth hash` prints"
    )
    session_hours: float = _setting(
        12.0,
        "TRAINDECK_SESSION_HOURS",
        "a number of hours greater than 0 (at most 8760, a year)",
        gt=0,
        le=MAX_SESSION_HOURS,
        allow_inf_nan=False,
    )
    allowed_users: Annotated[frozenset[str], NoDecode] = _setting(
        frozenset(),
        "TRAINDECK_ALLOWED_USERS",
        "e-mail addresses and @domains, separated by commas or spaces",
    )
    # Where people open the dashboard (behind a reverse proxy, its address there): its host
    # name is answered in the open loopback mode too, and https makes the cookies Secure.
    public_url: str | None = _setting(
        None,
        "TRAINDECK_PUBLIC_URL",
        "the http:// or https:// address people open the dashboard at, e.g. "
        "https://traindeck.example.com",
    )
    # Reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed; nobody else's.
    trusted_proxies: Annotated[tuple[IPNetwork, ...], NoDecode] = _setting(
        (),
        "TRAINDECK_TRUSTED_PROXIES",
        "IP addresses or networks (10.0.0.0/8) of reverse proxies, separated by commas or spaces",
    )

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        stripped = {
            key: value.strip() if isinstance(value, str) else value for key, value in data.items()
        }
        return {key: value for key, value in stripped.items() if value != ""}

    @field_validator("system_metrics_interval_s")
    @classmethod
    def _whole_seconds_apart(cls, value: float) -> float:
        # Samples are stored at whole seconds (worker.system_metrics): closer ones would clash.
        if 0 < value < 1:
            raise ValueError("under 1 second")
        return value

    @field_validator("auth", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("dataset_roots", mode="before")
    @classmethod
    def _split_paths(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(entry.strip() for entry in value.split(os.pathsep) if entry.strip())
        return value

    @field_validator("url_allow", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        entries = tuple(dict.fromkeys(value.replace(",", " ").split()))
        for entry in entries:
            try:
                ipaddress.ip_network(entry.strip("[]"), strict=False)
            except ValueError:
                if not _HOST_NAME.match(entry):
                    raise ValueError("not host names, addresses or networks") from None
        return entries

    @field_validator("allowed_users", mode="before")
    @classmethod
    def _split_users(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        entries = {entry.lower() for entry in value.replace(",", " ").split()}
        if not all(_EMAIL_OR_DOMAIN.match(entry) for entry in entries):
            # An entry without an @ would match nobody, silently.
            raise ValueError("not e-mail addresses and @domains")
        return frozenset(entries)

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            host = parts.hostname
            parts.port  # noqa: B018 (a port that is no number raises here)
        except ValueError:
            raise ValueError("not an http(s) address") from None
        if parts.scheme.lower() not in ("http", "https") or not host or parts.username:
            raise ValueError("not an http(s) address")
        return value

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _split_networks(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return tuple(
                ipaddress.ip_network(entry, strict=False)
                for entry in value.replace(",", " ").split()
            )
        except ValueError:
            raise ValueError("not IP addresses or networks") from None

    @property
    def public_host(self) -> str | None:
        """The host name in TRAINDECK_PUBLIC_URL, lower case; None when it is unset."""
        if self.public_url is None:
            return None
        return (urlsplit(self.public_url).hostname or "").lower().rstrip(".") or None

    @property
    def public_https(self) -> bool:
        """Whether people reach the dashboard over https (TRAINDECK_PUBLIC_URL says so)."""
        return self.public_url is not None and urlsplit(self.public_url).scheme.lower() == "https"

    @field_validator("store")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not is_bucket_url(value):
            raise ValueError("not a store URL")
        return value.rstrip("/")

    @field_validator("tpu_api_endpoint")
    @classmethod
    def _api_endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        raw = value.rstrip("/")
        try:
            parts = urlsplit(raw if "://" in raw else f"https://{raw}")
            parts.port  # noqa: B018 (a port that is no number raises here)
        except ValueError:
            raise ValueError("not an address") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path:
            raise ValueError("not an address")
        return f"{parts.scheme}://{parts.netloc}"

    @field_validator("database_url", "worker_database_url")
    @classmethod
    def _database_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        # The rest is parsed by db.engine, whose DatabaseUrlError is a SettingsError too.
        if not _DATABASE_URL.match(value.get_secret_value()):
            raise ValueError("not a database URL")
        return value


def is_bucket_url(text: str) -> bool:
    """Whether `text` names a bucket the store can use: gs://BUCKET[/PREFIX], nothing more."""
    parsed = urlsplit(text)
    return parsed.scheme == "gs" and bool(parsed.netloc) and not (parsed.query or parsed.fragment)


VARIABLES: dict[str, str] = {
    str(field.validation_alias): name for name, field in Settings.model_fields.items()
}
# Shown with a URL's password masked (TRAINDECK_PUBLIC_URL refuses one, but may be given one).
SECRETS = frozenset(
    {
        "DATABASE_URL",
        "TRAINDECK_WORKER_DATABASE_URL",
        "TRAINDECK_PASSWORD_HASH",
        "TRAINDECK_PUBLIC_URL",
    }
)


def shown_value(variable: str, value: str) -> str:
    """How an error shows `value`: quoted, a URL's password masked, a password hash never."""
    if variable == "TRAINDECK_PASSWORD_HASH":
        return "(hidden)"
    if variable in SECRETS:
        return repr(mask_passwords(value))
    return repr(value)


def accepts(variable: str) -> str:
    """What `variable` accepts, in words."""
    return Settings.model_fields[VARIABLES[variable]].description or "another value"


def problem(variable: str, value: str) -> str:
    """The one line that says `variable`'s `value` cannot be used."""
    return f"{variable}={shown_value(variable, value)} is not valid: {accepts(variable)}"


def _message(exc: ValidationError) -> str:
    lines: list[str] = []
    for error in exc.errors():
        variable = str(error["loc"][0]) if error["loc"] else ""
        if variable not in VARIABLES:
            lines.append(error["msg"])
            continue
        raw = os.environ.get(variable)
        line = problem(variable, raw if raw is not None else str(error.get("input", "")))
        if line not in lines:
            lines.append(line)
    return "; ".join(lines)


_cache: dict[tuple[str | None, ...], Settings] = {}
_CACHE_ENTRIES = 16


def _environment() -> tuple[str | None, ...]:
    return tuple(os.environ.get(variable) for variable in VARIABLES)


def settings() -> Settings:
    """The settings in the environment now, or a SettingsError (one line) for a bad value."""
    key = _environment()
    found = _cache.get(key)
    if found is not None:
        return found
    try:
        current = Settings()
    except ValidationError as exc:
        raise SettingsError(_message(exc)) from None
    if _environment() == key:  # not changed while it was read
        if len(_cache) >= _CACHE_ENTRIES:
            _cache.clear()
        _cache[key] = current
    return current

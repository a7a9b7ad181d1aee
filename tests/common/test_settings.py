"""Every setting in the environment, read and checked in one place (common/settings.py): a good
value is read, a bad one is one line naming the variable and what it accepts, and every command
ends with that line and exit code 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common import config
from common.entry import EXIT_SETTINGS
from common.settings import VARIABLES, Settings, SettingsError, settings

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cr3t-Pa55"


@pytest.fixture(autouse=True)
def _no_settings_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def test_every_variable_has_its_default_when_unset():
    current = settings()
    assert current == Settings()
    assert (current.data, current.database_url, current.dataset_roots) == (Path("data"), None, ())
    assert (current.heartbeat_interval_s, current.heartbeat_timeout_s) == (5.0, 60.0)
    assert current.sqlite_busy_timeout_s == 30.0
    assert (current.upload_max_files, current.upload_max_mb) == (5_000, 500)
    assert (current.port, current.address, current.auth) == (8501, "127.0.0.1", "auto")
    assert (current.password_hash, current.session_hours) == (None, 12.0)
    assert current.allowed_users == frozenset()
    assert (current.store, current.checkpoints_kept, current.keep_checkpoints) == (None, 2, False)
    assert current.dataset_cache_gb == 50.0


GOOD = [
    ("TRAINDECK_DATA", "~/td", "data", Path("~/td")),
    ("TRAINDECK_SQLITE_BUSY_TIMEOUT", "2.5", "sqlite_busy_timeout_s", 2.5),
    ("TRAINDECK_DATASET_ROOTS", f"/a{os.pathsep} {os.pathsep}/b ", "dataset_roots",
     (Path("/a"), Path("/b"))),
    ("TRAINDECK_UPLOAD_MAX_FILES", " 3 ", "upload_max_files", 3),
    ("TRAINDECK_UPLOAD_MAX_MB", "2000", "upload_max_mb", 2000),
    ("TRAINDECK_STORE", " gs://traindeck/td/ ", "store", "gs://traindeck/td"),
    ("TRAINDECK_STORE", "gs://traindeck", "store", "gs://traindeck"),
    ("TRAINDECK_CHECKPOINTS_KEPT", "5", "checkpoints_kept", 5),
    ("TRAINDECK_KEEP_CHECKPOINTS", "True", "keep_checkpoints", True),
    ("TRAINDECK_KEEP_CHECKPOINTS", "no", "keep_checkpoints", False),
    ("TRAINDECK_DATASET_CACHE_GB", "0.5", "dataset_cache_gb", 0.5),
    ("TRAINDECK_LOADER_WORKERS", " 0 ", "loader_workers", 0),
    ("TRAINDECK_LOADER_WORKERS", "6", "loader_workers", 6),
    ("TRAINDECK_HEARTBEAT_INTERVAL", "0.5", "heartbeat_interval_s", 0.5),
    ("TRAINDECK_HEARTBEAT_TIMEOUT", "1e2", "heartbeat_timeout_s", 100.0),
    ("TRAINDECK_PORT", "8080", "port", 8080),
    ("TRAINDECK_ADDRESS", "0.0.0.0", "address", "0.0.0.0"),
    ("TRAINDECK_AUTH", " Required ", "auth", "required"),
    ("TRAINDECK_SESSION_HOURS", "0.25", "session_hours", 0.25),
    ("TRAINDECK_ALLOWED_USERS", "Ada@Example.com, @navy.mil grace@x.org", "allowed_users",
     frozenset({"ada@example.com", "@navy.mil", "grace@x.org"})),
    ("TRAINDECK_TPU_API_ENDPOINT", "http://127.0.0.1:8080/", "tpu_api_endpoint",
     "http://127.0.0.1:8080"),
    ("TRAINDECK_TPU_API_ENDPOINT", "tpu.googleapis.com", "tpu_api_endpoint",
     "https://tpu.googleapis.com"),
    ("TRAINDECK_TPU_CREDENTIALS", " anonymous ", "tpu_credentials", "anonymous"),
    ("TRAINDECK_TPU_PROJECT", "my-project", "tpu_project", "my-project"),
    ("TRAINDECK_TPU_ZONE", "us-central2-b", "tpu_zone", "us-central2-b"),
    ("TRAINDECK_SOURCE_URL", "https://example.com/traindeck.git", "source_url",
     "https://example.com/traindeck.git"),
    ("TRAINDECK_SYSTEM_METRICS_INTERVAL", "0", "system_metrics_interval_s", 0.0),
    ("TRAINDECK_SYSTEM_METRICS_INTERVAL", "2.5", "system_metrics_interval_s", 2.5),
    ("TRAINDECK_TPU_METRICS_ADDRESS", "127.0.0.1:50051", "tpu_metrics_address",
     "127.0.0.1:50051"),
]  # fmt: skip


@pytest.mark.parametrize(("variable", "text", "field", "expected"), GOOD)
def test_a_good_value_is_read(monkeypatch, variable: str, text: str, field: str, expected):
    monkeypatch.setenv(variable, text)
    assert getattr(settings(), field) == expected


def test_secrets_are_read_but_never_printed(monkeypatch):
    url = f"postgresql://ada:{PASSWORD}@db.example:5432/traindeck"
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("TRAINDECK_PASSWORD_HASH", "scrypt:16384:8:1:salt:digest")
    current = settings()
    assert config.database_url() == url
    assert current.password_hash.get_secret_value() == "scrypt:16384:8:1:salt:digest"
    assert PASSWORD not in repr(current) and "digest" not in repr(current)


BAD = [
    ("TRAINDECK_SQLITE_BUSY_TIMEOUT", "soon", "a number of seconds greater than 0"),
    ("TRAINDECK_SQLITE_BUSY_TIMEOUT", "1e9", "(at most 86400, a day)"),
    ("TRAINDECK_UPLOAD_MAX_FILES", "lots", "a whole number of files, at least 1"),
    ("TRAINDECK_UPLOAD_MAX_FILES", "0", "a whole number of files, at least 1"),
    ("TRAINDECK_UPLOAD_MAX_MB", "2.5", "a whole number of megabytes, at least 1"),
    ("TRAINDECK_HEARTBEAT_INTERVAL", "-1", "a number of seconds greater than 0"),
    ("TRAINDECK_STORE", "s3://bucket/td", "gs://BUCKET or gs://BUCKET/PREFIX"),
    ("TRAINDECK_STORE", "gs:///td", "gs://BUCKET or gs://BUCKET/PREFIX"),
    ("TRAINDECK_STORE", "bucket/td", "gs://BUCKET or gs://BUCKET/PREFIX"),
    ("TRAINDECK_CHECKPOINTS_KEPT", "0", "a whole number of checkpoints, at least 1"),
    ("TRAINDECK_CHECKPOINTS_KEPT", "two", "a whole number of checkpoints, at least 1"),
    ("TRAINDECK_KEEP_CHECKPOINTS", "sometimes", "true or false"),
    ("TRAINDECK_LOADER_WORKERS", "-1", "DataLoader worker processes, 0 to 64"),
    ("TRAINDECK_LOADER_WORKERS", "many", "DataLoader worker processes, 0 to 64"),
    ("TRAINDECK_LOADER_WORKERS", "65", "DataLoader worker processes, 0 to 64"),
    ("TRAINDECK_DATASET_CACHE_GB", "0", "a number of gigabytes greater than 0"),
    ("TRAINDECK_DATASET_CACHE_GB", "inf", "a number of gigabytes greater than 0"),
    ("TRAINDECK_HEARTBEAT_TIMEOUT", "soon", "a number of seconds greater than 0"),
    ("TRAINDECK_HEARTBEAT_TIMEOUT", "nan", "a number of seconds greater than 0"),
    ("TRAINDECK_PORT", "http", "a port number from 1 to 65535"),
    ("TRAINDECK_PORT", "70000", "a port number from 1 to 65535"),
    ("TRAINDECK_ADDRESS", "0.0.0.0 8501", "a host name or IP address"),
    ("TRAINDECK_AUTH", "sometimes", "'auto' or 'required'"),
    ("TRAINDECK_SESSION_HOURS", "inf", "a number of hours greater than 0"),
    ("TRAINDECK_SESSION_HOURS", "0", "a number of hours greater than 0"),
    ("TRAINDECK_ALLOWED_USERS", "ada@example.com, example.org", "e-mail addresses and @domains"),
    ("DATABASE_URL", "mysql://db/traindeck", "sqlite:///PATH or postgresql://"),
    ("TRAINDECK_WORKER_DATABASE_URL", "mysql://db/traindeck", "sqlite:///PATH or postgresql://"),
    ("TRAINDECK_TPU_API_ENDPOINT", "ftp://somewhere/v2", "an address like https://"),
    ("TRAINDECK_TPU_API_ENDPOINT", "http://127.0.0.1:port", "an address like https://"),
    ("TRAINDECK_TPU_API_ENDPOINT", "https://tpu.googleapis.com/v2", "an address like https://"),
    ("TRAINDECK_SYSTEM_METRICS_INTERVAL", "0.5", "0 (off) or from 1 to 86400"),
    ("TRAINDECK_SYSTEM_METRICS_INTERVAL", "-1", "0 (off) or from 1 to 86400"),
    ("TRAINDECK_TPU_METRICS_ADDRESS", "localhost", "HOST:PORT"),
]


@pytest.mark.parametrize(("variable", "text", "accepts"), BAD)
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, variable, text, accepts):
    monkeypatch.setenv(variable, text)
    with pytest.raises(SettingsError) as raised:
        settings()
    message = str(raised.value)
    assert message.startswith(f"{variable}={text.strip()!r} is not valid: "), message
    assert accepts in message and "\n" not in message
    assert isinstance(raised.value, ValueError)  # every `except ValueError` still catches it


def test_session_hours_that_are_no_number_are_refused_not_ignored(monkeypatch):
    monkeypatch.setenv("TRAINDECK_SESSION_HOURS", "abc")
    with pytest.raises(SettingsError) as raised:
        settings()
    assert str(raised.value) == (
        "TRAINDECK_SESSION_HOURS='abc' is not valid: a number of hours greater than 0 "
        "(at most 8760, a year)"
    )


def test_two_bad_values_are_both_named_on_one_line(monkeypatch):
    monkeypatch.setenv("TRAINDECK_PORT", "x")
    monkeypatch.setenv("TRAINDECK_HEARTBEAT_TIMEOUT", "soon")
    with pytest.raises(SettingsError) as raised:
        settings()
    message = str(raised.value)
    assert "TRAINDECK_PORT='x'" in message and "TRAINDECK_HEARTBEAT_TIMEOUT='soon'" in message
    assert "\n" not in message


def test_a_value_with_a_line_break_stays_on_one_line(monkeypatch):
    monkeypatch.setenv("TRAINDECK_PORT", "80\nTraceback")
    with pytest.raises(SettingsError) as raised:
        settings()
    assert "\n" not in str(raised.value) and r"'80\nTraceback'" in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        f"mysql://ada:{PASSWORD}@db.example/traindeck",
        f"ada:{PASSWORD}@db.example/traindeck",  # no scheme
        f"postgres+psycopg://ada:{PASSWORD}@x:y@db.example:5432/traindeck",
        f"mysql://ada@db.example/traindeck?sslmode=require&password={PASSWORD}",
    ],
)
def test_a_bad_database_url_never_shows_its_password(monkeypatch, url: str):
    monkeypatch.setenv("DATABASE_URL", url)
    with pytest.raises(SettingsError) as raised:
        config.database_url()
    message = str(raised.value)
    assert message.startswith("DATABASE_URL='") and "is not valid: a database URL" in message
    assert PASSWORD not in message and "***" in message and "ada" in message


def test_a_bad_worker_database_url_never_shows_its_password(monkeypatch):
    monkeypatch.setenv("TRAINDECK_WORKER_DATABASE_URL", f"mysql://ada:{PASSWORD}@db/traindeck")
    with pytest.raises(SettingsError) as raised:
        settings()
    message = str(raised.value)
    assert message.startswith("TRAINDECK_WORKER_DATABASE_URL='mysql://ada:***@db")
    assert PASSWORD not in message


def test_a_blank_variable_counts_as_unset(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.setenv(variable, "  ")
    assert settings() == Settings.model_validate({})


def test_the_environment_is_read_again_when_it_changes(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINDECK_HEARTBEAT_TIMEOUT", "7")
    assert config.heartbeat_timeout_s() == 7.0
    monkeypatch.setenv("TRAINDECK_HEARTBEAT_TIMEOUT", "8")
    assert config.heartbeat_timeout_s() == 8.0
    monkeypatch.setenv("TRAINDECK_HEARTBEAT_TIMEOUT", "soon")
    with pytest.raises(SettingsError):
        config.heartbeat_timeout_s()
    monkeypatch.delenv("TRAINDECK_HEARTBEAT_TIMEOUT")
    assert config.heartbeat_timeout_s() == config.DEFAULT_HEARTBEAT_TIMEOUT_S
    monkeypatch.setenv("TRAINDECK_DATA", str(tmp_path / "elsewhere"))
    assert config.data_dir() == tmp_path / "elsewhere"
    assert config.database_url() == f"sqlite:///{tmp_path / 'elsewhere' / 'traindeck.db'}"


def test_the_readers_elsewhere_go_through_the_settings(monkeypatch, tmp_path):
    from datasets.uploads import UploadLimits
    from datasets.validation import allowed_roots
    from db.engine import DatabaseUrlError

    monkeypatch.setenv("TRAINDECK_DATA", str(tmp_path))
    monkeypatch.setenv("TRAINDECK_DATASET_ROOTS", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    monkeypatch.setenv("TRAINDECK_UPLOAD_MAX_MB", "2")
    assert allowed_roots() == [tmp_path, tmp_path / "a", tmp_path / "b"]
    assert UploadLimits.from_env().max_bytes == 2_000_000
    monkeypatch.setenv("TRAINDECK_UPLOAD_MAX_MB", "two")
    with pytest.raises(SettingsError, match=r"^TRAINDECK_UPLOAD_MAX_MB='two' is not valid"):
        UploadLimits.from_env()
    assert issubclass(DatabaseUrlError, SettingsError)


def test_the_store_reads_its_settings_here(monkeypatch, tmp_path):
    from common import store

    monkeypatch.setenv("TRAINDECK_DATA", str(tmp_path))
    assert store.store_url() == (tmp_path / "store").as_uri() and not store.is_shared()
    monkeypatch.setenv("TRAINDECK_STORE", "gs://traindeck/td/")
    monkeypatch.setenv("TRAINDECK_CHECKPOINTS_KEPT", "3")
    monkeypatch.setenv("TRAINDECK_KEEP_CHECKPOINTS", "yes")
    monkeypatch.setenv("TRAINDECK_DATASET_CACHE_GB", "1.5")
    assert (store.store_url(), store.is_shared()) == ("gs://traindeck/td", True)
    assert (store.checkpoints_kept(), store.keep_final_checkpoint()) == (3, True)
    assert store.dataset_cache_bytes() == 1_500_000_000
    monkeypatch.setenv("TRAINDECK_STORE", "file:///srv/store")
    with pytest.raises(SettingsError, match=r"^TRAINDECK_STORE='file:///srv/store' is not valid"):
        store.store_url()


def _run(*command: str, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in VARIABLES}
    return subprocess.run(
        [sys.executable, "-m", *command],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**env, **environment},
        timeout=120,
    )


@pytest.mark.parametrize(
    "command",
    [("db", "jobs"), ("dashboard.auth", "check"), ("dashboard", "--port", "8599")],
)
def test_a_command_with_a_bad_setting_ends_with_one_line_and_exit_2(tmp_path, command):
    result = _run(*command, TRAINDECK_DATA=str(tmp_path), TRAINDECK_SESSION_HOURS="abc")
    assert result.returncode == EXIT_SETTINGS == 2, result.stderr
    assert result.stderr.splitlines() == [
        "traindeck: TRAINDECK_SESSION_HOURS='abc' is not valid: a number of hours greater "
        "than 0 (at most 8760, a year)"
    ]
    assert result.stdout == ""
    assert not any(tmp_path.iterdir()), "nothing was created"


@pytest.mark.slow  # starts several real processes, one after another
def test_a_command_never_echoes_the_password_of_a_bad_database_url(tmp_path):
    url = f"postgresql://ada:{PASSWORD}@db:notaport/traindeck"  # the port is not a number
    for bad in (url, url.replace("postgresql", "mysql")):
        result = _run("db", "jobs", TRAINDECK_DATA=str(tmp_path), DATABASE_URL=bad)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
        assert "DATABASE_URL" in result.stderr and PASSWORD not in result.stderr


def test_the_readme_lists_exactly_these_variables():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Configuration\n", 1)[1].split("\n### ", 1)[0]
    listed = re.findall(r"^\| `([A-Z_]+)` \|", section, flags=re.MULTILINE)
    assert sorted(listed) == sorted(VARIABLES)
    assert "common/settings.py" in section

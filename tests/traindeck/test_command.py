"""The `traindeck` console script: the same commands as `python -m db`, plus `run` and
`worker`; `python -m dashboard` carries the dashboard's settings from any folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard.__main__ import environment_name, settings_flags
from traindeck.run import PROCESSES

REPO = Path(__file__).resolve().parents[2]
TRAINDECK = Path(sys.executable).with_name("traindeck")


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # starts several real processes, one after another
def test_traindeck_and_python_m_db_submit_the_same_job(tmp_path):
    env = {"TRAINDECK_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"}
    assert _run([str(TRAINDECK), "upgrade"], env).returncode == 0
    flags = ["submit", "--arch", "resnet18", "--epochs", "2", "--lr", "0.01", "--json"]
    first = _run([str(TRAINDECK), *flags], env)
    second = _run([sys.executable, "-m", "db", *flags], env)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    one, two = json.loads(first.stdout)["id"], json.loads(second.stdout)["id"]
    assert two == one + 1
    shown = [
        json.loads(_run([str(TRAINDECK), "show", str(i), "--json"], env).stdout) for i in (one, two)
    ]
    assert shown[0]["spec"] == shown[1]["spec"]
    assert shown[0]["spec"]["epochs"] == 2


@pytest.mark.slow  # starts several real processes, one after another
def test_help_lists_every_command_and_names_the_program():
    result = _run([str(TRAINDECK), "--help"], {"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0
    assert result.stdout.startswith("usage: traindeck")
    for command in ("run", "worker", "submit", "jobs", "show", "cancel", "retry", "dataset"):
        assert f"    {command} " in result.stdout
    old = _run([sys.executable, "-m", "db", "--help"], {"PATH": "/usr/bin:/bin"})
    assert old.stdout.startswith("usage: python -m db")


def test_traindeck_worker_is_the_worker_command():
    result = _run([str(TRAINDECK), "worker", "--help"], {"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: traindeck worker")
    assert "--device" in result.stdout


def test_a_user_error_is_one_line_and_exit_2(tmp_path):
    env = {"TRAINDECK_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"}
    result = _run([str(TRAINDECK), "show", "abc"], env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_traindeck_run_starts_what_the_procfile_lists():
    lines = (REPO / "Procfile").read_text().splitlines()
    procfile = dict(line.split(": ", 1) for line in lines if line.strip())
    assert procfile == PROCESSES


def test_the_dashboard_settings_become_flags_unless_the_environment_sets_them():
    flags = settings_flags(environ={})
    assert "--server.enableXsrfProtection=true" in flags
    assert "--client.showErrorDetails=none" in flags
    name = environment_name("client", "showErrorDetails")
    assert name == "STREAMLIT_CLIENT_SHOW_ERROR_DETAILS"
    overridden = settings_flags(environ={name: "full"})
    assert not any(flag.startswith("--client.showErrorDetails") for flag in overridden)

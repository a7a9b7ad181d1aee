"""`python -m db dataset add|list|remove`: one line per mistake, JSON for scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from sqlalchemy import Engine

from db import queue
from db.datasets import get_dataset
from tests.support.images import (
    make_csv_dataset,
    make_folder_dataset,
    make_pets_dataset,
    zip_folder,
)
from traindeck.cli import EXIT_USER_ERROR, main

REPO = Path(__file__).resolve().parents[2]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_add_each_kind_then_list(
    sqlite_engine: Engine,
    data_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_folder_dataset(data_dir / "animals", per_class=2)
    make_pets_dataset(data_dir / "pets", per_breed=2)
    csv_path = make_csv_dataset(data_dir / "listed", per_class=2)
    archive = zip_folder(make_folder_dataset(tmp_path / "src", per_class=2), tmp_path / "z.zip")
    monkeypatch.chdir(data_dir)

    assert run_cli(capsys, "dataset", "add", "animals", "--folder", "animals")[0] == 0
    code, out, _ = run_cli(
        capsys, "dataset", "add", "pets", "--folder", "pets", "--label-regex", r"^(.+)_\d+\.jpg$"
    )
    assert code == 0
    assert "registered 'pets'" in out
    assert "6 images in 3 classes" in out
    assert run_cli(capsys, "dataset", "add", "listed", "--csv", str(csv_path))[0] == 0
    code, out, _ = run_cli(capsys, "dataset", "add", "zipped", "--zip", str(archive), "--json")
    assert code == 0
    assert json.loads(out)["class_counts"] == {"cat": 2, "dog": 2}
    assert run_cli(capsys, "dataset", "add", "remote", "--url", "URLs.MNIST_TINY")[0] == 0

    code, out, _ = run_cli(capsys, "dataset", "list", "--json")
    listed = {entry["name"]: entry for entry in json.loads(out)}
    assert code == 0
    assert {name: entry["kind"] for name, entry in listed.items()} == {
        "animals": "folder",
        "listed": "folder",
        "pets": "folder",
        "remote": "url",
        "zipped": "upload",
    }
    assert listed["pets"]["class_counts"] == {
        "Abyssinian": 2,
        "american_bulldog": 2,
        "great_pyrenees": 2,
    }
    code, out, _ = run_cli(capsys, "dataset", "list")
    assert "not fetched yet  URLs.MNIST_TINY" in out

    code, out, _ = run_cli(capsys, "dataset", "remove", "zipped")
    assert code == 0
    assert "deleted" in out
    assert get_dataset(sqlite_engine, "zipped") is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["add", "x", "--folder", "/etc"], "outside the allowed data roots"),
        (["add", "x", "--folder", "nowhere"], "does not exist"),
        (["add", "x", "--csv", "a.csv", "--label-regex", "(x)"], "does not apply to --csv"),
        (["add", "x", "--url", "gopher://a/b.tgz"], "neither a fastai dataset name"),
        (["add", "x", "--zip", "missing.zip"], "does not exist"),
        (["add", "x y", "--url", "URLs.PETS"], "may hold only letters"),
        (["add", "猫 狗", "--url", "URLs.PETS"], "may hold only letters and digits (of any script"),
        (["add", "猫\u200b狗", "--url", "URLs.PETS"], "may hold only letters"),
        (["add", ".猫", "--url", "URLs.PETS"], "must start with a letter or digit"),
        (["add", "猫" * 67, "--url", "URLs.PETS"], "longer than 200 bytes in UTF-8"),
        (["add", "x", "--folder", "a", "--url", "URLs.PETS"], "not allowed with argument"),
        (["add", "x"], "one of the arguments --folder --csv --zip --url is required"),
        (["remove", "ghost"], "no dataset named 'ghost'"),
    ],
)
def test_mistakes_give_one_line(
    sqlite_engine: Engine,
    data_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(data_dir)
    try:
        code, _, err = run_cli(capsys, "dataset", *argv)
    except SystemExit as exit_:
        code, err = exit_.code, capsys.readouterr().err
    assert code == EXIT_USER_ERROR
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_a_hostile_zip_from_a_terminal_gives_no_traceback(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path
) -> None:
    import zipfile

    hostile = tmp_path / "evil.zip"
    with zipfile.ZipFile(hostile, "w") as archive:
        archive.writestr("cat/1.png", b"x")
        archive.writestr("../../evil.png", b"x")
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    result = subprocess.run(
        [sys.executable, "-m", "db", "dataset", "add", "evil", "--zip", str(hostile)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )

    assert result.returncode == EXIT_USER_ERROR
    assert "points outside the dataset folder" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path.parent / "evil.png").exists()
    assert not list((data_dir / "datasets" / "uploads").iterdir())


@pytest.mark.slow  # starts several real processes, one after another
def test_a_name_in_any_script_names_the_dataset_its_folder_and_jobs_in_nfc(
    sqlite_engine: Engine, data_dir: Path, tmp_path: Path
) -> None:
    archive = zip_folder(make_folder_dataset(tmp_path / "src", per_class=2), tmp_path / "z.zip")
    # As a macOS file name or a keyboard may give it: 'e' and a combining accent.
    typed = unicodedata.normalize("NFD", "café-猫狗")
    stored = unicodedata.normalize("NFC", typed)
    assert typed != stored
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "db", *argv, "--json"]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

    added = cli("dataset", "add", typed, "--zip", str(archive))
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["name"] == stored
    assert [p.name for p in (data_dir / "datasets" / "uploads").iterdir()] == [stored]
    assert get_dataset(sqlite_engine, stored).location.startswith(
        str(data_dir / "datasets" / "uploads" / stored)
    )
    submitted = cli("submit", "--dataset", typed, "--bs", "2")
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    assert queue.get_job(sqlite_engine, job_id).spec["dataset"] == stored
    removed = cli("dataset", "remove", typed, "--force")
    assert removed.returncode == 0, removed.stderr
    assert json.loads(removed.stdout)["removed"] == stored
    assert get_dataset(sqlite_engine, stored) is None

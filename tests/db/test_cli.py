"""`python -m db`: every command with --json for scripts, and one-line errors for people."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.entry import EXIT_BROKEN_PIPE
from db import queue
from db.datasets import save_dataset
from db.telemetry import MetricPoint, write_metrics
from tests.support.artifacts import record_local_file
from traindeck.cli import main

REPO = Path(__file__).resolve().parents[2]
SHOW_KEYS = {
    "id", "name", "status", "attempts", "worker_id", "error", "spec", "progress",
    "final_metrics", "artifacts",
}  # fmt: skip


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_submit_with_flags_prints_the_id_as_json(engine, capsys):
    code, out, _ = run_cli(
        capsys, "submit", "--epochs", "5", "--img-size", "32", "--lr", "find",
        "--no-pretrained", "--grad-clip", "1.5", "--name", "flags", "--json",
    )  # fmt: skip
    assert code == 0
    job_id = json.loads(out)["id"]
    spec = queue.get_job(engine, job_id).spec
    assert (spec["epochs"], spec["img_size"], spec["lr"]) == (5, 32, "find")
    assert spec["pretrained"] is False and spec["grad_clip"] == 1.5


def test_submit_from_a_spec_file_with_flags_overriding_it(engine, capsys, tmp_path):
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps({"epochs": 2, "bs": 16, "arch": "resnet34"}))
    code, out, _ = run_cli(capsys, "submit", "--spec", str(spec_file), "--bs", "32", "--json")
    assert code == 0
    spec = queue.get_job(engine, json.loads(out)["id"]).spec
    assert (spec["epochs"], spec["bs"], spec["arch"]) == (2, 32, "resnet34")


def test_jobs_show_cancel_retry_as_json(engine, capsys):
    job_id = queue.submit(engine, {"name": "shown", "epochs": 2})
    lease = queue.claim(engine, "w1").lease
    queue.set_progress(engine, lease, epoch=1, step=22, total_epochs=2, total_steps=44,
                       eta_seconds=9.0)  # fmt: skip
    write_metrics(engine, job_id, [MetricPoint("epoch/accuracy", 0, 0.5),
                                   MetricPoint("epoch/accuracy", 1, 0.9)])  # fmt: skip

    code, out, _ = run_cli(capsys, "jobs", "--json")
    assert code == 0
    (listed,) = json.loads(out)
    assert listed["id"] == job_id and listed["status"] == "running"

    code, out, _ = run_cli(capsys, "show", str(job_id), "--json")
    shown = json.loads(out)
    assert set(shown) >= SHOW_KEYS
    assert shown["worker_id"] == "w1" and shown["attempts"] == 1
    assert shown["progress"] == {"epoch": 1, "step": 22, "total_epochs": 2, "total_steps": 44,
                                 "eta_seconds": 9.0}  # fmt: skip
    assert shown["final_metrics"] == {"accuracy": 0.9}

    code, out, _ = run_cli(capsys, "cancel", str(job_id), "--json")
    assert json.loads(out) == {"id": job_id, "status": "cancelling"}
    queue.finish(engine, lease, "cancelled")
    code, out, _ = run_cli(capsys, "retry", str(job_id), "--json")
    assert code == 0 and json.loads(out)["retry_of"] == job_id


def test_show_lists_artifacts_with_size_and_hash(engine, capsys, tmp_path):
    job_id = queue.submit(engine, {})
    exported = tmp_path / "export.pkl"
    exported.write_bytes(b"model bytes")
    record_local_file(engine, job_id, "export", exported)
    _code, out, _ = run_cli(capsys, "show", str(job_id), "--json")
    (artifact,) = json.loads(out)["artifacts"]
    assert artifact["kind"] == "export" and artifact["bytes"] == 11
    assert artifact["path"] == str(exported) and len(artifact["sha256"]) == 64


def test_human_output_without_json(engine, capsys):
    job_id = queue.submit(engine, {"name": "readable"})
    code, out, _ = run_cli(capsys, "jobs")
    assert code == 0 and "readable" in out and "queued" in out
    code, out, _ = run_cli(capsys, "show", str(job_id))
    assert code == 0 and f"job {job_id}: readable" in out


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["submit", "--bs", "0"], "bs"),
        (["submit", "--lr", "-1"], "lr"),
        (["submit", "--lr", "fast"], "lr"),
        (["submit", "--epochs", "0"], "epochs"),
        (["submit", "--arch", "alexnet"], "arch"),
        (["submit", "--mixed-precision", "fp16", "--device", "xla"], "mixed_precision"),
        (["submit", "--dataset", "nope"], "dataset"),
        (["submit", "--img-size", "lots"], "img_size"),
        (["submit", "--spec", "/no/such/file.json"], "--spec"),
        (["show", "999"], "no job with id 999"),
        (["show", "abc"], "job id"),
        (["cancel", "0"], "job id"),
        (["retry", "999"], "no job with id 999"),
        (["jobs", "--status", "sleeping"], "--status"),
        (["frobnicate"], "frobnicate"),
    ],
)
def test_mistakes_exit_non_zero_with_one_line_naming_the_problem(engine, capsys, args, named):
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse's own mistakes
        code = exit_.code
    captured = capsys.readouterr()
    assert code != 0
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), captured.err
    assert named in lines[0]
    assert "Traceback" not in captured.err
    assert queue.list_jobs(engine) == []


def test_a_bad_spec_file_names_the_mistake(engine, capsys, tmp_path):
    spec_file = tmp_path / "job.json"
    spec_file.write_text('{"epochs": 2,}')
    code, _, err = run_cli(capsys, "submit", "--spec", str(spec_file))
    assert code == 2 and "not valid JSON" in err
    spec_file.write_text("[1, 2]")
    code, _, err = run_cli(capsys, "submit", "--spec", str(spec_file))
    assert code == 2 and "JSON object" in err


@pytest.mark.slow  # starts several real processes, one after another
def test_real_entry_point_and_a_missing_schema(data_dir, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "TRAINDECK_DATA": str(data_dir),
           "DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "db", "jobs"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode == 3
    assert result.stderr.strip() == (
        "error: the database has no traindeck tables yet; run `python -m db upgrade`"
    )
    upgraded = subprocess.run(
        [sys.executable, "-m", "db", "upgrade"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert upgraded.returncode == 0, upgraded.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "db", "jobs", "--json"], cwd=REPO, env=env, capture_output=True,
        text=True,
    )  # fmt: skip
    assert listed.returncode == 0 and json.loads(listed.stdout) == []


def test_a_reader_that_leaves_early_ends_the_cli_quietly(sqlite_engine):
    # More output than a pipe holds, so that the command is still writing when `head` leaves.
    classes = [f"class-{index:05d}" for index in range(5000)]
    save_dataset(
        sqlite_engine,
        name="many",
        kind="folder",
        location="/nowhere",
        label_rule={"type": "folder"},
        classes=classes,
        class_counts=dict.fromkeys(classes, 2),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "db", "dataset", "list", "--json"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout.readline() == b"[\n"
    process.stdout.close()
    errors = process.stderr.read().decode()
    assert process.wait(timeout=60) == EXIT_BROKEN_PIPE
    assert errors == ""

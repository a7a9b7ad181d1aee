"""`python -m db sweep …`: submit from YAML or JSON, list, show, cancel, each with --json;
a bad definition or an unknown sweep is one line naming the problem."""

from __future__ import annotations

import json

from db import queue
from tests.db.test_cli import run_cli

YAML = """\
name: lr on digits
base: {dataset: digits, epochs: 2, img_size: 16, device: cpu}
space:
  lr: {type: log_uniform, low: 1e-5, high: 1e-1}
  bs: [16, 32]
objective: accuracy
trials: 4
max_concurrent: 2
sampler: random
pruner: {type: asha, min_epochs: 1}
"""


def test_submit_a_yaml_definition_then_list_show_and_cancel(engine, capsys, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(YAML)
    code, out, err = run_cli(capsys, "sweep", "submit", str(path), "--json")
    assert code == 0, err
    submitted = json.loads(out)
    assert len(submitted["queued_trials"]) == 2
    job = queue.get_job(engine, submitted["queued_trials"][0])
    assert job.sweep_id == submitted["id"] and 1e-5 <= job.spec["lr"] <= 1e-1

    code, out, _ = run_cli(capsys, "sweep", "list")
    assert code == 0 and "lr on digits" in out and "0/4" in out
    code, out, _ = run_cli(capsys, "sweep", "show", str(submitted["id"]), "--json")
    shown = json.loads(out)
    assert shown["objective"] == {"metric": "accuracy", "direction": "maximize"}
    assert [trial["status"] for trial in shown["trials"]] == ["queued", "queued"]
    assert shown["best"] is None and shown["definition"]["pruner"]["type"] == "asha"
    code, out, _ = run_cli(capsys, "sweep", "show", str(submitted["id"]))
    assert "TRIAL" in out and "lr=" in out

    code, out, _ = run_cli(capsys, "sweep", "cancel", str(submitted["id"]), "--json")
    assert json.loads(out) == {"id": submitted["id"], "status": "cancelled", "trials_stopped": 2}
    code, _, err = run_cli(capsys, "sweep", "cancel", str(submitted["id"]))
    assert code == 2 and err == f"error: sweep {submitted['id']} is already cancelled\n"


def test_a_json_definition_is_read_too(engine, capsys, tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"space": {"bs": [16, 32]}, "objective": "valid_loss",
                                "trials": 2, "sampler": "grid"}))  # fmt: skip
    code, out, err = run_cli(capsys, "sweep", "submit", str(path))
    assert code == 0, err
    assert "queued 1 of 2 trials" in out


def test_mistakes_are_one_line_naming_the_problem(engine, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("space: {lr: {type: uniform, low: 0.1, high: 0.01}}\ntrials: 3\n"
                   "objective: accuracy\n")  # fmt: skip
    code, out, err = run_cli(capsys, "sweep", "submit", str(bad))
    assert (code, out) == (2, "")
    assert err == "error: space.lr: low 0.1 is above high 0.01\n"
    broken = tmp_path / "broken.yaml"
    broken.write_text("space: [1,\n")
    code, _, err = run_cli(capsys, "sweep", "submit", str(broken))
    assert code == 2 and err.startswith("error: sweep: is not valid YAML or JSON (")
    code, _, err = run_cli(capsys, "sweep", "submit", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read" in err and "No such file" in err
    code, _, err = run_cli(capsys, "sweep", "show", "99")
    assert (code, err) == (2, "error: no sweep with id 99\n")
    assert queue.list_jobs(engine) == []


def test_a_sweeps_tags_and_note_come_from_its_file_or_the_command_line(engine, capsys, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(YAML + "tags: [from-file]\nnote: tried *once*\n")
    code, out, err = run_cli(capsys, "sweep", "submit", str(path), "--json")
    assert code == 0, err
    from_file = json.loads(out)["id"]
    code, out, err = run_cli(
        capsys, "sweep", "submit", str(path), "--tag", "a", "--tag", "b", "--note", "n", "--json"
    )
    assert code == 0, err
    from_flags = json.loads(out)["id"]
    code, out, _ = run_cli(capsys, "sweep", "show", str(from_file), "--json")
    assert (json.loads(out)["tags"], json.loads(out)["note"]) == (["from-file"], "tried *once*")
    code, out, _ = run_cli(capsys, "sweep", "show", str(from_flags), "--json")
    assert (json.loads(out)["tags"], json.loads(out)["note"]) == (["a", "b"], "n")
    code, out, _ = run_cli(capsys, "sweep", "show", str(from_flags))
    assert "tags:      a, b" in out

    code, _, err = run_cli(capsys, "sweep", "submit", str(path), "--tag", "x" * 80)
    assert code == 2 and err.startswith("error: tags: ") and err[-1] == "\n"

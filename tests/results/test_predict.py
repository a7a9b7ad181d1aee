"""Predicting with a finished job's export: `python -m worker predict` and the dashboard's
`predict_uploads`, on known digits, on files that are no images, and on a tampered export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard import results_view
from db.artifacts import get_artifact
from db.exports import ArtifactTampered, ArtifactUnavailable
from db.results import get_results
from tests.support.trained import REPO, TrainedJob, flip_byte, job_with_copied_export

pytestmark = pytest.mark.slow


def known_digits(trained: TrainedJob) -> dict[str, Path]:
    """One validation image per digit that the stored results say the model gets right."""
    chosen: dict[str, Path] = {}
    for path, actual, predicted in get_results(trained.engine, trained.job_id).predictions:
        if actual == predicted and actual not in chosen:
            chosen[actual] = Path(path)
    assert len(chosen) == 10, (
        f"no correct prediction stored for {set(map(str, range(10))) - set(chosen)}"
    )
    return dict(sorted(chosen.items()))


def predict_cli(trained: TrainedJob, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "predict", *args],
        cwd=REPO,
        env=trained.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_predicts_known_digits_top_class_first(trained):
    digits = known_digits(trained)
    result = predict_cli(trained, "--job", str(trained.job_id), *map(str, digits.values()))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 10
    for (digit, path), line in zip(digits.items(), lines, strict=True):
        label, probability, image, runners_up, latency = line.split("\t")
        assert (label, image) == (digit, str(path))
        assert probability.endswith("%") and float(probability[:-1]) > 10
        assert len(runners_up.split(", ")) == 2  # top 3 by default
        assert latency.endswith(" ms") and float(latency[:-3]) > 0


def test_cli_says_which_files_are_no_images_and_classifies_the_rest(trained, tmp_path):
    seven = known_digits(trained)["7"]
    notes = tmp_path / "notes.png"
    notes.write_text("not a picture, whatever the name says")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(seven.read_bytes()[:70])
    missing = tmp_path / "missing.png"

    result = predict_cli(
        trained, "--job", str(trained.job_id), "--json", "--top-k", "5",
        str(notes), str(seven), str(truncated), str(missing),
    )  # fmt: skip

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"error: {notes}: not an image" in result.stderr
    assert f"error: {truncated}: the image is damaged" in result.stderr
    assert f"error: {missing}: no such file" in result.stderr
    predictions = json.loads(result.stdout)["predictions"]
    assert [p["image"] for p in predictions] == [
        str(notes),
        str(seven),
        str(truncated),
        str(missing),
    ]
    assert predictions[1]["error"] is None
    assert predictions[1]["top"][0]["class"] == "7"
    assert len(predictions[1]["top"]) == 5
    assert sum(score["probability"] for score in predictions[1]["top"]) <= 1.0 + 1e-6
    assert all(p["error"] and not p["top"] for i, p in enumerate(predictions) if i != 1)


def test_cli_refuses_a_tampered_export_and_an_unknown_job(trained):
    export = get_artifact(trained.engine, trained.job_id, "export")
    tampered = job_with_copied_export(trained, flip_byte_at=export.bytes // 2)
    digit = str(known_digits(trained)["3"])

    refused = predict_cli(trained, "--job", str(tampered), digit)
    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr and refused.stdout == ""
    assert f"the exported model of job #{tampered}" in refused.stderr
    assert "is not the file the worker recorded" in refused.stderr
    assert "refusing to load it" in refused.stderr

    unknown = predict_cli(trained, "--job", "999999", digit)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "error: there is no job #999999"


def test_worker_help_names_the_predict_subcommand():
    shown = subprocess.run(
        [sys.executable, "-m", "worker", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0
    assert "python -m worker predict --job ID IMAGE" in shown.stdout


# --- the dashboard's function ---------------------------------------------------------------


def test_dashboard_predicts_known_digits_and_names_files_that_are_no_images(trained):
    digits = known_digits(trained)
    uploads = [(f"{digit}.png", path.read_bytes()) for digit, path in digits.items()]
    uploads.append(("holiday.jpg", b"\x00\x01 not a jpeg"))

    predictions = results_view.predict_uploads(trained.engine, trained.job_id, uploads, top_k=2)

    assert [p.label for p in predictions[:10]] == list(digits)
    assert all(len(p.top) == 2 and p.latency_s > 0 and p.error is None for p in predictions[:10])
    assert predictions[10].label is None
    assert predictions[10].error == "holiday.jpg: not an image (no image format recognises it)"


def test_dashboard_refuses_an_export_changed_after_it_was_recorded(trained):
    job_id = job_with_copied_export(trained)
    seven = ("seven.png", known_digits(trained)["7"].read_bytes())
    (before,) = results_view.predict_uploads(trained.engine, job_id, [seven])
    assert before.label == "7"

    export = trained.data_dir / "jobs" / str(job_id) / "export.pkl"  # a row from before the store
    flip_byte(export, export.stat().st_size // 2)
    with pytest.raises(ArtifactTampered, match="is not the file the worker recorded"):
        results_view.predict_uploads(trained.engine, job_id, [seven])

    export.unlink()
    with pytest.raises(ArtifactUnavailable, match="is not on this machine any more"):
        results_view.predict_uploads(trained.engine, job_id, [seven])

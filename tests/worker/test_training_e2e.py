"""End to end: a queued digits job trained by `python -m worker --once`, for real."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from common import store
from datasets.builtin import ensure_digits
from db import queue, telemetry
from db.artifacts import list_artifacts
from db.telemetry import count_metric_duplicates, metric_series
from tests.support.workers import run_python, run_worker

pytestmark = pytest.mark.slow

PREDICT = textwrap.dedent(
    """
    import json, sys
    from fastai.learner import load_learner
    learn = load_learner(sys.argv[1], cpu=True)
    assert "torch_xla" not in sys.modules, "the export must load without torch_xla"
    print(json.dumps([str(learn.predict(path)[0]) for path in sys.argv[2:]]))
    """
)


def _one_image_per_class(data_dir: Path) -> dict[str, Path]:
    digits = ensure_digits(data_dir / "datasets")
    return {label: sorted((digits / label).glob("*.png"))[-1] for label in map(str, range(10))}


def test_digits_job_trains_on_cpu_and_its_export_predicts_in_a_fresh_process(
    sqlite_engine, data_dir
):
    job_id = queue.submit(
        sqlite_engine,
        {"arch": "resnet18", "pretrained": False, "epochs": 3, "lr": 1e-2, "img_size": 16,
         "device": "cpu"},
    )  # fmt: skip
    result = run_worker("--once", "--device", "cpu")
    assert result.returncode == 0, result.stderr[-3000:]

    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "succeeded", job.error
    assert job.device == "cpu"
    assert (job.epoch, job.total_epochs) == (3, 3)
    assert job.step == job.total_steps == 3 * 22

    finals = telemetry.final_metrics(sqlite_engine, [job_id])[job_id]
    assert finals["accuracy"] >= 0.90, finals
    assert finals["top5_accuracy"] >= finals["accuracy"]
    assert {"train_loss", "valid_loss", "error_rate", "time_s", "images_per_s"} <= set(finals)

    batch_losses = metric_series(sqlite_engine, job_id, "batch/train_loss")
    assert [step for step, _ in batch_losses] == list(range(3 * 22))
    assert len(metric_series(sqlite_engine, job_id, "batch/lr")) == 3 * 22
    lrs = [value for _, value in metric_series(sqlite_engine, job_id, "batch/lr")]
    assert max(lrs) == pytest.approx(1e-2, rel=0.05), "one-cycle peaks at the lr asked for"
    assert lrs[0] < lrs[len(lrs) // 3] and lrs[-1] < lrs[len(lrs) // 3], "warm-up then anneal"
    assert [step for step, _ in metric_series(sqlite_engine, job_id, "epoch/valid_loss")] == [
        0, 1, 2,
    ]  # fmt: skip
    waits = metric_series(sqlite_engine, job_id, telemetry.INPUT_WAIT_SHARE)
    assert [step for step, _ in waits] == [0, 1, 2]
    assert all(0 <= share <= 1 for _, share in waits), waits
    assert count_metric_duplicates(sqlite_engine, job_id) == 0
    messages = [event.message for event in telemetry.events_since(sqlite_engine, job_id)]
    assert any(message.startswith("epoch 3/3") for message in messages)

    artifacts = {artifact.kind: artifact for artifact in list_artifacts(sqlite_engine, job_id)}
    export = artifacts["export"]
    assert export.path.startswith("file://") and export.path.endswith(f".{export.sha256}.pkl")
    assert store.size(export.path) == export.bytes
    assert set(artifacts) == {"export", "model_card"}, "checkpoints leave the store on success"
    assert store.list_keys(store.job_prefix(job_id) + "/checkpoints") == []
    local_copy = store.get_file(export.path, data_dir / "export-copy.pkl")

    images = _one_image_per_class(data_dir)
    predicted = run_python(PREDICT, str(local_copy), *map(str, images.values()))
    labels = json.loads(predicted.strip().splitlines()[-1])
    correct = sum(label == expected for label, expected in zip(labels, images, strict=True))
    assert correct >= 8, f"predicted {labels} for digits 0-9"

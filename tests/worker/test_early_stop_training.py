"""A real job that stops early and keeps its best epoch. The stop is forced, not hoped for:
an accuracy cannot improve by more than 1, so with that min_delta no epoch after the first
counts as better; the job with patience 1 ends after epoch 2, and epoch 1 is the best."""

from __future__ import annotations

import json

import pytest

from common import store
from db import queue, telemetry
from db.artifacts import get_artifact
from db.results import get_results
from db.telemetry import metric_series
from tests.support.workers import run_worker

pytestmark = pytest.mark.slow


def test_a_job_stops_early_as_succeeded_and_exports_its_best_epoch(sqlite_engine, small_digits):
    job_id = queue.submit(
        sqlite_engine,
        {"dataset": small_digits(per_class=12), "epochs": 4, "lr": 1e-2, "img_size": 16,
         "bs": 16, "device": "cpu",
         "monitor": "accuracy", "early_stop": 1, "min_delta": 1, "keep": "best"},
    )  # fmt: skip
    result = run_worker("--once", "--device", "cpu")
    assert result.returncode == 0, result.stderr[-3000:]

    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "succeeded", job.error
    messages = [event.message for event in telemetry.events_since(sqlite_engine, job_id)]
    losses = metric_series(sqlite_engine, job_id, "epoch/valid_loss")
    assert [step for step, _ in losses] == [0, 1], messages
    assert any(
        m.startswith("stopped early at epoch 2/4: accuracy did not improve by more than 1 ")
        for m in messages
    ), messages
    assert any(m.startswith("keeping the model of epoch 1 (accuracy") for m in messages)

    # The results are those of the exported model: epoch 1's, not epoch 2's.
    results = get_results(sqlite_engine, job_id)
    assert results.valid_loss == pytest.approx(losses[0][1], rel=1e-4)
    assert results.valid_loss != pytest.approx(losses[1][1], rel=1e-4)
    card = json.loads(store.read_bytes(get_artifact(sqlite_engine, job_id, "model_card").path))
    assert card["kept_epoch"] == {"epoch": 1, "keep": "best", "monitor": "accuracy"}

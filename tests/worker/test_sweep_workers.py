"""A sweep on two real workers sharing Postgres: they run its trials side by side, and when
one worker is killed mid-trial the other takes the trial over from its checkpoint: no trial
is lost, none is run twice, no metric point is written twice."""

from __future__ import annotations

import os
import signal

import pytest

from datasets.register import register_folder
from db import queue, sweeps, telemetry
from db.telemetry import count_metric_duplicates
from tests.support.workers import (
    child_pids,
    digits_subset,
    output_tail,
    start_worker,
    wait_for,
    wait_until_stopped_at,
)
from worker.failpoints import CHECKPOINT_UPLOADED

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_killing_a_worker_mid_sweep_loses_no_trial(engine, data_dir):
    register_folder(engine, "digits-sweep", digits_subset(data_dir, per_class=20))
    sweep_id = sweeps.submit_sweep(
        engine,
        {
            "base": {"dataset": "digits-sweep", "epochs": 2, "img_size": 16, "bs": 16,
                     "device": "cpu"},
            "space": {"lr": {"type": "log_uniform", "low": 1e-3, "high": 1e-1}},
            "objective": {"metric": "accuracy"},
            "trials": 4,
            "max_concurrent": 2,
            "sampler": "random",
        },
    )  # fmt: skip
    fast = {"TRAINDECK_HEARTBEAT_INTERVAL": "1", "TRAINDECK_HEARTBEAT_TIMEOUT": "4"}
    # The doomed worker's trial stops itself once its first checkpoint is whole in the store,
    # so that it is killed there on any machine (the trial cannot finish in between).
    doomed = start_worker(
        "--worker-id", "doomed", "--device", "cpu", TRAINDECK_FAILPOINTS=CHECKPOINT_UPLOADED,
        **fast,
    )  # fmt: skip
    survivor = None
    try:
        victim = wait_for(
            lambda: next(
                (job for job in queue.list_jobs(engine, ["running"]) if job.worker_id == "doomed"),
                None,
            ),
            timeout=120,
            what="the doomed worker's trial",
        )
        survivor = start_worker(
            "--worker-id", "survivor", "--device", "cpu", "--poll-interval", "0.5", **fast
        )
        (job_pid,) = wait_for(
            lambda: child_pids(doomed.pid), timeout=120, what="the doomed trial's process"
        )
        wait_until_stopped_at(
            job_pid, CHECKPOINT_UPLOADED, lambda: output_tail(doomed), timeout=600
        )
        os.kill(job_pid, signal.SIGKILL)
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=30)

        wait_for(
            lambda: sweeps.get_sweep(engine, sweep_id).status == "finished",
            timeout=1200,
            what="the sweep's end",
        )
    finally:
        for worker in (doomed, survivor):
            if worker is not None and worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        tail = output_tail(survivor) if survivor is not None else ""

    summary = sweeps.summary(engine, sweep_id)
    assert [row.number for row in summary.trials] == [0, 1, 2, 3], tail
    assert [row.status for row in summary.trials] == ["succeeded"] * 4, tail
    assert all(row.final and row.epochs_reported == 2 for row in summary.trials)
    taken_over = queue.get_job(engine, victim.id)
    assert (taken_over.attempts, taken_over.worker_id) == (2, "survivor")
    messages = [event.message for event in telemetry.events_since(engine, victim.id)]
    assert any("resumed from the checkpoint after epoch 1" in m for m in messages), messages
    for row in summary.trials:
        assert count_metric_duplicates(engine, row.job_id) == 0

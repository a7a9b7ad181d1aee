"""The sweep driver on SQLite and Postgres, without training: trials are queued as room
allows and never twice, a driver whose claim lapsed enqueues nothing, the pruner answers
from the epochs reported, and a sweep ends when its trials have."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import delete, update

from db import queue, study, sweeps
from db.engine import write_tx
from db.models import Job, Sweep, utcnow
from db.queue import JobStateError

BASE = {"dataset": "digits", "epochs": 3, "img_size": 16, "device": "cpu"}


def _definition(**changes):
    return {
        "base": BASE,
        "space": {"lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-1}, "bs": [16, 32]},
        "objective": {"metric": "accuracy"},
        "trials": 3,
        "max_concurrent": 2,
        "sampler": "random",
        **changes,
    }


def _trials(engine, sweep_id):
    trials = [job for job in queue.list_jobs(engine) if job.sweep_id == sweep_id]
    return sorted(trials, key=lambda job: job.trial_number)


def _run_trial(engine, job_id, values, pruned=False):
    """What a worker does with a trial: report each epoch, end it, finish the job."""
    claimed = queue.claim(engine, "test-worker")
    assert claimed is not None and claimed.id == job_id
    trial = sweeps.trial_of(engine, job_id)
    for epoch, value in enumerate(values):
        stop = sweeps.report_epoch(engine, trial, epoch, value)
    if pruned:
        assert stop, "the pruner says stop"
        sweeps.end_trial(engine, trial, "pruned")
        assert queue.finish(engine, claimed.lease, "pruned")
    else:
        sweeps.end_trial(engine, trial, "complete", kept_epoch=len(values) - 1)
        assert queue.finish(engine, claimed.lease, "succeeded")


def test_trials_are_queued_as_room_allows_and_the_sweep_ends_with_them(engine):
    sweep_id = sweeps.submit_sweep(engine, _definition())
    trials = _trials(engine, sweep_id)
    assert sorted(job.trial_number for job in trials) == [0, 1], "max_concurrent 2"
    for job in trials:
        assert 1e-4 <= job.spec["lr"] <= 1e-1 and job.spec["bs"] in (16, 32)
        assert job.name.startswith(f"sweep {sweep_id} trial {job.trial_number}")
    assert sweeps.drive(engine, sweep_id, "worker-a") == 0, "no room"

    first = min(trials, key=lambda job: job.trial_number)
    _run_trial(engine, first.id, [0.5, 0.7])
    assert sweeps.drive(engine, sweep_id, "worker-a") == 1
    assert sorted(job.trial_number for job in _trials(engine, sweep_id)) == [0, 1, 2]
    assert sweeps.drive(engine, sweep_id, "worker-a") == 0, "all 3 trials made"
    for job in _trials(engine, sweep_id):
        if job.status == "queued":
            _run_trial(engine, job.id, [0.4])
    sweeps.drive(engine, sweep_id, "worker-a")
    summary = sweeps.summary(engine, sweep_id)
    assert summary.sweep.status == "finished"
    assert summary.best.number == 0 and summary.best.objective == 0.7
    assert [row.status for row in summary.trials] == ["succeeded"] * 3


def test_the_median_pruner_stops_a_trial_worse_than_the_finished_ones(engine):
    definition = _definition(
        max_concurrent=1, trials=2, pruner={"type": "median", "startup_trials": 1},
        first_trials=[{"lr": 0.01, "bs": 32}, {"lr": 0.0001, "bs": 32}],
    )  # fmt: skip
    sweep_id = sweeps.submit_sweep(engine, definition)
    (good,) = _trials(engine, sweep_id)
    assert good.spec["lr"] == 0.01, "the first trials listed run first"
    _run_trial(engine, good.id, [0.6, 0.9])
    sweeps.drive(engine, sweep_id, "worker-a")
    bad = next(job for job in _trials(engine, sweep_id) if job.trial_number == 1)
    assert bad.spec["lr"] == 0.0001
    _run_trial(engine, bad.id, [0.1], pruned=True)
    sweeps.drive(engine, sweep_id, "worker-a")
    summary = sweeps.summary(engine, sweep_id)
    assert summary.sweep.status == "finished"
    assert [(row.status, row.final) for row in summary.trials] == [
        ("succeeded", True),
        ("pruned", False),
    ]


@pytest.mark.parametrize("lease_s", [60.0, 0.0], ids=["lease", "lapsing-claims"])
def test_racing_drivers_never_enqueue_a_trial_twice(engine, lease_s, monkeypatch):
    # With claims that lapse at once every driver asks at the same time: only the checks in
    # the enqueue's transaction keep the count.
    monkeypatch.setattr(sweeps, "DRIVER_LEASE_S", lease_s)
    sweep_id = sweeps.submit_sweep(engine, _definition(trials=8, max_concurrent=8))
    with write_tx(engine) as connection:  # as if submit had queued none: all 8 still to make
        connection.execute(update(Sweep).values(driver=None, driver_until=None))
    with write_tx(engine) as connection:
        connection.execute(delete(Job).where(Job.sweep_id == sweep_id))
    errors: list[BaseException] = []

    def drive(name: str) -> None:
        try:
            for _ in range(5):
                sweeps.drive_all(engine, name)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    numbers = [job.trial_number for job in _trials(engine, sweep_id)]
    assert len(numbers) == 8 and len(set(numbers)) == 8


def test_a_driver_whose_claim_lapsed_enqueues_nothing(engine):
    sweep_id = sweeps.submit_sweep(engine, _definition(trials=5, max_concurrent=5))
    made = len(_trials(engine, sweep_id))
    first = sweeps.take_driver(engine, sweep_id, "worker-a")
    assert sweeps.take_driver(engine, sweep_id, "worker-b") is None, "held by worker-a"
    with write_tx(engine) as connection:  # worker-a's lease runs out
        connection.execute(update(Sweep).values(driver_until=utcnow()))
    second = sweeps.take_driver(engine, sweep_id, "worker-b")
    assert second is not None and second != first
    sweep = sweeps.get_sweep(engine, sweep_id)
    spec = sweeps.parse_sweep(sweep.definition)
    assert not sweeps.enqueue_trial(engine, sweep, spec, first, 99, {"lr": 0.01, "bs": 16})
    assert len(_trials(engine, sweep_id)) == made


def test_cancel_stops_the_sweep_and_its_trials(engine):
    sweep_id = sweeps.submit_sweep(engine, _definition())
    claimed = queue.claim(engine, "test-worker")
    assert sweeps.cancel_sweep(engine, sweep_id) == 2
    statuses = {job.id: job.status for job in _trials(engine, sweep_id)}
    assert statuses[claimed.id] == "running" and queue.get_job(engine, claimed.id).cancel_requested
    assert sorted(statuses.values()) == ["cancelled", "running"]
    assert sweeps.drive(engine, sweep_id, "worker-a") == 0
    with pytest.raises(JobStateError, match="already cancelled"):
        sweeps.cancel_sweep(engine, sweep_id)


def test_a_cancelled_sweeps_trials_end_as_failed_in_optuna_once_stopped(engine):
    sweep_id = sweeps.submit_sweep(engine, _definition())
    claimed = queue.claim(engine, "test-worker")
    running_trial = sweeps.trial_of(engine, claimed.id)
    assert not sweeps.report_epoch(engine, running_trial, 0, 0.5)
    sweeps.cancel_sweep(engine, sweep_id)
    sweep = sweeps.get_sweep(engine, sweep_id)

    def states():
        return {t.number: t.state.name for t in study.trials(engine, sweep.study_name)}

    queued_number = 1 - running_trial.number
    assert states() == {running_trial.number: "RUNNING", queued_number: "FAIL"}
    assert sweep.finished_at is None, "a trial is still stopping"
    sweeps.drive_all(engine, "worker-b")
    assert states()[running_trial.number] == "RUNNING", "its job has not stopped yet"

    # The worker stops the running trial at its next batch, as the cancel asked.
    assert queue.finish(engine, claimed.lease, "cancelled", "cancelled on request")
    assert sweeps.drive_all(engine, "worker-b") == 0
    assert states() == {running_trial.number: "FAIL", queued_number: "FAIL"}
    frozen = {t.number: t for t in study.trials(engine, sweep.study_name)}
    assert frozen[running_trial.number].intermediate_values == {1: 0.5}, "its epochs are kept"
    finished_at = sweeps.get_sweep(engine, sweep_id).finished_at
    assert finished_at is not None
    sweeps.drive_all(engine, "worker-b")
    assert sweeps.get_sweep(engine, sweep_id).finished_at == finished_at, "settled once"
    assert sweeps.get_sweep(engine, sweep_id).status == "cancelled"


@pytest.mark.parametrize(
    ("sampler", "pruner"),
    [("grid", "hyperband"), ("tpe", "asha"), ("random", "median"), ("tpe", "none")],
)
def test_every_sampler_and_pruner_runs_a_sweep_to_its_end(sqlite_engine, sampler, pruner):
    engine = sqlite_engine
    space = {"bs": [16, 32, 64], "arch": ["resnet18"]}
    if sampler != "grid":
        space["lr"] = {"type": "log_uniform", "low": 1e-4, "high": 1e-1}
    definition = _definition(
        space=space, trials=3, max_concurrent=1, sampler=sampler, pruner=pruner
    )
    sweep_id = sweeps.submit_sweep(engine, definition)
    for number in range(3):
        (queued,) = [job for job in _trials(engine, sweep_id) if job.status == "queued"]
        claimed = queue.claim(engine, "test-worker")
        assert claimed.id == queued.id, "one trial at a time"
        trial = sweeps.trial_of(engine, claimed.id)
        stopped = False
        for epoch in range(3):
            if sweeps.report_epoch(engine, trial, epoch, 0.1 * (number + 1) + 0.01 * epoch):
                stopped = True
                break
        sweeps.end_trial(engine, trial, "pruned" if stopped else "complete", kept_epoch=2)
        assert queue.finish(engine, claimed.lease, "pruned" if stopped else "succeeded")
        sweeps.drive(engine, sweep_id, "test")
    summary = sweeps.summary(engine, sweep_id)
    assert summary.sweep.status == "finished"
    if sampler == "grid":
        assert sorted(row.params["bs"] for row in summary.trials) == [16, 32, 64]
    assert summary.best is not None and summary.best.final


def test_a_trials_last_epoch_completes_it_however_the_pruner_judges_it(sqlite_engine):
    """ASHA (reduction factor 3) judges a 3-epoch trial again after epoch 3, its last: a stop
    there saves no training and loses the result, so the last report never asks the pruner."""
    engine = sqlite_engine
    definition = _definition(
        space={"lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-1}},
        trials=3, max_concurrent=1, pruner="asha",
    )  # fmt: skip
    sweep_id = sweeps.submit_sweep(engine, definition)

    def start():
        sweeps.drive(engine, sweep_id, "test")
        claimed = queue.claim(engine, "test-worker")
        return claimed, sweeps.trial_of(engine, claimed.id)

    claimed, first = start()
    for epoch, value in enumerate([0.9, 0.9, 0.9]):  # the old way: the pruner asked at the end
        assert not sweeps.report_epoch(engine, first, epoch, value)
    sweeps.end_trial(engine, first, "complete", kept_epoch=2)
    assert queue.finish(engine, claimed.lease, "succeeded")

    claimed, second = start()
    assert not sweeps.report_epoch(engine, second, 0, 0.95)
    assert not sweeps.report_epoch(engine, second, 1, 0.5)
    assert not sweeps.report_epoch(engine, second, 2, 0.1, last=True), "trained: it completes"
    sweeps.end_trial(engine, second, "complete", kept_epoch=2)
    assert queue.finish(engine, claimed.lease, "succeeded")

    claimed, third = start()  # the same values, the pruner asked after the last epoch
    assert not sweeps.report_epoch(engine, third, 0, 0.95)
    assert not sweeps.report_epoch(engine, third, 1, 0.5)
    assert sweeps.report_epoch(engine, third, 2, 0.1), "what ASHA says when it is asked"
    sweeps.end_trial(engine, third, "pruned")
    assert queue.finish(engine, claimed.lease, "pruned")

    summary = sweeps.summary(engine, sweep_id)
    assert [(row.status, row.final, row.objective) for row in summary.trials] == [
        ("succeeded", True, 0.9),
        ("succeeded", True, 0.1),
        ("pruned", False, 0.1),
    ]

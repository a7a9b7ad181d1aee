"""Faults a worker must survive without losing a job or a metric point: a killed training
process, a Postgres restart, a locked SQLite file, a full disk, and cancels at awkward times.
Every job here trains for real (small digit sets, 16 px) and is checked in the database."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from common.files import job_dir
from db import jobs_table, queue, series, telemetry
from db.artifacts import get_artifact
from db.telemetry import count_metric_duplicates, metric_series
from tests.support.workers import (
    child_pids,
    output_tail,
    run_worker,
    start_worker,
    wait_for,
    wait_until_stopped_at,
)
from worker import failpoints
from worker.checkpoint import checkpoint_path

pytestmark = pytest.mark.slow

SMALL_JOB = {"arch": "resnet18", "img_size": 16, "bs": 16, "lr": 1e-2, "device": "cpu"}
STEPS_PER_EPOCH = 30  # 60 images × 10 classes, 80% for training, batches of 16


def _assert_every_point_once(engine, job_id: int, epochs: int) -> None:
    steps = [step for step, _ in metric_series(engine, job_id, "batch/train_loss")]
    assert steps == list(range(epochs * STEPS_PER_EPOCH)), "a batch point was lost"
    epoch_steps = [step for step, _ in metric_series(engine, job_id, "epoch/valid_loss")]
    assert epoch_steps == list(range(epochs))
    assert count_metric_duplicates(engine, job_id) == 0


def _messages(engine, job_id: int) -> list[str]:
    return [event.message for event in telemetry.events_since(engine, job_id)]


def _only_child(worker: subprocess.Popen) -> int:
    def children() -> list[int]:
        if worker.poll() is not None:
            output = output_tail(worker)
            raise AssertionError(f"the worker exited before its job's process was seen:\n{output}")
        return child_pids(worker.pid)

    found = wait_for(children, 120, "the job's process")
    assert len(found) == 1
    return found[0]


def _sigterm_pending(pid: int) -> bool:
    """Whether SIGTERM waits, undelivered, for a stopped process."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    pending = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
    return bool(pending & (1 << (signal.SIGTERM - 1)))


def _cancel_at_failpoint(
    engine,
    job_id: int,
    failpoint: str,
    while_stopped: Callable[[], None] | None = None,
) -> None:
    """Run one job under a worker with `failpoint` armed (worker.failpoints), and cancel the
    job while its process is stopped there: the supervisor's SIGTERM waits until the process
    resumes, so the cancel lands exactly at that point. `while_stopped` checks that state."""
    worker = start_worker(
        "--once", TRAINDECK_HEARTBEAT_INTERVAL="0.5", TRAINDECK_FAILPOINTS=failpoint
    )
    try:
        child = _only_child(worker)
        wait_until_stopped_at(child, failpoint, lambda: output_tail(worker))
        if while_stopped is not None:
            while_stopped()
        assert queue.cancel(engine, job_id) == "cancelling"
        wait_for(lambda: _sigterm_pending(child), 60, "the supervisor's stop signal")
        os.kill(child, signal.SIGCONT)
        output, _ = worker.communicate(timeout=300)
    finally:
        worker.kill()  # its job's process dies with it (PR_SET_PDEATHSIG), stopped or not
    assert worker.returncode == 0, output[-3000:]
    assert queue.get_job(engine, job_id).status == "cancelled"


# --- killed processes -----------------------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_killed_training_process_is_resumed_by_the_same_supervisor(engine, digits_dataset):
    job_id = queue.submit(engine, {**SMALL_JOB, "dataset": digits_dataset(), "epochs": 3})
    worker = start_worker("--max-jobs", "2", TRAINDECK_HEARTBEAT_INTERVAL="0.5")
    try:
        child = _only_child(worker)
        wait_for(lambda: queue.get_job(engine, job_id).epoch >= 1, 300, "the first epoch")
        wait_for(lambda: (job_dir(job_id) / "checkpoint.pth").exists(), 60, "a checkpoint")
        os.kill(child, signal.SIGKILL)
        output, _ = worker.communicate(timeout=600)
    finally:
        worker.kill()
    assert worker.returncode == 0, output[-3000:]
    job = queue.get_job(engine, job_id)
    assert job.status == "succeeded", job.error
    assert job.attempts == 2
    messages = _messages(engine, job_id)
    assert any("killed by SIGKILL" in m for m in messages), messages
    assert any("resumed from the checkpoint" in m for m in messages), messages
    _assert_every_point_once(engine, job_id, 3)


@pytest.mark.serial  # every other test's Postgres connections would drop with it
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_postgres_restart_mid_job_loses_nothing(engine, digits_dataset):
    job_id = queue.submit(engine, {**SMALL_JOB, "dataset": digits_dataset(), "epochs": 3})
    worker = start_worker("--once", TRAINDECK_HEARTBEAT_INTERVAL="0.5")
    try:
        wait_for(lambda: len(metric_series(engine, job_id, "batch/train_loss")) >= 5, 300,
                 "the first batches")  # fmt: skip
        engine.dispose()
        restart = subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect",
             sorted(os.listdir("/etc/postgresql"))[0], "main", "restart"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert restart.returncode == 0, restart.stderr
        output, _ = worker.communicate(timeout=600)
    finally:
        worker.kill()
    assert worker.returncode == 0, output[-3000:]
    job = queue.get_job(engine, job_id)
    assert job.status == "succeeded", job.error
    assert job.attempts == 1, "the job kept running through the restart"
    _assert_every_point_once(engine, job_id, 3)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_locked_sqlite_file_mid_job_delays_writes_but_loses_nothing(
    engine, database_url, digits_dataset
):
    job_id = queue.submit(engine, {**SMALL_JOB, "dataset": digits_dataset(), "epochs": 3})
    worker = start_worker(
        "--once", TRAINDECK_HEARTBEAT_INTERVAL="0.5", TRAINDECK_SQLITE_BUSY_TIMEOUT="1"
    )
    try:
        wait_for(lambda: len(metric_series(engine, job_id, "batch/train_loss")) >= 5, 300,
                 "the first batches")  # fmt: skip
        locker = sqlite3.connect(database_url.removeprefix("sqlite:///"), isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        points_when_locked = len(metric_series(engine, job_id, "batch/train_loss"))
        time.sleep(8)  # the worker's writes time out after 1 s, again and again
        locker.execute("COMMIT")
        locker.close()
        output, _ = worker.communicate(timeout=600)
    finally:
        worker.kill()
    assert worker.returncode == 0, output[-3000:]
    assert "database is locked" in output, "the lock was felt, and survived"
    job = queue.get_job(engine, job_id)
    assert job.status == "succeeded", job.error
    assert job.attempts == 1
    assert points_when_locked < 3 * STEPS_PER_EPOCH
    _assert_every_point_once(engine, job_id, 3)


@pytest.mark.soak
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_three_sqlite_workers_and_a_dashboard_reader_for_60_seconds(
    engine, database_url, digits_dataset
):
    dataset = digits_dataset(per_class=20)
    job_ids = [
        queue.submit(engine, {**SMALL_JOB, "dataset": dataset, "epochs": 500}) for _ in range(3)
    ]
    reader_errors: list[str] = []
    reads = 0
    stop_reading = threading.Event()

    def read_like_the_dashboard() -> None:
        nonlocal reads
        last_ids = {job_id: series.snapshot(engine, job_id).last_id for job_id in job_ids}
        while not stop_reading.is_set():
            try:
                jobs_table.job_rows(engine)
                for job_id in job_ids:
                    last_ids[job_id] = series.rows_since(engine, job_id, last_ids[job_id]).last_id
                    telemetry.events_since(engine, job_id)
                reads += 1
            except Exception as exc:
                reader_errors.append(repr(exc))
            time.sleep(0.05)

    workers = [start_worker("--once", TRAINDECK_HEARTBEAT_INTERVAL="0.5") for _ in range(3)]
    reader = threading.Thread(target=read_like_the_dashboard)
    try:
        wait_for(
            lambda: all(queue.get_job(engine, j).status == "running" for j in job_ids), 120,
            "all three jobs running",
        )  # fmt: skip
        reader.start()
        time.sleep(60)
        stop_reading.set()
        reader.join(timeout=60)
        for job_id in job_ids:
            queue.cancel(engine, job_id)
        outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    finally:
        stop_reading.set()
        for worker in workers:
            worker.kill()
    assert reader_errors == []
    assert reads > 50
    for output, worker in zip(outputs, workers, strict=True):
        assert worker.returncode == 0, output[-3000:]
        assert "database is locked" not in output
    for job_id in job_ids:
        assert queue.get_job(engine, job_id).status == "cancelled"
        # Every job trained, and every batch it trained reached the database: steps 0, 1, 2, …
        # without a gap. How many is up to this shared machine's speed (one CI run: 19),
        # so no number is required.
        steps = [step for step, _ in metric_series(engine, job_id, "batch/train_loss")]
        assert steps and steps == list(range(len(steps))), steps
        assert count_metric_duplicates(engine, job_id) == 0
        assert not any("database is locked" in m for m in _messages(engine, job_id))


# --- a full disk ----------------------------------------------------------------------------


def _mount_tmpfs(folder: Path, megabytes: int) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)],
        capture_output=True,
    )
    return mounted.returncode == 0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_full_disk_fails_the_job_with_that_reason_and_keeps_the_last_checkpoint(
    engine, database_url, digits_dataset
):
    job_id = queue.submit(
        engine,
        {**SMALL_JOB, "arch": "mobilenet_v3_small", "dataset": digits_dataset(), "epochs": 3},
    )
    folder = job_dir(job_id)
    if not _mount_tmpfs(folder, 28):  # one checkpoint (~18 MB) fits, a second one does not
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        result = run_worker("--once")
        assert result.returncode == 0, result.stderr[-3000:]
        job = queue.get_job(engine, job_id)
        assert job.status == "failed"
        assert "cannot write the checkpoint of epoch" in job.error
        assert "No space left on device" in job.error
        assert "the previous checkpoint is intact" in job.error
        assert "Traceback" not in job.error
        state = torch.load(folder / "checkpoint.pth", map_location="cpu", weights_only=False)
        failed_epoch = int(re.search(r"checkpoint of epoch (\d+)", job.error)[1])  # 1-based
        assert failed_epoch >= 2, job.error
        assert state["epoch"] == failed_epoch - 2, "the kept checkpoint is the epoch before"
        assert "model" in state and "optimizer" in state
        assert not list(folder.glob(".*.tmp")), "no half-written file is left"
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_unwritable_job_folder_fails_the_job_with_that_reason(engine, database_url, digits_dataset):
    job_id = queue.submit(engine, {**SMALL_JOB, "dataset": digits_dataset(), "epochs": 1})
    folder = job_dir(job_id)
    folder.mkdir(parents=True)
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported on this file system")
    try:
        result = run_worker("--once")
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    job = queue.get_job(engine, job_id)
    assert job.status == "failed"
    assert "cannot write the checkpoint of epoch 1" in job.error
    assert "Operation not permitted" in job.error


# --- cancel at awkward moments --------------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_cancel_during_lr_find(engine, database_url, digits_dataset):
    job_id = queue.submit(
        engine, {**SMALL_JOB, "dataset": digits_dataset(), "epochs": 2, "lr": "find"}
    )

    def lr_find_weights_saved() -> None:
        # fastai's lr_find saves the weights it will restore under <job>/models/tmp…/
        assert list(job_dir(job_id).glob("models/*/_tmp.pth")), "lr_find is running"

    _cancel_at_failpoint(
        engine, job_id, failpoints.LR_FIND_TMP_SAVED, while_stopped=lr_find_weights_saved
    )
    assert metric_series(engine, job_id, "lr_find/suggestion") == []
    assert metric_series(engine, job_id, "batch/train_loss") == [], "training never started"
    assert not list(job_dir(job_id).glob("models/*/_tmp.pth")), "lr_find cleaned up"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_cancel_during_validation(engine, database_url, digits_dataset):
    job_id = queue.submit(engine, {**SMALL_JOB, "dataset": digits_dataset(), "epochs": 2})

    def still_validating() -> None:
        assert metric_series(engine, job_id, "epoch/valid_loss") == [], "still validating"

    _cancel_at_failpoint(
        engine, job_id, failpoints.VALIDATION_STARTED, while_stopped=still_validating
    )
    steps = [step for step, _ in metric_series(engine, job_id, "batch/train_loss")]
    assert steps == list(range(STEPS_PER_EPOCH)), "the first epoch trained to its end"
    assert metric_series(engine, job_id, "epoch/valid_loss") == [], "validation was cut short"
    assert not (job_dir(job_id) / "checkpoint.pth").exists(), "no half-epoch checkpoint"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_cancel_during_export(engine, database_url, digits_dataset):
    job_id = queue.submit(engine, {**SMALL_JOB, "dataset": digits_dataset(), "epochs": 1})

    def export_half_done() -> None:
        assert list(job_dir(job_id).glob(".export.pkl.*.tmp")), "the export is written"
        assert not (job_dir(job_id) / "export.pkl").exists(), "and not yet renamed"

    _cancel_at_failpoint(
        engine, job_id, failpoints.EXPORT_TMP_WRITTEN, while_stopped=export_half_done
    )
    assert get_artifact(engine, job_id, "export") is None
    assert not (job_dir(job_id) / "export.pkl").exists(), "a cancelled job leaves no export"
    assert not list(job_dir(job_id).glob(".export.pkl.*.tmp"))
    assert (job_dir(job_id) / "checkpoint.pth").exists(), "the last checkpoint is kept"


# --- checkpoints written at most every interval ---------------------------------------------


def _sigterm_at(armed: str, while_stopped: Callable[[], None]) -> str:
    """A worker whose job process stops at the failpoint `armed`; there `while_stopped` runs,
    then the worker gets SIGTERM and the job process goes on to see its stop. The output."""
    worker = start_worker(TRAINDECK_HEARTBEAT_INTERVAL="0.5", TRAINDECK_FAILPOINTS=armed)
    try:
        child = _only_child(worker)
        wait_until_stopped_at(child, armed, lambda: output_tail(worker))
        while_stopped()
        worker.send_signal(signal.SIGTERM)
        wait_for(lambda: _sigterm_pending(child), 60, "the supervisor's stop signal")
        os.kill(child, signal.SIGCONT)
        output, _ = worker.communicate(timeout=300)
    finally:
        worker.kill()
    assert worker.returncode == 0, output[-3000:]
    return output


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_stop_writes_the_epoch_kept_in_memory_and_the_job_resumes_from_it(
    engine, database_url, digits_dataset
):
    """With a long checkpoint interval nothing is written after epoch 1; a graceful shutdown
    in epoch 2 writes epoch 1's state kept in memory, and the next attempt resumes from it."""
    spec = {**SMALL_JOB, "dataset": digits_dataset(), "epochs": 3, "checkpoint_interval": 3600}
    job_id = queue.submit(engine, spec)

    def not_yet_written() -> None:
        assert not checkpoint_path(job_dir(job_id)).exists(), "within the interval: not written"

    output = _sigterm_at(f"{failpoints.VALIDATION_STARTED}@2", not_yet_written)
    assert queue.get_job(engine, job_id).status == "queued"
    assert checkpoint_path(job_dir(job_id)).exists(), output[-3000:]
    state = torch.load(checkpoint_path(job_dir(job_id)), map_location="cpu", weights_only=False)
    assert state["epoch"] == 0, "epoch 1's state, kept in memory, written at the stop"

    result = run_worker("--once")
    assert result.returncode == 0, result.stderr[-3000:]
    assert queue.get_job(engine, job_id).status == "succeeded"
    messages = _messages(engine, job_id)
    assert any(m.startswith("resumed from the checkpoint after epoch 1 ") for m in messages)
    _assert_every_point_once(engine, job_id, epochs=3)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_stop_during_the_export_writes_the_last_epoch_and_the_job_resumes_at_the_export(
    engine, database_url, digits_dataset
):
    """The end of training writes no checkpoint (a succeeded job would delete it at once); a
    graceful shutdown while the model is exported writes the last epoch's state kept in
    memory, and the next attempt goes straight to the export without training again."""
    spec = {**SMALL_JOB, "dataset": digits_dataset(), "epochs": 1, "checkpoint_interval": 3600}
    job_id = queue.submit(engine, spec)

    def none_written() -> None:
        assert not checkpoint_path(job_dir(job_id)).exists(), "the end of training wrote none"

    output = _sigterm_at(failpoints.EXPORT_TMP_WRITTEN, none_written)
    assert queue.get_job(engine, job_id).status == "queued"
    assert checkpoint_path(job_dir(job_id)).exists(), output[-3000:]
    state = torch.load(checkpoint_path(job_dir(job_id)), map_location="cpu", weights_only=False)
    assert state["epoch"] == 0, "the last epoch's state, kept in memory, written at the stop"

    result = run_worker("--once")
    assert result.returncode == 0, result.stderr[-3000:]
    assert queue.get_job(engine, job_id).status == "succeeded"
    assert any(
        m.startswith("resumed from the checkpoint after epoch 1 ")
        for m in _messages(engine, job_id)
    )
    _assert_every_point_once(engine, job_id, epochs=1)
    assert get_artifact(engine, job_id, "export") is not None

"""Faults a worker must survive without losing a job or a metric point: a killed training
process, a Postgres restart, a locked SQLite file, a full disk, and cancels at awkward times.
Every job here trains for real (small digit sets, 16 px) and is checked in the database."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from db import jobs_table, queue, series, telemetry
from db.artifacts import get_artifact
from db.files import job_dir
from db.telemetry import count_metric_duplicates, metric_series
from tests.worker.conftest import child_pids, run_worker, start_worker, wait_for

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
    children = wait_for(lambda: child_pids(worker.pid), 120, "the job's process")
    assert len(children) == 1
    return children[0]


def _sigterm_pending(pid: int) -> bool:
    """Whether SIGTERM waits, undelivered, for a stopped process."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    pending = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
    return bool(pending & (1 << (signal.SIGTERM - 1)))


def _is_stopped(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state in ("T", "t")


def _freeze_at(child: int, moment: Callable[[], object], what: str, timeout: float = 300) -> None:
    """Stop the process (SIGSTOP) at a moment when `moment()` holds, judged while it is stopped:
    checked on a running process, the moment could pass between the check and the stop. The
    process runs ~95% of the time while this samples it."""
    deadline = time.monotonic() + timeout
    while True:
        os.kill(child, signal.SIGSTOP)
        while not _is_stopped(child):
            time.sleep(0.001)
        if moment():
            return
        os.kill(child, signal.SIGCONT)
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.1)


def _cancel_frozen_at(
    engine,
    job_id: int,
    moment: Callable[[], object],
    what: str,
    while_frozen: Callable[[], None] | None = None,
) -> None:
    """Run one job under a worker, stop its process (SIGSTOP) at a moment when `moment()`
    holds, and cancel the job while it is stopped: the supervisor's SIGTERM waits until the
    process resumes, so the stop lands exactly there. `while_frozen` checks the frozen state."""
    worker = start_worker("--once", TRAINDECK_HEARTBEAT_INTERVAL="0.5")
    try:
        child = _only_child(worker)
        _freeze_at(child, moment, what)
        if while_frozen is not None:
            while_frozen()
        assert queue.cancel(engine, job_id) == "cancelling"
        wait_for(lambda: _sigterm_pending(child), 60, "the supervisor's stop signal")
        os.kill(child, signal.SIGCONT)
        output, _ = worker.communicate(timeout=300)
    finally:
        worker.kill()
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
        assert state["epoch"] >= 0 and "model" in state and "optimizer" in state
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
    # fastai's lr_find saves the weights it will restore under <job>/models/tmp…/
    _cancel_frozen_at(
        engine, job_id, lambda: list(job_dir(job_id).glob("models/*/_tmp.pth")), "lr_find"
    )
    assert metric_series(engine, job_id, "lr_find/suggestion") == []
    assert metric_series(engine, job_id, "batch/train_loss") == [], "training never started"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_cancel_during_validation(engine, database_url, digits_dataset):
    job_id = queue.submit(
        engine,
        {**SMALL_JOB, "dataset": digits_dataset(per_class=150), "epochs": 2, "img_size": 64,
         "valid_pct": 0.5},
    )  # fmt: skip
    # The last training batch of epoch 1 is stored before validation starts.
    steps_per_epoch = 750 // 16

    def still_validating() -> None:
        assert metric_series(engine, job_id, "epoch/valid_loss") == [], "still validating"

    _cancel_frozen_at(
        engine,
        job_id,
        lambda: len(metric_series(engine, job_id, "batch/train_loss")) >= steps_per_epoch,
        "the end of the first epoch's training",
        while_frozen=still_validating,
    )
    assert metric_series(engine, job_id, "epoch/valid_loss") == [], "validation was cut short"
    assert not (job_dir(job_id) / "checkpoint.pth").exists(), "no half-epoch checkpoint"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_cancel_during_export(engine, database_url, digits_dataset):
    job_id = queue.submit(engine, {**SMALL_JOB, "dataset": digits_dataset(), "epochs": 1})
    _cancel_frozen_at(
        engine, job_id, lambda: list(job_dir(job_id).glob(".export.pkl.*.tmp")), "the export"
    )
    assert get_artifact(engine, job_id, "export") is None
    assert not (job_dir(job_id) / "export.pkl").exists(), "a cancelled job leaves no export"
    assert not list(job_dir(job_id).glob(".export.pkl.*.tmp"))
    assert (job_dir(job_id) / "checkpoint.pth").exists(), "the last checkpoint is kept"

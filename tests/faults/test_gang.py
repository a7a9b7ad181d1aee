"""Multi-host jobs on one machine: two (or four) worker processes pose as the hosts of one TPU
pod slice (TPU_WORKER_ID 0, 1, …, TPU_WORKER_HOSTNAMES naming as many hosts), each with a data
folder of its own, one Postgres queue, and the store on the Cloud Storage emulator, from which
every host resumes.

What these tests check is the orchestration, not multi-host training, which needs a real
slice: torch_xla's CPU backend runs one process only, so the hosts' job processes cannot form
one XLA program here. Each trains the job on the CPU on its own (device auto on a CPU worker;
on XLA-CPU each would only add a compile of about 45 s per attempt, measured here, and
nothing multi-host), and is told its process index is its host number. So the processes do
not wait for each other in collectives as a real slice's do: where a test needs host 0 held
while another host hangs, a failpoint holds it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from db import gang, queue, telemetry
from db.artifacts import get_artifact
from db.telemetry import count_metric_duplicates, metric_series
from tests.support.workers import (
    child_pids,
    output_tail,
    process_state,
    start_worker,
    wait_for,
    wait_until_stopped_at,
)
from worker import failpoints

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("database_url", ["postgres"], indirect=True),
]

SLICE = "test-slice"
# A small net: its checkpoint (18 MB with Adam's state) crosses the emulator quickly.
JOB = {
    "arch": "mobilenet_v3_small",
    "img_size": 16,
    "bs": 16,
    "lr": 1e-2,
    "device": "auto",
    "hosts": 2,
}
PER_CLASS = 10
STEPS_PER_EPOCH = 5  # 10 digits × 10 classes, 80% for training, batches of 16


@pytest.fixture
def hosts(tmp_path: Path, gcs):
    """Starts the worker of host N of a slice of `slice_hosts`; every worker started is killed
    at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(host: int, *args: str, slice_hosts: int = 2, **env: str) -> subprocess.Popen[str]:
        data = tmp_path / f"host{host}"
        data.mkdir(exist_ok=True)
        worker = start_worker(
            "--device", "cpu", "--poll-interval", "0.5", "--worker-id", f"w{host}", *args,
            TRAINDECK_DATA=str(data),
            TPU_WORKER_ID=str(host),
            TPU_WORKER_HOSTNAMES=",".join(f"host{n}" for n in range(slice_hosts)),
            TRAINDECK_SLICE=SLICE,
            TRAINDECK_HEARTBEAT_INTERVAL="0.5",
            TRAINDECK_HEARTBEAT_TIMEOUT="20",
            **env,
        )  # fmt: skip
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.poll() is None:
            worker.kill()  # its job process dies with it (PR_SET_PDEATHSIG)
            worker.communicate()


def _messages(engine, job_id: int) -> list[str]:
    return [event.message for event in telemetry.events_since(engine, job_id)]


def _row(engine, job_id: int, lease: int, host: int):
    return next((r for r in gang.members(engine, job_id, lease) if r.host == host), None)


def _state(engine, job_id: int, lease: int, host: int) -> str | None:
    row = _row(engine, job_id, lease, host)
    return row.state if row is not None else None


def _job_process(worker: subprocess.Popen[str], exclude: tuple[int, ...] = ()) -> int:
    def found() -> list[int]:
        if worker.poll() is not None:
            raise AssertionError(f"the worker exited:\n{output_tail(worker)}")
        return [pid for pid in child_pids(worker.pid) if pid not in exclude]

    return wait_for(found, 120, "the worker's job process")[0]


def _batch_steps(engine, job_id: int) -> list[int]:
    return [step for step, _ in metric_series(engine, job_id, "batch/train_loss")]


def _finish(worker: subprocess.Popen[str]) -> str:
    try:
        output, _ = worker.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        worker.kill()
        output, _ = worker.communicate()
    assert worker.returncode == 0, output[-3000:]
    return output


def test_a_two_host_job_trains_once_both_hosts_are_ready_and_only_process_0_writes(
    engine, digits_dataset, hosts
):
    job_id = queue.submit(
        engine,
        {**JOB, "dataset": digits_dataset(per_class=PER_CLASS), "epochs": 2, "max_attempts": 3},
    )

    # Host 1 never comes: the attempt fails at the start barrier and the job goes back.
    alone = hosts(0, "--once", TRAINDECK_GANG_START_TIMEOUT="3")
    _finish(alone)
    job = queue.get_job(engine, job_id)
    assert (job.status, job.attempts) == ("queued", 1)
    barrier = [m for m in _messages(engine, job_id) if "start barrier timed out" in m]
    assert barrier and barrier[0].startswith("requeued: the start barrier timed out: "), _messages(
        engine, job_id
    )
    assert (
        "of the 2 hosts of slice test-slice were ready after 3 s (host 1 never joined"
        in (barrier[0])
    )
    assert _batch_steps(engine, job_id) == []

    # Host 0 again: its process waits at the barrier, and trains nothing there.
    armed = failpoints.VALIDATION_STARTED  # holds host 0 after its first epoch
    zero = hosts(0, "--max-jobs", "1", TRAINDECK_FAILPOINTS=armed)
    zero_process = _job_process(zero)
    wait_for(
        lambda: any(
            "host 0 is at the start barrier; 1 of 2" in m for m in _messages(engine, job_id)
        ),
        120,
        "host 0's process at the start barrier",
    )
    assert process_state(zero_process) not in (None, "Z", "T")
    assert _batch_steps(engine, job_id) == [] and queue.get_job(engine, job_id).step == 0

    one = hosts(1, "--max-jobs", "1")
    wait_until_stopped_at(zero_process, armed, lambda: output_tail(zero))
    # Host 0 is held after epoch 1; host 1 trains both epochs, and ends.
    wait_for(lambda: _state(engine, job_id, 2, 1) == "done", 180, "host 1 to end")
    host_one = _row(engine, job_id, 2, 1)
    assert host_one.step == 2 * STEPS_PER_EPOCH
    assert _batch_steps(engine, job_id) == list(range(STEPS_PER_EPOCH)), "host 1 wrote none"
    assert queue.get_job(engine, job_id).step == STEPS_PER_EPOCH

    os.kill(zero_process, signal.SIGCONT)
    _finish(zero)
    _finish(one)
    job = queue.get_job(engine, job_id)
    assert (job.status, job.attempts) == ("succeeded", 2), job.error
    assert [row.state for row in gang.members(engine, job_id, 2)] == ["done", "done"]
    assert _batch_steps(engine, job_id) == list(range(2 * STEPS_PER_EPOCH))
    assert [step for step, _ in metric_series(engine, job_id, "epoch/valid_loss")] == [0, 1]
    assert count_metric_duplicates(engine, job_id) == 0
    assert get_artifact(engine, job_id, "export") is not None

    # Nobody trained before both hosts were at the barrier.
    ready = max(row.ready_at for row in gang.members(engine, job_id, 2))
    first_point = min(
        row.wall_time
        for row in telemetry.metrics_since(engine, job_id)
        if row.name.startswith("batch/")
    )
    assert first_point >= ready.timestamp()
    messages = _messages(engine, job_id)
    assert "all 2 hosts of slice test-slice are at the start barrier: training starts" in messages
    assert any(m.startswith("host 1: process 1 of 2: trains like process 0") for m in messages), (
        messages
    )


def test_a_four_host_job_trains_once_all_four_joined_and_only_process_0_writes(
    engine, digits_dataset, hosts
):
    spec = {**JOB, "hosts": 4, "dataset": digits_dataset(per_class=PER_CLASS), "epochs": 1}
    job_id = queue.submit(engine, {**spec, "max_attempts": 1})
    workers = [hosts(host, "--max-jobs", "1", slice_hosts=4) for host in range(3)]
    wait_for(
        lambda: gang.ready_hosts(engine, job_id, 1) == 3, 240, "hosts 0-2 at the start barrier"
    )
    assert _batch_steps(engine, job_id) == [] and queue.get_job(engine, job_id).step == 0

    workers.append(hosts(3, "--max-jobs", "1", slice_hosts=4))
    for worker in workers:
        _finish(worker)
    job = queue.get_job(engine, job_id)
    assert (job.status, job.attempts) == ("succeeded", 1), job.error
    rows = gang.members(engine, job_id, 1)
    assert [(row.host, row.step) for row in rows] == [(host, STEPS_PER_EPOCH) for host in range(4)]
    # Host 0 leaves with the job's status; the others leave as their processes end.
    assert [row.state for row in rows] == ["done"] * 4
    # One point per step, from process 0 alone, and none before the fourth host was ready.
    assert _batch_steps(engine, job_id) == list(range(STEPS_PER_EPOCH))
    assert count_metric_duplicates(engine, job_id) == 0
    first_point = min(
        row.wall_time
        for row in telemetry.metrics_since(engine, job_id)
        if row.name.startswith("batch/")
    )
    assert first_point >= max(row.ready_at for row in rows).timestamp()
    messages = _messages(engine, job_id)
    assert "all 4 hosts of slice test-slice are at the start barrier: training starts" in messages
    for host in (1, 2, 3):
        assert any(
            m.startswith(f"host {host}: process {host} of 4: trains like process 0")
            for m in messages
        ), messages


def test_a_killed_or_hung_host_requeues_the_whole_job_which_resumes_from_the_store(
    engine, digits_dataset, hosts
):
    job_id = queue.submit(
        engine,
        {**JOB, "dataset": digits_dataset(per_class=PER_CLASS), "epochs": 3, "max_attempts": 3},
    )
    # Each of host 0's processes stops (SIGSTOP) once the checkpoint of its first epoch is in
    # the store: in attempt 1 (epoch 1's) it holds still while host 1 is killed; in attempt 2
    # (epoch 2's) it is the hung host, whose worker still beats; in attempt 3 (epoch 3's) the
    # test lets it go on.
    armed = failpoints.CHECKPOINT_UPLOADED
    watchdog = {"TRAINDECK_PROGRESS_TIMEOUT": "40"}  # steps take seconds on a busy machine
    zero = hosts(0, "--max-jobs", "3", TRAINDECK_FAILPOINTS=armed, **watchdog)
    one = hosts(1, "--max-jobs", "3", **watchdog)

    # Attempt 1: host 1's job process is killed; host 0's goes too, and the job is requeued.
    first_zero = _job_process(zero)
    wait_until_stopped_at(first_zero, armed, lambda: output_tail(zero))
    first_one = _job_process(one)
    os.kill(first_one, signal.SIGKILL)
    wait_for(lambda: queue.get_job(engine, job_id).attempts == 2, 120, "attempt 2")
    wait_for(lambda: process_state(first_zero) is None, 30, "host 0's first process to go")
    messages = _messages(engine, job_id)
    assert "host 1 left the attempt (died): its training process was killed by SIGKILL" in (
        messages
    )
    assert (
        "requeued: host 1 of slice test-slice: its training process was killed by SIGKILL"
        in messages
    )

    # Attempt 2: every host resumes from epoch 1's checkpoint in the store; host 0's process
    # hangs after epoch 2's, its worker beating on: the progress watchdog ends the attempt.
    second_zero = _job_process(zero, exclude=(first_zero,))
    wait_until_stopped_at(second_zero, armed, lambda: output_tail(zero))
    wait_for(lambda: queue.get_job(engine, job_id).attempts == 3, 120, "attempt 3")
    hung = [m for m in _messages(engine, job_id) if "trained no step for" in m]
    assert hung and re.match(
        r"requeued: the job process of host 0 of slice test-slice trained no step for "
        r"\d+ s \(at step \d+\) while its worker still beat: hung$",
        hung[0],
    ), hung
    wait_for(lambda: process_state(second_zero) is None, 30, "host 0's hung process to go")

    # Attempt 3 resumes every host after epoch 2, and process 0 exports.
    third_zero = _job_process(zero, exclude=(first_zero, second_zero))
    wait_until_stopped_at(third_zero, armed, lambda: output_tail(zero))
    os.kill(third_zero, signal.SIGCONT)
    _finish(zero)
    _finish(one)

    job = queue.get_job(engine, job_id)
    assert (job.status, job.attempts) == ("succeeded", 3), job.error
    resumed = [m for m in _messages(engine, job_id) if m.startswith("resumed from the checkpoint")]
    assert [m.split(" (")[0] for m in resumed] == [
        "resumed from the checkpoint after epoch 1",
        "resumed from the checkpoint after epoch 2",
    ], resumed
    assert all("from gs://traindeck-test/td/jobs/" in m for m in resumed), resumed
    assert _batch_steps(engine, job_id) == list(range(3 * STEPS_PER_EPOCH)), "a point was lost"
    assert [step for step, _ in metric_series(engine, job_id, "epoch/valid_loss")] == [0, 1, 2]
    assert count_metric_duplicates(engine, job_id) == 0
    # Host 0 ended attempt 1 when host 1 died; both left attempt 3, which succeeded.
    assert [row.state for row in gang.members(engine, job_id, 1)] == ["done", "died"]
    assert [row.state for row in gang.members(engine, job_id, 3)] == ["done", "done"]

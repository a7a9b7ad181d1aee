"""A multi-host job's pieces on the worker side, without training: how host 0 judges the
attempt, how a worker finds its slice (environment, or a local fake of the TPU metadata
server), libtpu's stale lock file, and what a gang's process writes. The real processes are
in tests/faults/test_gang.py."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import ClassVar

import pytest

from db import gang, queue, telemetry
from db.gang import HostRow, Seat
from db.telemetry import MetricPoint, metric_series
from tests.support.workers import run_python, run_worker
from worker.gang import GangLimits, GangProblem, judge
from worker.job_process import EXIT_OK
from worker.reporter import Progress, TelemetryWriter
from worker.slice_supervisor import SliceSupervisor
from worker.supervisor import SupervisorOptions
from worker.tpu_slice import SliceError, SliceHost, clear_libtpu_lockfile, find_slice
from worker.tpu_slice import metadata_attribute as read_metadata

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
LIMITS = GangLimits(start_timeout_s=60, heartbeat_timeout_s=30, progress_timeout_s=100)


def _row(host: int, state: str = "joined", ago: float = 1, ready: float | None = 50, **more):
    moment = lambda seconds: None if seconds is None else NOW - timedelta(seconds=seconds)  # noqa: E731
    fields = {
        "host": host,
        "worker_id": f"w{host}",
        "state": state,
        "joined_at": NOW - timedelta(seconds=55),
        "heartbeat_at": NOW - timedelta(seconds=ago),
        "ready_at": moment(ready),
        "progress_at": moment(more.pop("progress", 10)),
        "step": 7,
        "reason": None,
    }
    return HostRow(**{**fields, **more})


def _judge(rows, waited_s: float = 70) -> GangProblem | None:
    return judge(rows, 2, "pod", waited_s=waited_s, now=NOW, limits=LIMITS)


# --- host 0's judgement ---------------------------------------------------------------------


def test_a_well_gang_and_one_whose_host_ended_well_go_on():
    assert _judge([_row(0), _row(1)]) is None
    assert _judge([_row(0), _row(1, "done", ago=500, progress=500)]) is None


@pytest.mark.parametrize(
    ("state", "action", "words"),
    [
        ("failed", "fail", "host 1 of slice pod failed: boom"),
        ("died", "requeue", "host 1 of slice pod: boom"),
        ("left", "release", "host 1 of slice pod left: boom"),
    ],
)
def test_a_host_whose_process_ended_badly_ends_the_attempt(state, action, words):
    assert _judge([_row(0), _row(1, state, reason="boom")]) == GangProblem(action, words)


def test_a_host_whose_worker_stopped_beating_ends_the_attempt():
    assert _judge([_row(0), _row(1, ago=31)]) == GangProblem(
        "requeue", "host 1 of slice pod (worker w1) sent no heartbeat for 31 s"
    )


def test_the_start_barrier_waits_its_timeout_then_says_who_is_missing():
    waiting = [_row(0, ready=None)]
    assert _judge(waiting, waited_s=59) is None
    problem = _judge(waiting, waited_s=61)
    assert problem == GangProblem(
        "requeue",
        "the start barrier timed out: 0 of the 2 hosts of slice pod were ready after 60 s "
        "(host 1 never joined; the job process of host 0 never got there)",
    )
    assert _judge([_row(0), _row(1, ready=None)], waited_s=61).reason.endswith(
        "1 of the 2 hosts of slice pod were ready after 60 s (the job process of host 1 never "
        "got there)"
    )


def test_the_progress_watchdog_names_the_host_stalled_longest_and_counts_from_the_barrier():
    # Both hosts ready 50 s ago; nobody has trained since: within the limit.
    assert _judge([_row(0, progress=None), _row(1, progress=None)]) is None
    stalled = _judge([_row(0, ready=200, progress=101), _row(1, ready=200, progress=150)])
    assert stalled == GangProblem(
        "requeue",
        "the job process of host 1 of slice pod trained no step for 150 s (at step 7) while "
        "its worker still beat: hung",
    )
    # A host ready only now restarts the clock of a host that has been waiting for it.
    assert _judge([_row(0, ready=300, progress=300), _row(1, ready=5, progress=5)]) is None


# --- a worker's place in its slice --------------------------------------------------------


def test_a_worker_finds_its_slice_in_the_environment():
    environ = {"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "10.0.0.2, 10.0.0.3"}
    assert find_slice(environ, None, None) == SliceHost("10.0.0.2", 1, 2)
    assert find_slice(environ, "pod-a", None) == SliceHost("pod-a", 1, 2)
    assert str(find_slice(environ, "pod-a", None)) == "host 1 of the 2 hosts of slice pod-a"
    assert (
        find_slice({"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "localhost"}, None, None) is None
    )
    assert find_slice({}, None, None) is None


@pytest.mark.parametrize(
    ("worker_id", "message"),
    [
        (None, "TPU_WORKER_ID is not set: this host's number, 0 to 1 (the slice has 2 hosts)"),
        ("2", "TPU_WORKER_ID='2' is not valid: this host's number, 0 to 1 (the slice has 2 hosts)"),
        ("one", "TPU_WORKER_ID='one' is not valid: this host's number, 0 to 1"),
    ],
)
def test_a_bad_host_number_is_refused_with_one_line(worker_id, message):
    environ = {"TPU_WORKER_HOSTNAMES": "a,b"} | ({"TPU_WORKER_ID": worker_id} if worker_id else {})
    with pytest.raises(SliceError) as refused:
        find_slice(environ, None, None)
    assert str(refused.value).startswith(message)


class _FakeMetadata(BaseHTTPRequestHandler):
    """The TPU VM metadata server's attributes, as a v4-16's host 1 sees them."""

    attributes: ClassVar[dict[str, str]] = {
        "worker-network-endpoints": "unknown:unknown:10.130.0.7,unknown:unknown:10.130.0.8",
        "agent-worker-number": "1",
        "tpu-env": "ACCELERATOR_TYPE: 'v4-16'\nNODE_ID: 'my-pod'\nWORKER_ID: '1'\n",
    }

    def do_GET(self):
        key = self.path.rsplit("/", 1)[-1]
        if self.headers.get("Metadata-Flavor") != "Google" or key not in self.attributes:
            self.send_error(404)
            return
        body = self.attributes[key].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metadata_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeMetadata)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_on_a_tpu_vm_the_metadata_server_tells_the_slice(metadata_server):
    environ = {"GCE_METADATA_HOST": metadata_server}
    metadata = lambda key: read_metadata(key, environ)  # noqa: E731
    assert metadata("agent-worker-number") == "1"
    assert metadata("no-such-key") is None
    assert find_slice({}, None, metadata) == SliceHost("my-pod", 1, 2)
    assert find_slice({}, "renamed", metadata) == SliceHost("renamed", 1, 2)
    nowhere = {"GCE_METADATA_HOST": "127.0.0.1:9"}
    assert find_slice({}, None, lambda key: read_metadata(key, nowhere)) is None
    with pytest.raises(SliceError) as refused:
        find_slice({}, "pod-1", lambda key: read_metadata(key, nowhere))
    assert str(refused.value) == (
        "TRAINDECK_SLICE='pod-1' is set, but this host's place in the slice is unknown: the TPU "
        "metadata server does not answer; set TPU_WORKER_ID and TPU_WORKER_HOSTNAMES"
    )


def test_a_stale_libtpu_lock_file_is_removed(tmp_path):
    lock = tmp_path / "libtpu_lockfile"
    assert not clear_libtpu_lockfile(lock)
    lock.write_text("")
    assert clear_libtpu_lockfile(lock) and not lock.exists()


def test_a_slice_worker_refuses_a_store_its_hosts_do_not_share(sqlite_engine):
    result = run_worker(
        "--once", timeout=60, TPU_WORKER_ID="1", TPU_WORKER_HOSTNAMES="a,b", TRAINDECK_SLICE="s"
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "traindeck: this worker is host 1 of the 2 hosts of slice s, whose hosts resume each "
        "job from the store's checkpoint: set TRAINDECK_STORE to a gs:// bucket they share"
    )


# --- how host 0 leaves its seat ------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "status", "state", "reason"),
    [(EXIT_OK, "succeeded", "done", None), (1, "failed", "failed", "ValueError: bad batch")],
)
def test_host_0_leaves_with_the_jobs_end_as_the_other_hosts_do(
    engine, tmp_path, exit_code, status, state, reason
):
    job_id = queue.submit(engine, {"hosts": 2})
    place = SliceHost("pod", 0, 2)
    host_zero = SliceSupervisor(engine, SupervisorOptions("w0"), place, LIMITS)
    claimed = host_zero._claim()
    gang.join(engine, "w1", "pod", 2, 1)
    error_file = tmp_path / "error.txt"
    error_file.write_text(reason or "")
    # What _record_outcome reads of a RunningJob, without a process.
    ended = SimpleNamespace(
        job=claimed, stop_reason=None, error_file=str(error_file), output_tail=[], error_text=None
    )
    host_zero._record_outcome(ended, exit_code)

    job = queue.get_job(engine, job_id)
    assert (job.status, job.error) == (status, reason)
    [zero, one] = gang.members(engine, job_id, claimed.lease.lease)
    assert (zero.state, zero.reason) == (state, reason)
    assert one.state == "joined", "host 1 leaves when its own process ends"


# --- what a gang's process writes -----------------------------------------------------------


def test_only_process_0_writes_the_jobs_points_and_progress(engine):
    job_id = queue.submit(engine, {"hosts": 2})
    lease = queue.claim(engine, "w0", slice_name="pod", hosts=2).lease
    joined = gang.join(engine, "w1", "pod", 2, 1).lease
    writers = {
        0: TelemetryWriter(engine, lease, flush_interval_s=0.05, seat=Seat(job_id, lease.lease, 0)),
        1: TelemetryWriter(
            engine, joined, flush_interval_s=0.05, seat=Seat(job_id, lease.lease, 1)
        ),
    }
    try:
        for host, writer in writers.items():
            writer.add_points([MetricPoint("batch/train_loss", 0, 10.0 + host)])
            writer.add_event("info", f"opening the device on host {host}")
            writer.set_progress(Progress(0, 3 + host, 2, 10, None))
            assert writer.flush(timeout_s=30)
        assert metric_series(engine, job_id, "batch/train_loss") == [], "held until the role"
        for host, writer in writers.items():
            writer.set_primary(host == 0)
            writer.add_points([MetricPoint("batch/train_loss", 1, 20.0 + host)])
            writer.add_event("info", "epoch 1/2")
            writer.add_event("warning", "a warning")
            assert writer.flush(timeout_s=30)
    finally:
        for writer in writers.values():
            writer.close()
    assert metric_series(engine, job_id, "batch/train_loss") == [(0, 10.0), (1, 20.0)]
    assert queue.get_job(engine, job_id).step == 3
    assert [row.step for row in gang.members(engine, job_id, lease.lease)] == [3, 4]
    messages = [event.message for event in telemetry.events_since(engine, job_id)]
    assert "opening the device on host 0" in messages
    assert "opening the device on host 1" not in messages
    assert messages.count("epoch 1/2") == 1
    assert messages.count("a warning") == 1 and messages.count("host 1: a warning") == 1


@pytest.mark.slow
def test_on_one_xla_cpu_runtime_the_process_index_is_the_host_number():
    """torch_xla's CPU backend runs one process: its process_count is 1, and a gang's process
    there takes its host number as its index (a real slice's runtime gives its own)."""
    code = (
        "from worker.gang import process_index; import torch_xla.runtime as xr; "
        "print(xr.process_count(), process_index('xla', 1), process_index('cpu', 3))"
    )
    assert run_python(code, PJRT_DEVICE="CPU").split() == ["1", "1", "3"]

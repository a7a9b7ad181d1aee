"""A bucket that refuses the worker (403: its service account lacks the permission) or is gone
(404) while a job trains, and at start-up; the Cloud Storage emulator sits behind a proxy on
loopback (tests/support/store_proxy.py) that the test switches between passing requests on and
answering them as Cloud Storage does in each case.

While a job trains, a refused or missing bucket costs only the checkpoints' uploads: the job's
log names the bucket and the cause, training goes on, and once the bucket answers again the
job ends with its export in the bucket. At start-up a worker (and the dashboard) stops with one
line naming the bucket.

A stopped store (a refused connection) is tested at the unit level only
(tests/common/test_store.py::test_a_stopped_store_fails_the_write_and_leaves_no_object): gcsfs
itself retries a refused connection for about 30 s on every call, with waits that a unit test
can skip but a worker in another process cannot, so a job would spend minutes on each upload.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from common import store
from common.entry import EXIT_SETTINGS
from db import queue
from db.artifacts import get_artifact
from db.telemetry import count_metric_duplicates, events_since, metric_series
from db.workers import list_workers
from tests.support.store_proxy import FORBIDDEN, NO_BUCKET, PASS, StoreProxy
from tests.support.workers import (
    REPO,
    child_pids,
    output_tail,
    start_worker,
    wait_for,
    wait_until_stopped_at,
    worker_env,
)
from worker import failpoints

EPOCHS = 2
STEPS_PER_EPOCH = 10  # 20 digits × 10 classes, 80% for training, batches of 16
JOB = {"arch": "resnet18", "img_size": 16, "bs": 16, "lr": 1e-2, "device": "cpu"}
BUCKET = "traindeck-test"  # the `gcs` fixture's
CAUSES = {
    FORBIDDEN: "permission refused (worker@traindeck-test.iam.gserviceaccount.com does not "
    "have storage.objects.create access",
    NO_BUCKET: "no such bucket",
}
NOT_YET = "is not in the store yet: "


def _store_warnings(engine, job_id: int) -> list[str]:
    return [e.message for e in events_since(engine, job_id) if NOT_YET in e.message]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [FORBIDDEN, NO_BUCKET])
def test_a_refused_or_missing_bucket_costs_the_uploads_only_and_the_job_succeeds(
    gcs, sqlite_engine, small_digits, mode: str
):
    """Stopped at the first validation (epoch 1 trained, no checkpoint yet), the bucket starts
    refusing; the job goes on, its first failed upload is in its log (the job stops itself
    right after reporting it, so the test reads a state); it trains every epoch while the
    bucket refuses, and stops before putting its export there; the bucket answers again, and
    the job succeeds with its export in the bucket."""
    dataset = small_digits(per_class=20)
    job_id = queue.submit(sqlite_engine, {**JOB, "dataset": dataset, "epochs": EPOCHS})
    first, retrying, export = (
        failpoints.VALIDATION_STARTED,
        failpoints.CHECKPOINT_UPLOAD_RETRYING,
        failpoints.EXPORT_TMP_WRITTEN,
    )
    with StoreProxy(gcs.url) as proxy:
        worker = start_worker(
            "--once",
            STORAGE_EMULATOR_HOST=proxy.url,  # the worker's only way to the bucket
            TRAINDECK_FAILPOINTS=f"{first},{retrying},{export}",
            TRAINDECK_HEARTBEAT_INTERVAL="0.5",
            TRAINDECK_CHECKPOINT_INTERVAL="0",  # a checkpoint after every epoch
        )
        try:
            child = wait_for(lambda: child_pids(worker.pid), 300, "the job's process")[0]
            wait_until_stopped_at(child, first, lambda: output_tail(worker))
            assert store.list_keys(f"jobs/{job_id}") == [], "no checkpoint yet"

            proxy.mode = mode
            os.kill(child, signal.SIGCONT)
            warnings = wait_for(
                lambda: _store_warnings(sqlite_engine, job_id), 300, "the upload's warning"
            )
            wait_until_stopped_at(child, retrying, lambda: output_tail(worker))
            assert proxy.refused(mode) >= 1

            # Training goes on while every upload fails, up to the export.
            os.kill(child, signal.SIGCONT)
            wait_for(
                lambda: len(metric_series(sqlite_engine, job_id, "epoch/valid_loss")) == EPOCHS,
                300,
                "the last epoch",
            )
            wait_until_stopped_at(child, export, lambda: output_tail(worker))
            assert store.list_keys(f"jobs/{job_id}") == [], "nothing reached the bucket"
            assert queue.get_job(sqlite_engine, job_id).status == "running"

            proxy.mode = PASS
            os.kill(child, signal.SIGCONT)
            output, _ = worker.communicate(timeout=600)
        finally:
            worker.kill()

    job = queue.get_job(sqlite_engine, job_id)
    assert job.status == "succeeded", f"{job.error}\n{output[-3000:]}"
    assert worker.returncode == 0, output[-3000:]
    checkpoint = f"gs://{BUCKET}/td/jobs/{job_id}/checkpoints/epoch-0000.pth"
    assert warnings[0].startswith(
        f"the checkpoint of epoch 1 is not in the store yet: bucket {BUCKET}: cannot write "
        f"{checkpoint}: {CAUSES[mode]}"
    ), warnings[0]
    assert warnings[0].endswith("; retrying in 0.5 s (training goes on)")

    exported = get_artifact(sqlite_engine, job_id, "export")
    assert exported.path.startswith(f"gs://{BUCKET}/td/jobs/{job_id}/export.")
    assert hashlib.sha256(store.read_bytes(exported.path)).hexdigest() == exported.sha256
    steps = [step for step, _ in metric_series(sqlite_engine, job_id, "batch/train_loss")]
    assert steps == list(range(EPOCHS * STEPS_PER_EPOCH)), "every batch trained, once"
    assert count_metric_duplicates(sqlite_engine, job_id) == 0


# --- at start-up ----------------------------------------------------------------------------


def _worker_once(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "--once"],
        cwd=REPO,
        env=worker_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("mode", [FORBIDDEN, NO_BUCKET, "no such bucket name"])
def test_a_worker_whose_bucket_is_refused_or_missing_stops_with_one_line(
    gcs, sqlite_engine, mode: str
):
    if mode == "no such bucket name":
        result = _worker_once(TRAINDECK_STORE="gs://no-such-bucket/td")
        bucket, cause = "no-such-bucket", "no such bucket"
    else:
        with StoreProxy(gcs.url) as proxy:
            proxy.mode = mode
            result = _worker_once(STORAGE_EMULATOR_HOST=proxy.url)
        bucket = BUCKET
        cause = "permission refused (" if mode == FORBIDDEN else "no such bucket"

    assert result.returncode == EXIT_SETTINGS, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"traindeck: bucket {bucket}: cannot reach gs://{bucket}/td: {cause}")
    assert list_workers(sqlite_engine) == [], "it never registered, nor claimed a job"


def test_a_malformed_store_url_is_one_line_and_exit_2(sqlite_engine):
    for command in (["worker", "--once"], ["db", "jobs"]):
        result = subprocess.run(
            [sys.executable, "-m", *command],
            cwd=REPO,
            env=worker_env(TRAINDECK_STORE="s3://bucket/td"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == EXIT_SETTINGS == 2, result.stderr
        assert result.stderr.splitlines() == [
            "traindeck: TRAINDECK_STORE='s3://bucket/td' is not valid: a store URL, gs://BUCKET "
            "or gs://BUCKET/PREFIX (unset: a folder under the data folder)"
        ], command
        assert "Traceback" not in result.stderr and result.stdout == ""


def test_the_dashboard_stops_every_page_with_the_line_naming_the_bucket(
    gcs, sqlite_engine, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TRAINDECK_STORE", "gs://no-such-bucket/td")
    app = AppTest.from_file(str(Path(REPO) / "dashboard" / "app.py"), default_timeout=60)

    app.run()

    assert not app.exception, [e.value for e in app.exception]
    assert [error.value for error in app.error] == ["traindeck cannot use its store:"]
    assert [code.value for code in app.code] == [
        "bucket no-such-bucket: cannot reach gs://no-such-bucket/td: no such bucket"
    ]


def test_a_malformed_store_url_stops_every_dashboard_page(
    sqlite_engine, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TRAINDECK_STORE", "file:///srv/store")
    app = AppTest.from_file(str(Path(REPO) / "dashboard" / "app.py"), default_timeout=60)

    app.run()

    assert not app.exception, [e.value for e in app.exception]
    assert [error.value for error in app.error] == [
        "traindeck cannot use a setting in its environment:"
    ]
    assert [code.value for code in app.code] == [
        "TRAINDECK_STORE='file:///srv/store' is not valid: a store URL, gs://BUCKET or "
        "gs://BUCKET/PREFIX (unset: a folder under the data folder)"
    ]

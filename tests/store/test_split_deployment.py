"""The deployment users run, on one machine: the dashboard's machine A, two worker machines B
and C, one Postgres queue, and a bucket (the real fake-gcs-server emulator, driven through
gcsfs). Each worker runs in its own mount namespace (`unshare -m`) in which the other
machines' data folders are empty: a path that only one machine has is not there for another.

A zip dataset uploaded on A's Datasets page trains on B; B is killed (SIGKILL, as a preempted
spot VM) once its second upload is in the bucket, and its folder is deleted; C resumes the
job from the bucket's checkpoint, with every metric point once; the dashboard's download on A
serves the export with its SHA-256, and predict on A answers as on C. The same flow passes with
the default local store on one machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient
from streamlit.testing.v1 import AppTest

from common import store
from db import queue, telemetry
from db.artifacts import get_artifact
from db.telemetry import count_metric_duplicates, metric_series
from tests.support.images import zip_folder
from tests.support.markdown import shown
from tests.support.workers import (
    REPO,
    child_pids,
    digits_subset,
    output_tail,
    wait_for,
    wait_until_stopped_at,
)
from worker import failpoints

pytestmark = pytest.mark.slow

EPOCHS = 3
STEPS_PER_EPOCH = 10  # 20 digits × 10 classes, 80% for training, batches of 16
JOB = {"arch": "resnet18", "img_size": 16, "bs": 16, "lr": 1e-2, "device": "cpu"}
FAST_HEARTBEATS = {"TRAINDECK_HEARTBEAT_INTERVAL": "0.5", "TRAINDECK_HEARTBEAT_TIMEOUT": "3"}


def _unshare_works() -> bool:
    probe = ["unshare", "-m", "--", "sh", "-c", "mount -t tmpfs tmpfs /mnt && umount /mnt"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _machine_env(data: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "TRAINDECK_DATA": str(data), "PYTHONPATH": str(REPO)}
    env.pop("TRAINDECK_FAILPOINTS", None)
    return {**env, **extra}


def _on_machine(args: list[str], hide: list[Path]) -> list[str]:
    """`args` in a mount namespace where the folders in `hide` are empty."""
    if not hide:
        return [sys.executable, *args]
    mounts = " && ".join(f"mount -t tmpfs tmpfs '{folder}'" for folder in hide)
    return [
        "unshare",
        "-m",
        "--",
        "sh",
        "-c",
        f'{mounts} && exec "$@"',
        "sh",
        sys.executable,
        *args,
    ]


def _start_worker(data: Path, hide: list[Path], **extra: str) -> subprocess.Popen[str]:
    """A worker that polls until it has run one job (requeueing jobs whose worker died)."""
    return subprocess.Popen(
        _on_machine(["-m", "worker", "--max-jobs", "1", "--poll-interval", "0.5"], hide),
        cwd=REPO,
        env=_machine_env(data, **FAST_HEARTBEATS, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _traindeck(data: Path, hide: list[Path], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        _on_machine(["-m", "traindeck", *args], hide),
        cwd=REPO,
        env=_machine_env(data),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _upload_on_a(monkeypatch, data_a: Path, archive: Path) -> None:
    """The Datasets page's zip upload (Streamlit's AppTest), in this process configured as A."""
    monkeypatch.setenv("TRAINDECK_DATA", str(data_a))
    page = AppTest.from_file(str(REPO / "dashboard" / "pages" / "datasets.py"), default_timeout=120)
    page.run()
    page.get("file_uploader")[0].set_value((archive.name, archive.read_bytes(), "application/zip"))
    next(b for b in page.button if b.proto.form_id == "datasets.zip").click().run()
    assert not page.exception and not page.error, [e.value for e in page.error]
    assert any("registered 'mini'" in shown(message.value) for message in page.success)


def _download_on_a(monkeypatch, data_a: Path, url: str, sha256: str) -> bytes:
    """The dashboard's download route, in this process configured as machine A."""
    from dashboard import auth, downloads

    monkeypatch.setenv("TRAINDECK_DATA", str(data_a))
    monkeypatch.setattr(auth, "session_identity", lambda: None)
    link = downloads.link_for(url, "job-export.pkl", sha256)
    with TestClient(Starlette(routes=downloads.routes())) as client:
        response = client.get(link)
    assert response.status_code == 200, response.text
    expected = hashlib.sha256(response.content).digest()
    assert response.headers["repr-digest"] == f"sha-256=:{_b64(expected)}:"
    return response.content


def _b64(raw: bytes) -> str:
    import base64

    return base64.b64encode(raw).decode("ascii")


def _predict(data: Path, hide: list[Path], job_id: int, image: Path) -> list:
    answer = _traindeck(data, hide, "worker", "predict", "--job", str(job_id), str(image), "--json")
    predictions = json.loads(answer.stdout)["predictions"]
    return [
        (Path(p["image"]).name, [(t["class"], round(t["probability"], 4)) for t in p["top"]])
        for p in predictions
    ]


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("where", ["bucket", "one machine"])
def test_a_preempted_worker_s_job_resumes_on_another_from_the_store(
    engine, database_url, tmp_path, monkeypatch, request, where
):
    if where == "bucket":
        request.getfixturevalue("gcs")
        if not _unshare_works():
            pytest.skip("needs root for unshare -m and tmpfs mounts")
        data = {name: tmp_path / name for name in "ABC"}
    else:
        data = dict.fromkeys("ABC", tmp_path / "one")
    for folder in data.values():
        folder.mkdir(exist_ok=True)
    hidden = {
        machine: [folder for other, folder in data.items() if other != machine]
        if where == "bucket"
        else []
        for machine in data
    }

    # On A: a zip dataset uploaded through the Datasets page, and a job on it.
    images = digits_subset(tmp_path / "source", per_class=20)
    archive = zip_folder(images, tmp_path / "mini.zip")  # the page names it by the zip
    _upload_on_a(monkeypatch, data["A"], archive)
    job_id = queue.submit(engine, {**JOB, "dataset": "mini", "epochs": EPOCHS, "name": "split"})

    # B trains until its second checkpoint is in the store, then its VM is taken back.
    armed = f"{failpoints.CHECKPOINT_UPLOADED}@2"
    worker_b = _start_worker(data["B"], hidden["B"], TRAINDECK_FAILPOINTS=armed)
    job_b = wait_for(lambda: child_pids(worker_b.pid), 300, "B's job process")[0]
    wait_until_stopped_at(job_b, armed, lambda: output_tail(worker_b))
    # Its second upload: epoch 2's, or epoch 3's when that one came before epoch 2's upload had
    # begun (the uploader sends only the newest waiting checkpoint). The pointer says which.
    pointer = store.read_json(store.checkpoint_pointer_key(job_id)) if where == "bucket" else None
    os.killpg(worker_b.pid, signal.SIGKILL)
    os.kill(job_b, signal.SIGKILL)
    worker_b.wait()
    if where == "bucket":
        shutil.rmtree(data["B"])
        data["B"].mkdir()  # an empty folder, for the other machines to hide

    # C finds the job abandoned, claims it and resumes from the newest checkpoint.
    worker_c = _start_worker(data["C"], hidden["C"])
    try:
        worker_c.wait(timeout=600)
    finally:
        if worker_c.poll() is None:
            os.killpg(worker_c.pid, signal.SIGKILL)
    log = output_tail(worker_c)
    job = queue.get_job(engine, job_id)
    assert job.status == "succeeded", f"{job.error}\n{log}"
    messages = [event.message for event in telemetry.events_since(engine, job_id)]
    resumed = [m for m in messages if m.startswith("resumed from the checkpoint after epoch")]
    assert resumed, messages
    if where == "bucket":
        # B's folder is gone: the checkpoint the bucket's pointer named when B was killed.
        assert pointer is not None
        assert resumed[0].startswith(
            f"resumed from the checkpoint after epoch {pointer['epoch'] + 1} "
        )
        assert "from gs://traindeck-test/td/jobs/" in resumed[0]
    steps = [step for step, _ in metric_series(engine, job_id, "batch/train_loss")]
    assert steps == list(range(EPOCHS * STEPS_PER_EPOCH)), "a batch point was lost"
    assert count_metric_duplicates(engine, job_id) == 0

    export = get_artifact(engine, job_id, "export")
    assert export.path.startswith(store.store_url() if where == "bucket" else "file://")
    body = _download_on_a(monkeypatch, data["A"], export.path, export.sha256)
    assert hashlib.sha256(body).hexdigest() == export.sha256 and len(body) == export.bytes

    seven = next((images / "7").glob("*.png"))
    image = data["A"] / "seven.png"
    shutil.copy(seven, image)
    on_a = _predict(data["A"], hidden["A"], job_id, image)
    shutil.copy(seven, data["C"] / "seven.png")
    on_c = _predict(data["C"], hidden["C"], job_id, data["C"] / "seven.png")
    assert on_a == on_c

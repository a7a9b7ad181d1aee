"""One real digits job, trained once for every results test by `python -m worker --once`.

resnet18 from scratch, 16-pixel images, 2 epochs at lr 1e-2: about 90% validation accuracy
in well under a minute on a CPU. Tests that need an export that is not the recorded one copy
this job's export to a job of their own (`job_with_copied_export`), never touching it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from db import queue
from db.engine import create_db_engine
from db.migrate import upgrade
from tests.support.trained import (
    DIGITS_SPEC,
    REPO,
    WORKER_TIMEOUT_S,
    TrainedJob,
)


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainedJob]:
    data_dir = tmp_path_factory.mktemp("results") / "data"
    data_dir.mkdir()
    url = f"sqlite:///{data_dir / 'traindeck.db'}"
    engine = create_db_engine(url)
    upgrade(engine)
    job_id = queue.submit(engine, DIGITS_SPEC)
    job = TrainedJob(engine, url, data_dir, job_id)
    worker = subprocess.run(
        [sys.executable, "-m", "worker", "--once", "--device", "cpu"],
        cwd=REPO,
        env=job.env(),
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT_S,
    )
    assert worker.returncode == 0, worker.stderr[-3000:]
    finished = queue.get_job(engine, job_id)
    assert finished.status == "succeeded", finished.error
    yield job
    engine.dispose()

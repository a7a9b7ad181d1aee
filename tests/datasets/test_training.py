"""Each dataset layout trains end to end: one real worker (`python -m worker`) on the CPU
runs tiny jobs (resnet18 from scratch, 1 epoch, 16-pixel images) that between them cover
every layout (folder per class, train/valid folders, Pets file names, CSV) and every kind
(folder, upload, url), plus a `url` job on a worker that cannot reach the URL.

The image sets are written here; the archives come from a server on 127.0.0.1, allowed as an
internal mirror (TRAINDECK_URL_ALLOW). One worker process runs every job, so the suite pays for
its start once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datasets.labelling import PETS_LABEL_REGEX
from datasets.register import register_folder, register_url, register_zip
from db import queue
from db.datasets import get_dataset
from db.engine import create_db_engine, dispose_engines
from db.migrate import upgrade
from tests.support.archive_server import ArchiveServer, closed_port, make_tgz
from tests.support.images import (
    make_csv_dataset,
    make_folder_dataset,
    make_pets_dataset,
    make_split_dataset,
    write_corrupt_png,
    zip_folder,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
JOB_SPEC = {"arch": "resnet18", "pretrained": False, "epochs": 1, "img_size": 16, "bs": 16}
WORKER_TIMEOUT_S = 900
# bs 16 and the last partial batch dropped: every set holds more than 16 training images.
PER_CLASS = 12


def _register_layouts(engine, data_dir: Path, scratch: Path, server: ArchiveServer) -> dict:
    """Every layout and every kind of dataset, in as few jobs as cover them all.

    Returns a description → dataset name.
    """
    mixed = make_folder_dataset(data_dir / "mixed", per_class=PER_CLASS, modes=("L", "RGBA", "P"))
    write_corrupt_png(mixed / "cat" / "broken.png")
    register_folder(engine, "mixed", mixed)

    register_folder(engine, "split", make_split_dataset(data_dir / "split", ("a", "b"), 10, 3))

    pets = make_pets_dataset(scratch / "pets-src" / "oxford-iiit-pet", per_breed=9)
    register_zip(engine, "pets", zip_folder(pets.parent, scratch / "pets.zip"), PETS_LABEL_REGEX)

    listed = make_csv_dataset(scratch / "csv-src", per_class=PER_CLASS, with_split=True).parent
    make_tgz(listed, server.folder / "listed.tgz", "listed")
    register_url(engine, "remote", server.url("listed.tgz"))

    register_url(engine, "offline", f"http://127.0.0.1:{closed_port()}/offline.tgz")
    return {
        "folder per class (grayscale, RGBA, palette and a corrupt PNG)": "mixed",
        "train/ and valid/ folders": "split",
        "Pets file names, uploaded as a zip": "pets",
        "CSV with is_valid, fetched from a URL": "remote",
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Register every layout, queue a job on each, run one worker until all are done."""
    base = tmp_path_factory.mktemp("training")
    data_dir = base / "data"
    data_dir.mkdir()
    url = f"sqlite:///{data_dir / 'traindeck.db'}"
    served = base / "served"
    served.mkdir()
    server = ArchiveServer(served)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAINDECK_DATA", str(data_dir))
        patch.setenv("DATABASE_URL", url)
        # The archive server is on 127.0.0.1, as an internal mirror would be on its network.
        patch.setenv("TRAINDECK_URL_ALLOW", "127.0.0.1")
        engine = create_db_engine(url)
        upgrade(engine)
        layouts = _register_layouts(engine, data_dir, base, server)
        jobs = {
            layout: queue.submit(engine, {**JOB_SPEC, "dataset": name})
            for layout, name in layouts.items()
        }
        offline_job = queue.submit(engine, {**JOB_SPEC, "dataset": "offline", "max_attempts": 1})
        env = {**os.environ, "PYTHONPATH": str(REPO), "PJRT_DEVICE": "CPU"}
        worker = subprocess.run(
            [sys.executable, "-m", "worker", "--device", "cpu", "--max-jobs", str(len(jobs) + 1)],
            cwd=base,
            env=env,
            capture_output=True,
            text=True,
            timeout=WORKER_TIMEOUT_S,
        )
        yield {
            "engine": engine,
            "jobs": {layout: queue.get_job(engine, job) for layout, job in jobs.items()},
            "offline": queue.get_job(engine, offline_job),
            "worker_log": worker.stderr[-6000:],
            "server": server,
        }
        engine.dispose()
        dispose_engines()
    server.close()


def test_each_layout_trains_end_to_end(trained: dict[str, Any]) -> None:
    outcome = {layout: (job.status, job.error) for layout, job in trained["jobs"].items()}
    expected = {layout: ("succeeded", None) for layout in trained["jobs"]}
    assert outcome == expected, trained["worker_log"]


def test_what_the_registry_learned_about_each_set(
    trained: dict[str, Any],
) -> None:
    engine = trained["engine"]
    assert get_dataset(engine, "mixed").bad_files == ["cat/broken.png"]
    assert get_dataset(engine, "pets").class_counts == {
        "Abyssinian": 9,
        "american_bulldog": 9,
        "great_pyrenees": 9,
    }
    remote = get_dataset(engine, "remote")
    assert remote.class_counts == {"cat": PER_CLASS, "dog": PER_CLASS}
    assert remote.label_rule["detected"] == {"type": "csv", "file": "labels.csv"}
    assert trained["server"].requests == ["/listed.tgz"]


def test_an_offline_worker_fails_the_job_with_a_clear_message(trained: dict[str, Any]) -> None:
    job = trained["offline"]
    assert job.status == "failed", trained["worker_log"]
    assert "could not download dataset 'offline' from http://127.0.0.1:" in job.error
    assert "Is this worker offline?" in job.error
    assert "Traceback" not in job.error

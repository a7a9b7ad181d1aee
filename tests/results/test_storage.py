"""The `results` table and the verified reading of recorded files, on SQLite and Postgres."""

from __future__ import annotations

import hashlib

import pytest

from common.files import job_dir
from db import queue
from db.exports import ArtifactTampered, ArtifactUnavailable, read_verified, recorded_artifact
from db.results import get_results, save_results
from tests.support.artifacts import record_local_file

CLASSES = ["cat", "dog", "fox"]
CONFUSION = [[5, 1, 0], [0, 4, 2], [0, 0, 3]]


def _finished_job(engine, status: str = "succeeded") -> int:
    job_id = queue.submit(engine, {"name": "finished"})
    claimed = queue.claim(engine, "test-worker")
    assert claimed is not None and claimed.id == job_id
    assert queue.finish(engine, claimed.lease, status)
    return job_id


def _results(**changes):
    values = {
        "classes": CLASSES,
        "confusion": CONFUSION,
        "per_class": [
            {"class": name, "precision": 1.0, "recall": 1.0, "support": 1} for name in CLASSES
        ],
        "top_losses": [
            {
                "path": "/data/dog/1.png",
                "actual": "dog",
                "predicted": "fox",
                "probability": 0.9,
                "loss": 3.2,
                "thumbnail": None,
            }
        ],
        "predictions": [["/data/cat/1.png", "cat", "cat"], ["/data/dog/1.png", "dog", "fox"]],
        "accuracy": 12 / 15,
        "valid_loss": 0.5,
    }
    return {**values, **changes}


def test_results_round_trip_and_a_second_save_replaces_the_first(engine):
    job_id = _finished_job(engine)
    assert get_results(engine, job_id) is None

    save_results(engine, job_id, **_results())
    stored = get_results(engine, job_id)
    assert stored.classes == CLASSES
    assert stored.confusion == CONFUSION
    assert stored.predictions[1] == ["/data/dog/1.png", "dog", "fox"]
    assert stored.top_losses[0]["loss"] == 3.2
    assert stored.accuracy == pytest.approx(0.8)

    save_results(engine, job_id, **_results(accuracy=0.9, valid_loss=0.25))
    again = get_results(engine, job_id)
    assert (again.accuracy, again.valid_loss) == (pytest.approx(0.9), pytest.approx(0.25))


def test_results_of_a_deleted_job_go_with_it(engine):
    job_id = _finished_job(engine)
    save_results(engine, job_id, **_results())
    queue.delete_job(engine, job_id)
    assert get_results(engine, job_id) is None


def test_a_confusion_matrix_that_does_not_match_the_classes_is_refused(engine):
    job_id = _finished_job(engine)
    with pytest.raises(ValueError, match="must be 3×3"):
        save_results(engine, job_id, **_results(confusion=[[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match="one row per class"):
        save_results(engine, job_id, **_results(per_class=[]))
    assert get_results(engine, job_id) is None


def test_a_recorded_file_is_read_only_as_the_bytes_that_were_recorded(engine, data_dir):
    job_id = _finished_job(engine)
    folder = job_dir(job_id)
    folder.mkdir(parents=True)
    export = folder / "export.pkl"
    content = b"pretend pickle " * 1000
    export.write_bytes(content)
    record_local_file(engine, job_id, "export", export)

    artifact = recorded_artifact(engine, job_id, "export")
    assert artifact.sha256 == hashlib.sha256(content).hexdigest()
    assert read_verified(artifact) == content

    tampered = bytearray(content)
    tampered[100] ^= 0x01
    export.write_bytes(bytes(tampered))
    with pytest.raises(ArtifactTampered, match="not the file the worker recorded") as refused:
        read_verified(artifact)
    assert "a changed one could run any code" in str(refused.value)

    export.unlink()
    with pytest.raises(ArtifactUnavailable, match="is not on this machine any more"):
        read_verified(artifact)


def test_jobs_without_an_export_say_why(engine):
    with pytest.raises(ArtifactUnavailable, match="there is no job #4242"):
        recorded_artifact(engine, 4242)

    queued = queue.submit(engine, {"name": "waiting"})
    with pytest.raises(ArtifactUnavailable, match="it is queued, and only a job that succeeds"):
        recorded_artifact(engine, queued)
    queue.cancel(engine, queued)

    done = _finished_job(engine)
    with pytest.raises(ArtifactUnavailable, match=f"job #{done} has no exported model recorded"):
        recorded_artifact(engine, done)
    with pytest.raises(ArtifactUnavailable, match="has no model card recorded"):
        recorded_artifact(engine, done, "model_card")

"""What the worker stored at the end of a real digits job: its results and its model card."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import fastai
import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

from common import store
from db.artifacts import get_artifact
from db.results import get_results
from db.telemetry import final_metrics
from tests.support.trained import DIGITS_SPEC, REPO

pytestmark = pytest.mark.slow

DIGITS = [str(digit) for digit in range(10)]
DIGIT_IMAGES = 1797
TOP_LOSSES = 16
# The job learned (chance is 0.1). Two epochs from scratch land anywhere from about 0.8 to 0.95
# with the CPU's thread count alone changing the sums' order (0.80 with one torch thread here).
LEARNED = 0.75


def test_stored_confusion_matrix_equals_sklearns_on_the_stored_predictions(trained):
    result = get_results(trained.engine, trained.job_id)
    assert result is not None
    assert result.classes == DIGITS
    paths, actual, predicted = zip(*result.predictions, strict=True)

    expected = confusion_matrix(actual, predicted, labels=result.classes)

    assert np.array_equal(np.array(result.confusion), expected)
    assert len(set(paths)) == len(paths) == round(DIGIT_IMAGES * 0.2)  # valid_pct 0.2
    assert all(Path(path).is_file() for path in paths)
    assert all(Path(path).parent.name == label for path, label in zip(paths, actual, strict=True))


def test_per_class_precision_and_recall_equal_sklearns(trained):
    result = get_results(trained.engine, trained.job_id)
    _, actual, predicted = zip(*result.predictions, strict=True)
    precision, recall, _, support = precision_recall_fscore_support(
        actual, predicted, labels=result.classes, zero_division=np.nan
    )
    for index, row in enumerate(result.per_class):
        assert row["class"] == result.classes[index]
        assert row["support"] == support[index]
        assert row["recall"] == pytest.approx(recall[index])
        if np.isnan(precision[index]):
            assert row["precision"] is None
        else:
            assert row["precision"] == pytest.approx(precision[index])


def test_accuracy_and_loss_are_those_of_the_last_epoch(trained):
    result = get_results(trained.engine, trained.job_id)
    confusion = np.array(result.confusion)
    assert result.accuracy == pytest.approx(np.trace(confusion) / confusion.sum())
    assert result.accuracy >= LEARNED
    last_epoch = final_metrics(trained.engine, [trained.job_id])[trained.job_id]
    assert result.accuracy == pytest.approx(last_epoch["accuracy"], abs=1e-6)
    assert result.valid_loss == pytest.approx(last_epoch["valid_loss"], rel=1e-4)


def test_top_losses_are_the_largest_with_a_picture_of_each(trained):
    result = get_results(trained.engine, trained.job_id)
    top = result.top_losses
    assert len(top) == TOP_LOSSES
    losses = [row["loss"] for row in top]
    assert losses == sorted(losses, reverse=True)
    stored = {path: (actual, predicted) for path, actual, predicted in result.predictions}
    for row in top:
        assert stored[row["path"]] == (row["actual"], row["predicted"])
        # The loss is -log p(actual class); `probability` is that of the predicted class.
        if row["actual"] == row["predicted"]:
            assert row["loss"] == pytest.approx(-np.log(row["probability"]), rel=1e-3)
        else:
            assert row["loss"] >= -np.log(1 - row["probability"] + 1e-6) - 1e-4
        image = Image.open(io.BytesIO(base64.b64decode(row["thumbnail"])))
        assert image.format == "PNG" and max(image.size) >= 48  # 8×8 digits, enlarged


def test_model_card_beside_the_export_describes_it(trained):
    card_artifact = get_artifact(trained.engine, trained.job_id, "model_card")
    export = get_artifact(trained.engine, trained.job_id, "export")
    assert card_artifact.path.rsplit("/", 1)[0] == export.path.rsplit("/", 1)[0]
    assert card_artifact.path.startswith("file://"), "recorded by its store URL"
    card_bytes = store.read_bytes(card_artifact.path)
    assert hashlib.sha256(card_bytes).hexdigest() == card_artifact.sha256
    card = json.loads(card_bytes)

    assert card["job_id"] == trained.job_id
    assert card["spec"] == {**card["spec"], **DIGITS_SPEC}
    assert card["classes"] == DIGITS
    assert card["dataset"]["name"] == "digits" and card["dataset"]["kind"] == "builtin"
    assert sum(card["dataset"]["class_counts"].values()) == DIGIT_IMAGES
    assert card["dataset"]["valid_images"] == round(DIGIT_IMAGES * 0.2)
    assert card["export"] == {"file": "export.pkl", "bytes": export.bytes, "sha256": export.sha256}
    assert hashlib.sha256(store.read_bytes(export.path)).hexdigest() == card["export"]["sha256"]
    assert card["versions"]["torch"] == torch.__version__.split("+")[0]
    assert card["versions"]["torchvision"] == torchvision.__version__.split("+")[0]
    assert card["versions"]["fastai"] == fastai.__version__
    assert "torch_xla" in card["versions"]  # installed here
    assert card["final_metrics"]["accuracy"] >= LEARNED
    assert card["validation"]["images"] == round(DIGIT_IMAGES * 0.2)
    assert card["created_at"]


LOAD_WITHOUT_WORKER = textwrap.dedent(
    """
    import sys
    from db.engine import get_engine
    from db.exports import recorded_artifact
    from inference.model import load_export
    model = load_export(recorded_artifact(get_engine(), int(sys.argv[1])))
    named = sorted(name for name in sys.modules if name.split(".")[0] in ("worker", "dashboard"))
    print(",".join(named) or "none", model.classes)
    """
)


def test_the_export_loads_without_importing_the_worker(trained):
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_WORKER, str(trained.job_id)],
        cwd=REPO,
        env=trained.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split()[0] == "none", loaded.stdout

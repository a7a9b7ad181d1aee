"""Training and predicting read images as `datasets.images.open_image` does: a set told apart only
by 16-bit values trains (PIL's convert("RGB") clipped both classes to white), and a phone
photo is predicted and shown upright. The worker's own DataLoaders and export, with a model of
one linear layer over the top and bottom halves' means, so it takes seconds."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from fastai.learner import Learner
from fastai.losses import CrossEntropyLossFlat
from fastai.metrics import accuracy
from fastai.torch_core import set_seed
from PIL import Image
from torch import nn

from datasets.labelling import detect_label_rule, scan_items
from db.spec import JobSpec
from inference.model import LoadedModel, load_model
from tests.support.images import write_array, write_sideways_jpeg
from worker.data import build_dataloaders
from worker.results import thumbnail_png
from worker.training import export_model

pytestmark = pytest.mark.slow

SIZE = 16
DARK, LIGHT = 5_000, 60_000  # both above 255: clipped, every image was plain white


def halves(dark_top: bool, rng: np.random.Generator) -> np.ndarray:
    """A 16-bit image with one dark half, top or bottom, and a little noise."""
    values = np.full((SIZE, SIZE), LIGHT, dtype=np.int64)
    rows = slice(0, SIZE // 2) if dark_top else slice(SIZE // 2, SIZE)
    values[rows] = DARK
    return (values + rng.integers(-2_000, 2_000, values.shape)).astype(np.uint16)


def write_set(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for part, count in (("train", 12), ("valid", 4)):
        for label, dark_top in (("dark-top", True), ("dark-bottom", False)):
            for n in range(count):
                write_array(root / part / label / f"{n}.png", halves(dark_top, rng))
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Learner, LoadedModel, Path]:
    root = write_set(tmp_path_factory.mktemp("deep"))
    spec = JobSpec(bs=8, img_size=SIZE, augment=False, device="cpu")
    dls = build_dataloaders(scan_items(root, detect_label_rule(root)), spec, torch.device("cpu"))
    set_seed(0)
    model = nn.Sequential(nn.AdaptiveAvgPool2d((2, 1)), nn.Flatten(), nn.Linear(6, 2))
    learn = Learner(dls, model, loss_func=CrossEntropyLossFlat(), metrics=accuracy)
    with learn.no_bar(), learn.no_logging():
        learn.fit(8, 0.1)
    export = export_model(learn, root)
    return learn, load_model(export.read_bytes(), "sha"), root


def test_a_set_told_apart_by_16_bit_values_trains_above_chance(trained) -> None:
    learn, _, _ = trained
    _, valid_accuracy = learn.validate()
    assert valid_accuracy == 1.0  # 8 validation images, 4 of each class: chance is 0.5


def test_predict_reads_16_bit_images_as_training_did(trained) -> None:
    _, model, root = trained
    for label in ("dark-top", "dark-bottom"):
        data = (root / "valid" / label / "0.png").read_bytes()
        prediction = model.predict_one(f"{label}.png", data)
        assert prediction.label == label and prediction.top[0].probability > 0.9


@pytest.mark.parametrize(("orientation", "label"), [(6, "dark-top"), (8, "dark-bottom")])
def test_predict_and_thumbnails_turn_a_phone_photo_upright(
    trained, tmp_path: Path, orientation: int, label: str
) -> None:
    _, model, _ = trained
    # Stored with a dark left half: without its EXIF orientation the halves are even.
    photo = write_sideways_jpeg(tmp_path / "phone.jpg", orientation, SIZE)

    prediction = model.predict_one(photo.name, photo.read_bytes())

    assert prediction.label == label and prediction.top[0].probability > 0.9
    thumbnail = Image.open(io.BytesIO(base64.b64decode(thumbnail_png(str(photo)))))
    pixels = np.asarray(thumbnail.convert("L"), dtype=float)
    top, bottom = pixels[: len(pixels) // 2].mean(), pixels[len(pixels) // 2 :].mean()
    assert (bottom - top if label == "dark-top" else top - bottom) > 100

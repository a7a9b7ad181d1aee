"""A job's exported model, loaded from verified bytes, and predictions with it.

`load_export` takes the bytes `db.exports.read_verified` hands out (hashed and checked against
the SHA-256 the worker recorded) and unpickles those same bytes, never the file again.
"""

from __future__ import annotations

import io
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from fastai.learner import Learner, load_learner
from fastai.vision.core import PILImage
from PIL import Image, UnidentifiedImageError

from common.errors import error_summary, first_line
from datasets.images import open_image
from db.exports import read_verified
from db.models import Artifact

DEFAULT_TOP_K = 3


class ModelLoadError(ValueError):
    """The verified export could not be turned back into a model."""


class ImageError(ValueError):
    """An uploaded or named file is not an image the model can read."""


@dataclass(frozen=True)
class ClassScore:
    label: str
    probability: float


@dataclass(frozen=True)
class Prediction:
    """The top classes for one image, best first; or, for a file that is no image, `error`."""

    name: str
    top: list[ClassScore] = field(default_factory=list)
    latency_s: float = 0.0
    error: str | None = None

    @property
    def label(self) -> str | None:
        return self.top[0].label if self.top else None


def decode_image(name: str, data: bytes) -> PILImage:
    """The image in `data` as fastai wants it (read as training read it: upright, 8-bit RGB),
    or ImageError naming the problem."""
    if not data:
        raise ImageError(f"{name}: the file is empty")
    try:
        return PILImage.create(open_image(data))
    except UnidentifiedImageError:
        raise ImageError(f"{name}: not an image (no image format recognises it)") from None
    except Image.DecompressionBombError as exc:
        raise ImageError(f"{name}: the image is too large to open ({exc})") from None
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError… for broken files
        detail = first_line(exc)
        raise ImageError(f"{name}: the image is damaged and cannot be decoded ({detail})") from None


class LoadedModel:
    """An exported Learner on the CPU. `predict` may be called from several threads."""

    def __init__(self, learn: Learner, sha256: str) -> None:
        self.learn = learn
        self.sha256 = sha256
        # Learner.predict swaps the learner's current DataLoader: one prediction at a time.
        self._lock = threading.Lock()

    @property
    def classes(self) -> list[str]:
        return [str(label) for label in self.learn.dls.vocab]

    def predict_one(self, name: str, data: bytes, top_k: int = DEFAULT_TOP_K) -> Prediction:
        started = time.perf_counter()
        try:
            image = decode_image(name, data)
        except ImageError as exc:
            return Prediction(name, error=str(exc))
        with self._lock, torch.inference_mode():
            _, _, probabilities = self.learn.predict(image)
        k = max(1, min(top_k, len(probabilities)))
        values, indices = probabilities.topk(k)
        classes = self.classes
        top = [
            ClassScore(classes[index], float(value))
            for value, index in zip(values.tolist(), indices.tolist(), strict=True)
        ]
        return Prediction(name, top, time.perf_counter() - started)

    def predict(
        self, images: Sequence[tuple[str, bytes]], top_k: int = DEFAULT_TOP_K
    ) -> list[Prediction]:
        """One Prediction per (name, bytes), in order; latency is decode + model, per image."""
        return [self.predict_one(name, data, top_k) for name, data in images]


def load_model(data: bytes, sha256: str) -> LoadedModel:
    """Unpickle an export from bytes that `db.exports.read_verified` has checked."""
    try:
        with warnings.catch_warnings():
            # fastai warns that load_learner unpickles; these bytes are the recorded ones.
            warnings.simplefilter("ignore")
            learn = load_learner(io.BytesIO(data), cpu=True)
    except Exception as exc:
        raise ModelLoadError(
            f"the export could not be loaded as a fastai model ({error_summary(exc)})"
        ) from None
    if not isinstance(learn, Learner):
        raise ModelLoadError(f"the export holds a {type(learn).__name__}, not a fastai Learner")
    learn.model.eval()
    return LoadedModel(learn, sha256)


def load_export(artifact: Artifact) -> LoadedModel:
    """The job's exported model, if the file is the one the worker recorded (else refused)."""
    return load_model(read_verified(artifact), artifact.sha256)

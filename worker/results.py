"""What the trained model does on the validation set, computed once at the end of training,
and the model card written beside the export.

`training.run` calls `record_results` after the export: the Learner is then on the CPU with
only fastai's own callbacks, so one plain `get_preds` pass over the validation set gives the
probabilities, targets and per-image losses (the XLA device is not involved). fastai's
ClassificationInterpretation ranks the top losses; the confusion matrix is counted the way
its `confusion_matrix` does, from the same pass rather than a second one.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import platform
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from fastai.callback.core import Callback
from fastai.interpret import ClassificationInterpretation
from fastai.learner import Learner, Recorder
from PIL import Image

from common import store
from common.files import replace_atomically
from datasets.images import open_image
from db.artifacts import get_artifact
from db.datasets import get_dataset
from db.models import utcnow
from db.results import save_results
from db.telemetry import final_metrics
from worker.outputs import publish
from worker.skipped import skipped_files

if TYPE_CHECKING:
    from worker.training import TrainingContext

log = logging.getLogger(__name__)

TOP_LOSSES = 16
THUMBNAIL_PX = 96
# Tiny images (the digits are 8×8) are enlarged to this, pixels kept square, so they show.
MIN_THUMBNAIL_PX = 48
MODEL_CARD_NAME = "model_card.json"
WRITER_FLUSH_TIMEOUT_S = 60.0
VERSIONED_PACKAGES = ("torch", "torchvision", "fastai", "torch_xla")


class InterpretationStopped(Exception):
    """The supervisor asked the job to stop while the validation set was being interpreted."""


class _StopCheck(Callback):
    """Stops the prediction pass between batches when the job is asked to stop."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def before_batch(self) -> None:
        if self.stop.is_set():
            raise InterpretationStopped()


@dataclass(frozen=True)
class Interpretation:
    classes: list[str]
    confusion: list[list[int]]
    per_class: list[dict[str, Any]]
    top_losses: list[dict[str, Any]]
    predictions: list[list[str]]
    accuracy: float
    valid_loss: float


# --- interpretation -------------------------------------------------------------------------


def confusion_matrix(targets: torch.Tensor, decoded: torch.Tensor, classes: int) -> torch.Tensor:
    """Rows: the actual class; columns: the predicted class (as fastai and sklearn count it)."""
    labels = torch.arange(classes)
    return ((decoded == labels[:, None]) & (targets == labels[:, None, None])).long().sum(2)


def per_class_scores(classes: list[str], confusion: list[list[int]]) -> list[dict[str, Any]]:
    """Precision, recall and support of each class; None where a class was never predicted
    (precision) or never present (recall)."""
    rows = []
    for index, name in enumerate(classes):
        hits = confusion[index][index]
        support = sum(confusion[index])
        predicted = sum(row[index] for row in confusion)
        rows.append(
            {
                "class": name,
                "precision": hits / predicted if predicted else None,
                "recall": hits / support if support else None,
                "support": support,
            }
        )
    return rows


def _item_path(item: Any) -> str:
    """Validation items are (path, label) pairs (`worker.data`); a bare path is accepted too."""
    return str(item[0] if isinstance(item, (tuple, list)) else item)


def thumbnail_png(path: str) -> str | None:
    """A small PNG of the image, base64-encoded, or None if the file cannot be read now."""
    try:
        image = open_image(path)
    except Exception as exc:  # a file removed or damaged since training: show no picture
        log.warning("no thumbnail for %s: %s", path, exc)
        return None
    image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
    if max(image.size) < MIN_THUMBNAIL_PX:
        factor = -(-MIN_THUMBNAIL_PX // max(image.size))
        image = image.resize((image.width * factor, image.height * factor), Image.NEAREST)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def interpret(learn: Learner, stop: threading.Event) -> Interpretation | None:
    """Predict every validation image once; None when there is no validation set."""
    dl = learn.dls.valid.new(shuffle=False, drop_last=False)
    if len(dl.dataset) == 0:
        log.warning("no validation images: no confusion matrix or top losses for this job")
        return None
    log.info("interpreting the model on %d validation images", len(dl.dataset))
    # Without the Recorder: its metrics are not wanted here, and fastai's top_k_accuracy fails
    # on the fastai tensor subclasses (TensorImage predictions, TensorCategory targets) that a
    # get_preds pass hands it.
    recorders = [cb for cb in learn.cbs if isinstance(cb, Recorder)]
    with learn.removed_cbs(recorders):
        probabilities, targets, losses = (
            tensor.as_subclass(torch.Tensor)
            # Not reordered: unshuffled, the batches come in the items' order, less any file
            # skipped because it no longer decodes (fastai's reordering assumes none is).
            for tensor in learn.get_preds(
                dl=dl, with_loss=True, reorder=False, cbs=[_StopCheck(stop)]
            )
        )
    decoded = probabilities.argmax(dim=1)
    interpretation = ClassificationInterpretation(learn, dl, losses)
    classes = [str(label) for label in interpretation.vocab]
    confusion = confusion_matrix(targets, decoded, len(classes)).tolist()
    # A file skipped because it no longer decodes (`worker.skipped`) has no prediction.
    skipped = skipped_files(dl)
    items = [item for item in dl.items if _item_path(item) not in skipped]
    predictions = [
        [_item_path(item), classes[actual], classes[predicted]]
        for item, actual, predicted in zip(items, targets.tolist(), decoded.tolist(), strict=True)
    ]
    top_values, top_indices = interpretation.top_losses(min(TOP_LOSSES, len(items)))
    top_losses = []
    for loss, index in zip(top_values.tolist(), top_indices.tolist(), strict=True):
        path, actual, predicted = predictions[index]
        top_losses.append(
            {
                "path": path,
                "actual": actual,
                "predicted": predicted,
                "probability": float(probabilities[index, decoded[index]]),
                "loss": loss,
                "thumbnail": thumbnail_png(path),
            }
        )
    return Interpretation(
        classes=classes,
        confusion=confusion,
        per_class=per_class_scores(classes, confusion),
        top_losses=top_losses,
        predictions=predictions,
        accuracy=float((decoded == targets).float().mean()),
        valid_loss=float(losses.mean()),
    )


# --- the model card -------------------------------------------------------------------------


def package_versions() -> dict[str, str]:
    """Versions of the stack the model was trained with (torch_xla only where installed)."""
    versions = {"python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _class_counts(items: Any, vocab: list[str]) -> dict[str, int]:
    counts = dict.fromkeys(vocab, 0)
    for item in items:
        if isinstance(item, (tuple, list)) and len(item) > 1:
            label = str(item[1])
            counts[label] = counts.get(label, 0) + 1
    return counts


def model_card(
    ctx: TrainingContext, learn: Learner, interpretation: Interpretation | None
) -> dict[str, Any]:
    """Everything needed to know what the export is: spec, data, metrics, stack, checksum."""
    job_id = ctx.lease.job_id
    export = ctx.db(lambda: get_artifact(ctx.engine, job_id, "export"), "read the export")
    if export is None:
        raise RuntimeError(f"job {job_id}: the export must be recorded before its model card")
    registered = ctx.db(lambda: get_dataset(ctx.engine, ctx.spec.dataset), "read the dataset")
    classes = [str(label) for label in learn.dls.vocab]
    train_counts = _class_counts(learn.dls.train.items, classes)
    valid_counts = _class_counts(learn.dls.valid.items, classes)
    if not ctx.writer.flush(WRITER_FLUSH_TIMEOUT_S):
        log.warning("the last metrics were not yet written; the model card may lack some")
    metrics = ctx.db(lambda: final_metrics(ctx.engine, [job_id])[job_id], "read the final metrics")
    card: dict[str, Any] = {
        "job_id": job_id,
        "name": ctx.spec.display_name,
        "created_at": utcnow().isoformat(),
        "spec": ctx.spec.model_dump(mode="json"),
        "dataset": {
            "name": ctx.spec.dataset,
            "kind": registered.kind if registered is not None else "builtin",
            "classes": classes,
            "class_counts": {name: train_counts[name] + valid_counts[name] for name in classes},
            "train_images": len(learn.dls.train.items),
            "valid_images": len(learn.dls.valid.items),
        },
        "classes": classes,
        "final_metrics": metrics,
        # The epoch (1-based) whose model was exported: the last, or the best by monitor.
        "kept_epoch": {
            "epoch": ctx.kept_epoch + 1 if ctx.kept_epoch is not None else None,
            "keep": ctx.spec.keep,
            "monitor": ctx.spec.monitor,
        },
        "versions": package_versions(),
        "export": {
            "file": store.display_name(export.path),
            "bytes": export.bytes,
            "sha256": export.sha256,
        },
    }
    if interpretation is not None:
        card["validation"] = {
            "accuracy": interpretation.accuracy,
            "valid_loss": interpretation.valid_loss,
            "images": len(interpretation.predictions),
        }
    return card


def write_model_card(card: dict[str, Any], job_dir: Path) -> Path:
    final = job_dir / MODEL_CARD_NAME
    temporary = job_dir / f".{MODEL_CARD_NAME}.{os.getpid()}.tmp"
    try:
        temporary.write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
        replace_atomically(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)
    return final


# --- the one call from training.run ---------------------------------------------------------


def record_results(ctx: TrainingContext, learn: Learner) -> None:
    """Interpret the exported model on the validation set, store that, write the model card.

    A failure to interpret leaves the job and its export as they are and says why in the job's
    log; a stop request ends this early with nothing stored (the caller then stops).
    """
    try:
        interpretation = interpret(learn, ctx.stop)
    except InterpretationStopped:
        log.info("stopped while interpreting the model; no results stored")
        return
    except Exception:
        log.exception("could not interpret the model on the validation set (the export is fine)")
        interpretation = None
    if interpretation is not None:
        ctx.db(
            lambda: save_results(
                ctx.engine,
                ctx.lease.job_id,
                classes=interpretation.classes,
                confusion=interpretation.confusion,
                per_class=interpretation.per_class,
                top_losses=interpretation.top_losses,
                predictions=interpretation.predictions,
                accuracy=interpretation.accuracy,
                valid_loss=interpretation.valid_loss,
            ),
            "store the results",
        )
        log.info(
            "validation: accuracy %.4f on %d images; results stored",
            interpretation.accuracy,
            len(interpretation.predictions),
        )
    card = write_model_card(model_card(ctx, learn, interpretation), ctx.job_dir)
    publish(ctx, "model_card", card)

"""Results of a finished job: how its model does on the validation set, a predict box for new
images, and the model card.

The worker computed the results once, at the end of training (`db.results`); this view only
reads them. For predictions the exported model is loaded only from bytes whose SHA-256 is the
one recorded when the worker wrote it (`db.exports`), once per version of the file, and shared
by every session (`st.cache_resource`).
"""

from __future__ import annotations

import base64
import csv
import io
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from common import store
from dashboard.format import chart_text, plain
from datasets.images import open_image
from db.engine import Engine
from db.exports import ArtifactUnavailable, gone_message, read_verified, recorded_artifact
from db.models import Artifact, Result
from db.queue import JobNotFound, get_job
from db.results import get_results, prediction_count, prediction_page

if TYPE_CHECKING:
    from inference.model import LoadedModel, Prediction

TOP_LOSS_COLUMNS = 8
THUMBNAIL_WIDTH = 96
UPLOAD_PREVIEW_WIDTH = 96
MOST_CONFUSED_SHOWN = 10
# Beyond this many classes the heatmap's cells are too small for their numbers.
MAX_CLASSES_WITH_CELL_TEXT = 30
MAX_TOP_K = 10
DEFAULT_TOP_K = 3
CACHED_MODELS = 4
PREDICTIONS_PAGE = 100


# --- figures and tables ---------------------------------------------------------------------


def confusion_figure(
    classes: list[str], confusion: list[list[int]], share_of_actual: bool = False
) -> go.Figure:
    """Rows: the actual class, columns: the predicted one; optionally each row as shares."""
    classes = [chart_text(name) for name in classes]  # plotly renders some HTML in labels
    counts = np.array(confusion, dtype=float)
    values = counts
    if share_of_actual:
        totals = counts.sum(axis=1, keepdims=True)
        values = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    text = [
        [f"{value:.0%}" if share_of_actual else f"{value:.0f}" for value in row] for row in values
    ]
    figure = go.Figure(
        go.Heatmap(
            z=values,
            x=classes,
            y=classes,
            text=text,
            texttemplate="%{text}" if len(classes) <= MAX_CLASSES_WITH_CELL_TEXT else None,
            customdata=counts,
            hovertemplate="actual %{y}<br>predicted %{x}<br>%{customdata:.0f} images"
            "<extra></extra>",
            colorscale="Blues",
            showscale=False,
        )
    )
    side = min(900, 260 + 28 * len(classes))
    figure.update_layout(
        title="Confusion matrix" + (" (share of each actual class)" if share_of_actual else ""),
        height=side,
        margin={"l": 60, "r": 20, "t": 50, "b": 60},
    )
    # Category axes: class names such as "0" … "9" must not become numbers.
    figure.update_xaxes(title="predicted", type="category", side="bottom")
    figure.update_yaxes(title="actual", type="category", autorange="reversed")
    return figure


def per_class_frame(per_class: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "class": [row["class"] for row in per_class],
            "precision": [row["precision"] for row in per_class],
            "recall": [row["recall"] for row in per_class],
            "support": [row["support"] for row in per_class],
        }
    )


def most_confused(
    classes: list[str], confusion: list[list[int]], limit: int = MOST_CONFUSED_SHOWN
) -> list[tuple[str, str, int]]:
    """(actual, predicted, images) of the largest mistakes, largest first."""
    mistakes = [
        (classes[actual], classes[predicted], count)
        for actual, row in enumerate(confusion)
        for predicted, count in enumerate(row)
        if actual != predicted and count > 0
    ]
    return sorted(mistakes, key=lambda mistake: -mistake[2])[:limit]


# A cell starting with one of these is a formula to a spreadsheet (CSV injection): `=HYPERLINK(…)`
# in a file name or a class name would run when the file is opened.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> str:
    """`value` as a CSV cell a spreadsheet shows as text: a formula start gets a `'` before it."""
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def predictions_csv(predictions: list[list[str]]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["path", "actual", "predicted"])
    writer.writerows([csv_cell(cell) for cell in row] for row in predictions)
    return buffer.getvalue().encode("utf-8")


# --- the model, for predictions -------------------------------------------------------------


@st.cache_resource(max_entries=CACHED_MODELS, show_spinner="Loading the exported model…")
def _cached_model(path: str, sha256: str, version: str, _artifact: Artifact) -> LoadedModel:
    """Keyed by the object's URL, recorded hash and version (size and generation or time): a
    changed object makes a new key, so it is read and checked again (and refused) rather than
    served from memory."""
    # fastai takes seconds to import; only a prediction needs it.
    from inference.model import load_export

    return load_export(_artifact)


def load_model(artifact: Artifact) -> LoadedModel:
    """The job's exported model, verified against its recorded SHA-256, cached for everyone."""
    try:
        version = store.version(artifact.path)
    except FileNotFoundError:
        raise ArtifactUnavailable(gone_message(artifact)) from None
    except store.StoreError as exc:
        raise ArtifactUnavailable(str(exc)) from None
    return _cached_model(artifact.path, artifact.sha256, version, artifact)


def predict_uploads(
    engine: Engine, job_id: int, uploads: Sequence[tuple[str, bytes]], top_k: int = DEFAULT_TOP_K
) -> list[Prediction]:
    """One Prediction per (file name, bytes); a file that is no image gets `error` set.

    Raises ArtifactUnavailable (no export, not on this machine, or not the recorded file) and
    ModelLoadError, each with a message for the person.
    """
    model = load_model(recorded_artifact(engine, job_id, "export"))
    return model.predict(uploads, top_k)


# --- the view -------------------------------------------------------------------------------


def render_results(engine: Engine, job_id: int) -> None:
    """The Results tab of the job page."""
    try:
        job = get_job(engine, job_id)
    except JobNotFound:
        st.warning(f"There is no job #{job_id}.")
        return
    if job.status != "succeeded":
        st.info(
            "Results appear when the job has succeeded: at the end of training the worker "
            "runs the model once over the validation set and stores what it finds."
        )
        return
    # Without the predictions (one row per validation image): they are read a page at a time.
    result = get_results(engine, job_id, predictions=False)
    if result is None:
        st.info(
            "No results were stored for this job: it finished before the worker computed "
            "them, or computing them failed (its log says why)."
        )
    else:
        show_interpretation(engine, result)
    st.subheader("Predict")
    predict_box(engine, job_id, result.classes if result is not None else None)
    st.subheader("Model card")
    model_card_box(engine, job_id)


def show_interpretation(engine: Engine, result: Result) -> None:
    images = prediction_count(engine, result.job_id)
    columns = st.columns(3)
    columns[0].metric("Validation accuracy", f"{result.accuracy:.2%}")
    columns[1].metric("Validation loss", f"{result.valid_loss:.4f}")
    columns[2].metric("Validation images", f"{images:,}")
    share = st.toggle(
        "Show each actual class as shares",
        key=f"results.{result.job_id}.share",
        help="Each row of the matrix divided by its total: the diagonal is then the recall.",
    )
    left, right = st.columns([3, 2])
    left.plotly_chart(
        confusion_figure(result.classes, result.confusion, share),
        key=f"results.{result.job_id}.confusion",
    )
    with right:
        st.markdown("**Per class**")
        st.dataframe(
            per_class_frame(result.per_class),
            hide_index=True,
            width="stretch",
            column_config={
                "precision": st.column_config.NumberColumn(format="%.3f"),
                "recall": st.column_config.NumberColumn(format="%.3f"),
            },
        )
        mistakes = most_confused(result.classes, result.confusion)
        if mistakes:
            st.markdown("**Most confused** (actual → predicted)")
            st.markdown(
                "\n".join(
                    f"- {plain(actual)} → {plain(predicted)}: {n}"
                    for actual, predicted, n in mistakes
                )
            )
        job_id = result.job_id
        st.download_button(
            "Validation predictions (CSV)",
            # Made when the button is clicked, not at every render of the tab.
            lambda: predictions_csv(_all_predictions(engine, job_id)),
            file_name=f"job{result.job_id}-predictions.csv",
            mime="text/csv",
            icon=":material/download:",
            key=f"results.{result.job_id}.predictions_csv",
        )
    show_top_losses(result)
    show_predictions(engine, result.job_id, images)


def _all_predictions(engine: Engine, job_id: int) -> list[list[str]]:
    result = get_results(engine, job_id)
    return result.predictions if result is not None else []


def show_predictions(engine: Engine, job_id: int, images: int) -> None:
    """Every validation prediction, a page at a time (only that page is read)."""
    if not images:
        return
    pages = -(-images // PREDICTIONS_PAGE)
    st.markdown("**Validation predictions**")
    page = st.number_input(
        f"Page (of {pages:,})", 1, pages, 1, key=f"results.{job_id}.predictions_page"
    )
    offset = (int(page) - 1) * PREDICTIONS_PAGE
    rows = prediction_page(engine, job_id, offset, PREDICTIONS_PAGE)
    st.caption(f"images {offset + 1:,}–{offset + len(rows):,} of {images:,}")
    st.dataframe(
        pd.DataFrame(rows, columns=["path", "actual", "predicted"]),
        hide_index=True,
        width="stretch",
    )


def show_top_losses(result: Result) -> None:
    st.markdown(
        f"**Top losses** · the {len(result.top_losses)} validation images it got most wrong"
    )
    if not result.top_losses:
        st.caption("None.")
        return
    for start in range(0, len(result.top_losses), TOP_LOSS_COLUMNS):
        row = result.top_losses[start : start + TOP_LOSS_COLUMNS]
        for column, loss in zip(st.columns(TOP_LOSS_COLUMNS), row, strict=False):
            name = loss["path"].replace("\\", "/").rsplit("/", 1)[-1]
            caption = (
                f"{plain(loss['actual'])} → {plain(loss['predicted'])} · "
                f"p {loss['probability']:.2f} · loss {loss['loss']:.2f} · {plain(name)}"
            )
            with column:
                if loss.get("thumbnail"):
                    st.image(
                        base64.b64decode(loss["thumbnail"]), width=THUMBNAIL_WIDTH, caption=caption
                    )
                else:
                    st.caption(f"{caption} (image not readable)")


def predict_box(engine: Engine, job_id: int, classes: list[str] | None) -> None:
    uploads = st.file_uploader(
        "Images to classify",
        accept_multiple_files=True,
        key=f"results.{job_id}.uploads",
        help="Any image format PIL reads (PNG, JPEG, WebP, BMP, TIFF, GIF…).",
    )
    most = min(MAX_TOP_K, len(classes)) if classes else MAX_TOP_K
    top_k = st.number_input(
        "Classes to show per image",
        min_value=1,
        max_value=most,
        value=min(DEFAULT_TOP_K, most),
        key=f"results.{job_id}.top_k",
    )
    if not uploads:
        return
    from inference.model import ModelLoadError  # fastai: imported once something is uploaded

    files = [(upload.name, upload.getvalue()) for upload in uploads]
    try:
        predictions = predict_uploads(engine, job_id, files, int(top_k))
    except ArtifactUnavailable as exc:
        st.error(f"Cannot predict: {plain(exc)}.", icon=":material/gpp_bad:")
        return
    except ModelLoadError as exc:
        st.error(f"Cannot predict: {plain(exc)}.", icon=":material/error:")
        return
    for (_, data), prediction in zip(files, predictions, strict=True):
        show_prediction(data, prediction)


def show_prediction(data: bytes, prediction: Prediction) -> None:
    if prediction.error is not None:
        st.error(plain(prediction.error), icon=":material/broken_image:")
        return
    with st.container(border=True):
        picture, numbers = st.columns([1, 4])
        picture.image(open_image(data), width=UPLOAD_PREVIEW_WIDTH)
        best = prediction.top[0]
        numbers.markdown(
            f"**{plain(best.label)}** · {best.probability:.2%} · {plain(prediction.name)} · "
            f"{prediction.latency_s * 1000:.1f} ms"
        )
        numbers.dataframe(
            pd.DataFrame(
                {
                    "class": [score.label for score in prediction.top],
                    "probability": [score.probability for score in prediction.top],
                }
            ),
            hide_index=True,
            column_config={
                "probability": st.column_config.ProgressColumn(
                    min_value=0.0, max_value=1.0, format="percent"
                )
            },
        )


def model_card_box(engine: Engine, job_id: int) -> None:
    try:
        artifact = recorded_artifact(engine, job_id, "model_card")
    except ArtifactUnavailable as exc:  # a job trained before model cards existed
        st.caption(f"No model card: {plain(exc)}.")
        return
    try:
        data = read_verified(artifact)
        card = json.loads(data)
    except ArtifactUnavailable as exc:
        st.warning(f"The model card cannot be shown: {plain(exc)}.")
        return
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        st.warning(f"The model card of job #{job_id} is not readable JSON ({plain(exc)}).")
        return
    export = card.get("export", {})
    st.caption(
        f"Spec, dataset, classes, final metrics, library versions and the export's SHA-256 "
        f"({plain(str(export.get('sha256', ''))[:16])}…)."
    )
    st.download_button(
        "Download the model card (JSON)",
        data,
        file_name=f"job{job_id}-model_card.json",
        mime="application/json",
        icon=":material/download:",
        key=f"results.{job_id}.model_card",
    )
    with st.expander("Model card"):
        st.json(card)

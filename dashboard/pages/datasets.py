"""Datasets: register a folder, a CSV, a zip upload or a URL; list them; preview each one as
a grid of sample images with their labels and a bar chart of its classes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import plotly.graph_objects as go
import streamlit as st

from common.errors import first_line
from dashboard.actions import flash, show_flashes
from dashboard.format import chart_text, plain
from dashboard.state import require_database
from datasets.items import dataset_preview
from datasets.labelling import PETS_LABEL_REGEX, DatasetError
from datasets.register import (
    Registration,
    register_csv,
    register_folder,
    register_url,
    register_zip,
    unregister_dataset,
)
from datasets.uploads import UploadLimits
from datasets.validation import DATASET_ROOTS_ENV, allowed_roots, counted
from db.datasets import get_dataset, list_datasets
from db.engine import DatabaseError, Engine
from db.models import Dataset

PREVIEW_KEY = "datasets.preview"
PREVIEW_COUNT = 24
GRID_COLUMNS = 8
THUMBNAIL_PX = 96
PROGRESS_STEPS = 50
LABEL_REGEX_HELP = (
    "Optional. The label is the first group of this regular expression, searched in each "
    f"file name. Oxford-IIIT Pets (breed before the last '_'): `{PETS_LABEL_REGEX}`"
)


def _progress_bar() -> Callable[[int, int], None]:
    """A progress callback for image checks that redraws at most PROGRESS_STEPS times."""
    bar = st.progress(0.0, text="Checking images…")

    def update(done: int, total: int) -> None:
        if total and (done == total or done % max(1, total // PROGRESS_STEPS) == 0):
            bar.progress(done / total, text=f"Checked {done:,} of {total:,} images")

    return update


def _register(
    action: Callable[[Callable[[int, int], None] | None], Registration],
    checks_images: bool = True,
) -> None:
    """Run one registration; on success flash its summary and show the new dataset."""
    try:
        registration = action(_progress_bar() if checks_images else None)
    except DatasetError as exc:
        st.error(plain(exc), icon=":material/error:")
        return
    except DatabaseError as exc:
        reason = first_line(exc)
        st.error(f"The database refused the dataset: {plain(reason)}", icon=":material/error:")
        return
    flash("success", registration.summary())
    st.session_state[PREVIEW_KEY] = registration.name
    st.rerun()


def folder_form(engine: Engine) -> None:
    with st.form("datasets.folder", border=False):
        name = st.text_input("Name", key="datasets.folder.name")
        folder = st.text_input(
            "Folder",
            key="datasets.folder.path",
            help="A folder on this machine, inside the allowed data roots; a relative path is "
            "taken inside the data folder. One sub-folder per class (cat/1.jpg), optionally "
            "inside train/ and valid/ for a fixed split.",
        )
        regex = st.text_input("Label regex", key="datasets.folder.regex", help=LABEL_REGEX_HELP)
        if st.form_submit_button("Check and register", type="primary"):
            _register(lambda progress: register_folder(engine, name, folder, regex, progress))


def csv_form(engine: Engine) -> None:
    with st.form("datasets.csv", border=False):
        name = st.text_input("Name", key="datasets.csv.name")
        csv_file = st.text_input(
            "CSV file",
            key="datasets.csv.path",
            help="Rows of file,label (and optionally is_valid); file paths are relative to the "
            "CSV's folder. A header row is recognised.",
        )
        if st.form_submit_button("Check and register", type="primary"):
            _register(lambda progress: register_csv(engine, name, csv_file, progress))


def zip_form(engine: Engine) -> None:
    limits = UploadLimits.from_env()
    with st.form("datasets.zip", border=False, clear_on_submit=False):
        name = st.text_input("Name", key="datasets.zip.name", help="Default: the zip's name.")
        upload = st.file_uploader(
            "Zip of images",
            type=["zip"],
            key="datasets.zip.file",
            help=f"One folder per class, train/ and valid/ folders, a labels CSV, or file names "
            f"with a label regex. At most {limits.max_files:,} files and "
            f"{limits.max_bytes / 1e6:,.0f} MB unpacked.",
        )
        regex = st.text_input("Label regex", key="datasets.zip.regex", help=LABEL_REGEX_HELP)
        if st.form_submit_button("Upload, check and register", type="primary"):
            if upload is None:
                st.error("Choose a zip file to upload.", icon=":material/error:")
                return
            chosen = name.strip() or Path(upload.name).stem
            _register(
                lambda progress: register_zip(engine, chosen, upload, regex, progress, limits)
            )


def url_form(engine: Engine) -> None:
    with st.form("datasets.url", border=False):
        name = st.text_input("Name", key="datasets.url.name")
        url = st.text_input(
            "URL",
            key="datasets.url.url",
            placeholder="URLs.PETS",
            help="A fastai dataset name (URLs.PETS, URLs.IMAGENETTE_160, …) or the http(s) URL "
            "of a .tgz or .zip archive. The worker downloads it before the first job that uses "
            "it; an offline worker fails that job with a message.",
        )
        regex = st.text_input("Label regex", key="datasets.url.regex", help=LABEL_REGEX_HELP)
        if st.form_submit_button("Register", type="primary"):
            _register(lambda _: register_url(engine, name, url, regex), checks_images=False)


def dataset_table(datasets: list[Dataset]) -> None:
    rows = [
        {
            "name": d.name,
            "kind": d.kind,
            "classes": len(d.classes or []),
            "images": d.item_count,
            "undecodable": len(d.bad_files or []),
            "labels": (d.label_rule or {}).get("type", "folder"),
            "location": d.location,
            "added": d.created_at,
        }
        for d in datasets
    ]
    st.dataframe(rows, hide_index=True, width="stretch")


@st.cache_data(ttl=60, show_spinner=False)
def _preview(
    _engine: Engine, name: str, version: str, count: int
) -> tuple[list[tuple[str, str]], dict[str, dict[str, int]] | None]:
    """Sample images and the per-split class counts, from the dataset's manifest (nothing is
    listed or decoded here); cached per version of the dataset (its manifest)."""
    dataset = get_dataset(_engine, name)
    if dataset is None:
        raise DatasetError(f"dataset {name!r} is no longer registered")
    samples, splits = dataset_preview(dataset, count)
    return [(str(path), label) for path, label in samples], splits


def _thumbnail(path: str):
    """The image as training reads it, enlarged without blurring when it is tiny (digits are
    8×8)."""
    from PIL import Image

    from datasets.images import open_image

    image = open_image(path)
    scale = THUMBNAIL_PX / max(image.size)
    if scale > 1:
        size = (round(image.width * scale), round(image.height * scale))
        image = image.resize(size, Image.Resampling.NEAREST)
    return image


def class_chart(
    class_counts: dict[str, int], splits: dict[str, dict[str, int]] | None
) -> go.Figure:
    classes = sorted(class_counts)
    shown = [chart_text(name) for name in classes]  # plotly renders some HTML in labels
    figure = go.Figure()
    if splits:
        for part in ("train", "valid"):
            figure.add_bar(name=part, x=shown, y=[splits[part].get(c, 0) for c in classes])
        figure.update_layout(barmode="stack")
    else:
        figure.add_bar(name="images", x=shown, y=[class_counts[c] for c in classes])
    figure.update_layout(
        title="Images per class",
        xaxis_title="class",
        yaxis_title="images",
        height=320,
        margin={"l": 40, "r": 10, "t": 40, "b": 40},
    )
    return figure


def image_grid(samples: list[tuple[str, str]]) -> None:
    columns = st.columns(GRID_COLUMNS)
    for index, (path, label) in enumerate(samples):
        try:
            thumbnail = _thumbnail(path)
        except Exception:
            continue  # decoded at registration; a file changed since is simply not shown
        columns[index % GRID_COLUMNS].image(thumbnail, caption=plain(label), width=THUMBNAIL_PX)


def preview(engine: Engine, dataset: Dataset) -> None:
    rule = dataset.label_rule or {}
    st.caption(
        f"{dataset.kind} · {len(dataset.classes or []):,} classes · {dataset.item_count:,} "
        f"images · labels: {plain(rule.get('type', 'folder'))} · {plain(dataset.location)}"
    )
    try:
        version = dataset.manifest_sha256 or str(dataset.created_at)
        samples, splits = _preview(engine, dataset.name, version, PREVIEW_COUNT)
    except DatasetError as exc:
        st.info(plain(exc), icon=":material/info:")
        return
    if dataset.class_counts:
        st.plotly_chart(class_chart(dataset.class_counts, splits), width="stretch")
    image_grid(samples)
    if dataset.bad_files:
        bad = counted(len(dataset.bad_files), "file")
        with st.expander(f"{bad} cannot be decoded (left out)"):
            st.code("\n".join(dataset.bad_files), language=None)


def remove_section(engine: Engine, dataset: Dataset) -> None:
    with st.expander("Remove this dataset"):
        owned = (
            "its unpacked files are deleted too"
            if dataset.kind in ("upload", "url")
            else ("the folder itself is left untouched")
        )
        st.caption(f"Removes {plain(repr(dataset.name))} from the registry; {owned}.")
        confirmed = st.checkbox("Yes, remove it", key=f"datasets.remove.confirm.{dataset.name}")
        if st.button("Remove", key=f"datasets.remove.{dataset.name}", disabled=not confirmed):
            try:
                unregister_dataset(engine, dataset.name)
            except DatasetError as exc:
                st.error(plain(exc), icon=":material/error:")
                return
            flash("success", f"Removed dataset {dataset.name!r}.")
            st.session_state.pop(PREVIEW_KEY, None)
            st.rerun()


def main() -> None:
    st.title("Datasets")
    show_flashes()
    engine = require_database()
    datasets = list_datasets(engine)

    st.subheader("Registered")
    if datasets:
        dataset_table(datasets)
    else:
        st.info(
            "No datasets yet. Add one below; `python -m db dataset builtin` adds the "
            "built-in digits.",
            icon=":material/info:",
        )

    st.subheader("Add a dataset")
    roots = ", ".join(plain(root) for root in allowed_roots())
    st.caption(
        f"Folders and CSV files must lie inside the allowed data roots: {roots} "
        f"(an admin adds more with {DATASET_ROOTS_ENV})."
    )
    folder_tab, csv_tab, zip_tab, url_tab = st.tabs(["Folder", "CSV", "Upload a zip", "URL"])
    with folder_tab:
        folder_form(engine)
    with csv_tab:
        csv_form(engine)
    with zip_tab:
        zip_form(engine)
    with url_tab:
        url_form(engine)

    if not datasets:
        return
    st.subheader("Preview")
    names = [d.name for d in datasets]
    if st.session_state.get(PREVIEW_KEY) not in names:
        st.session_state[PREVIEW_KEY] = names[0]
    chosen = st.selectbox("Dataset", names, key=PREVIEW_KEY)
    dataset = next(d for d in datasets if d.name == chosen)
    preview(engine, dataset)
    remove_section(engine, dataset)


main()

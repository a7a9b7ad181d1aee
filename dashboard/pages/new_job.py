"""New job: pick a dataset, set the spec (every field, with its default, help and bounds), queue."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import streamlit as st

from common.errors import first_line
from dashboard import spec_form
from dashboard.actions import CLONE_REQUEST_KEY, show_flashes
from dashboard.format import plain
from dashboard.nav import JOB_PAGE
from dashboard.state import get_engine
from datasets.labelling import is_image_name
from db import queue
from db.datasets import get_dataset, training_images_of
from db.engine import DatabaseError, Engine
from db.spec import SpecError

PROBLEMS_KEY = "new_job.problems"
QUEUED_KEY = "new_job.queued"
CLONED_FROM_KEY = "new_job.cloned_from"
SAMPLE_CLASSES = 8


@st.cache_data(ttl=60, show_spinner=False)
def sample_images(location: str, folder_per_class: bool) -> list[tuple[str, str]]:
    """(path, caption) of a few images: the first of each of the first classes."""
    root = Path(location)
    if not root.is_dir():
        return []
    if folder_per_class:
        samples = []
        for class_dir in sorted(path for path in root.iterdir() if path.is_dir()):
            image = next(
                (p for p in sorted(class_dir.iterdir()) if p.is_file() and is_image_name(p)), None
            )
            if image is not None:
                samples.append((str(image), class_dir.name))
            if len(samples) == SAMPLE_CLASSES:
                break
        return samples
    images = (p for p in root.rglob("*") if p.is_file() and is_image_name(p))
    return [(str(path), path.name) for path in itertools.islice(images, SAMPLE_CLASSES)]


def dataset_picker(engine: Engine, problem: str | None) -> None:
    names = sorted(queue.known_dataset_names(engine))
    if st.session_state.get(spec_form.DATASET_KEY) not in names:
        names.append(st.session_state[spec_form.DATASET_KEY])
    st.selectbox(
        "Dataset",
        names,
        key=spec_form.DATASET_KEY,
        help="A registered dataset (see the Datasets page); 'digits' is built in.",
    )
    if problem:
        st.error(plain(problem), icon=":material/error:")
    dataset = get_dataset(engine, st.session_state[spec_form.DATASET_KEY])
    if dataset is None:
        st.caption(
            "Built in: scikit-learn's 1,797 handwritten digits in 10 classes, "
            "written to disk by `python -m db dataset builtin`."
        )
        return
    counts = dataset.class_counts or {}
    st.caption(
        f"{dataset.kind} · {len(dataset.classes or counts):,} classes · "
        f"{dataset.item_count:,} images · {plain(dataset.location)}"
    )
    folder_per_class = (dataset.label_rule or {}).get("type", "folder") == "folder"
    samples = sample_images(dataset.location, folder_per_class)
    if samples:
        columns = st.columns(len(samples))
        for column, (path, caption) in zip(columns, samples, strict=True):
            column.image(path, caption=plain(caption), width=72)
    else:
        st.caption("No sample images: the dataset's folder is not on this machine.")


def training_images_caption(engine: Engine) -> None:
    """The images a batch is drawn from, beside the batch size, so that a batch too large
    for the dataset shows before the job is queued."""
    dataset = get_dataset(engine, st.session_state[spec_form.DATASET_KEY])
    valid_pct = st.session_state.get(spec_form.KEY_PREFIX + "valid_pct")
    count = None if valid_pct is None else training_images_of(dataset, valid_pct)
    if count is None:
        st.caption("Training images: counted when the job starts.")
        return
    st.caption(
        f"Training images: {count:,} of {dataset.item_count:,} "
        f"({valid_pct:.0%} held out for validation)."
    )


def submit(engine: Engine) -> None:
    data = spec_form.collect()
    try:
        job_id = queue.submit(engine, data, cloned_from=st.session_state.get(CLONED_FROM_KEY))
    except SpecError as exc:
        st.session_state[PROBLEMS_KEY] = {"values": data, "problems": exc.problems}
        st.session_state.pop(QUEUED_KEY, None)
        return
    except DatabaseError as exc:
        reason = first_line(exc)
        st.session_state[PROBLEMS_KEY] = {
            "values": data,
            "problems": {"spec": f"the database refused the job: {reason}"},
        }
        return
    st.session_state.pop(PROBLEMS_KEY, None)
    st.session_state.pop(CLONED_FROM_KEY, None)
    st.session_state[QUEUED_KEY] = job_id


def current_problems() -> dict[str, str]:
    """Problems of the last submit, for the fields whose value has not changed since."""
    last = st.session_state.get(PROBLEMS_KEY)
    if not last:
        return {}
    now = spec_form.collect()
    return {
        field: message
        for field, message in last["problems"].items()
        if field not in now or now.get(field) == last["values"].get(field)
    }


def take_clone_request() -> None:
    request: dict[str, Any] | None = st.session_state.pop(CLONE_REQUEST_KEY, None)
    if request is None:
        return
    notes = spec_form.load_spec(request["spec"])
    st.session_state[CLONED_FROM_KEY] = request["job_id"]
    st.session_state.pop(QUEUED_KEY, None)
    st.session_state.pop(PROBLEMS_KEY, None)
    for note in notes:
        st.warning(plain(note))


def reset_form() -> None:
    for key in list(st.session_state):
        if str(key).startswith(spec_form.KEY_PREFIX) or key in (CLONED_FROM_KEY, PROBLEMS_KEY):
            del st.session_state[key]


engine = get_engine()
st.title("New job")
show_flashes()
spec_form.set_defaults()
take_clone_request()

cloned_from = st.session_state.get(CLONED_FROM_KEY)
if cloned_from is not None:
    left, right = st.columns([4, 1])
    left.info(f"A copy of job #{cloned_from}: edit what you like and queue it.")
    right.button("Start from defaults", on_click=reset_form)

problems = current_problems()
shown: set[str] = set()

st.subheader("Dataset")
dataset_picker(engine, problems.get("dataset"))
shown.add("dataset")

for title, fields in spec_form.form_fields().items():
    st.subheader(title)
    columns = st.columns(3)
    for index, field in enumerate(fields):
        with columns[index % 3]:
            spec_form.render_field(field, problems.get(field.name))
            if field.name == "bs":
                training_images_caption(engine)
        shown.add(field.name)

other_problems = {field: message for field, message in problems.items() if field not in shown}
if problems:
    st.error(
        "Nothing was queued: "
        + plain(
            "; ".join(
                f"{spec_form.LABELS.get(field, field)} {message}"
                for field, message in other_problems.items()
            )
        )
        if other_problems
        else "Nothing was queued: fix the fields marked above."
    )

st.button("Queue job", type="primary", icon=":material/send:", on_click=submit, args=(engine,))

queued = st.session_state.get(QUEUED_KEY)
if queued is not None:
    st.success(f"Queued job #{queued}.")
    st.page_link(JOB_PAGE, label=f"Open job #{queued}", query_params={"job": queued})

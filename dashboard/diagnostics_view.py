"""Parts of the job page about what the machine did: whether the input pipeline keeps up and
profile captures (Diagnostics tab), and the TensorBoard download (Artifacts tab).

Each part is a function of (engine, job) that `dashboard/pages/job.py` calls in its tab, so the
page itself changes little when one is added.
"""

from __future__ import annotations

import streamlit as st

from common import store
from dashboard.downloads import link_for, link_for_made
from dashboard.format import plain
from dashboard.live import LiveJob
from db.artifacts import get_artifact
from db.engine import Engine
from db.models import Job
from db.profiles import MAX_PROFILE_STEPS, OPEN, captures, request_profile
from db.queue import JobNotFound, JobStateError
from db.telemetry import INPUT_BOUND_SHARE, INPUT_WAIT_SHARE
from db.tensorboard import run_name, zip_tensorboard


def input_wait_sentence(epoch: int, share: float) -> tuple[bool, str]:
    """(input-bound?, the sentence) for the share of a training pass spent waiting for data
    in `epoch` (counted from 0)."""
    if share > INPUT_BOUND_SHARE:
        return True, (
            f"Input-bound: {share:.0%} of each step waits for data (epoch {epoch + 1}): the "
            "host cannot load images as fast as the device trains on them. What helps: more "
            "DataLoader workers (the worker's TRAINDECK_LOADER_WORKERS setting; by default a "
            "dataset under 5,000 images gets none and a larger one one per spare CPU core), a "
            "smaller img_size, or a lighter item_tfms (images stored near the size trained "
            "on, so that each resize does less)."
        )
    return False, (
        f"Input keeps up: {share:.0%} of each step waited for data in epoch {epoch + 1}."
    )


def input_wait_part(live: LiveJob) -> None:
    """One sentence on the latest epoch's wait for data, when the job has measured it."""
    shares = live.get(INPUT_WAIT_SHARE)
    if not len(shares):
        return
    bound, sentence = input_wait_sentence(int(shares.last_step[-1]), float(shares.mean[-1]))
    if bound:
        st.warning(sentence, icon=":material/hourglass_top:")
    else:
        st.caption(sentence)


def tensorboard_part(engine: Engine, job: Job) -> None:
    """A link to the job as a TensorBoard run (a zip made when clicked), and how to open it."""
    name = f"job{job.id}-tensorboard.zip"
    link = link_for_made(
        f"tensorboard:{job.id}", name, lambda out: zip_tensorboard(engine, [job.id], out)
    )
    with st.container(border=True):
        st.markdown("**TensorBoard** · the job's curves, XLA compiles per epoch and spec")
        st.link_button("Download as TensorBoard run (zip)", link, icon=":material/download:")
        st.caption(
            f"Unzip it into a folder and run `tensorboard --logdir FOLDER`: the job is the run "
            f"{run_name(job.id)}. Made from the points stored when you click; "
            f"`traindeck export tensorboard {job.id} --dir FOLDER` writes the same."
        )


PROFILE_STEPS_DEFAULT = 10
PROFILE_HOW_TO_OPEN = (
    "Unzip the download. A trace from an XLA job (torch_xla's profiler) is in TensorBoard's "
    "profile layout: `pip install tensorboard-plugin-profile`, then `tensorboard --logdir "
    "FOLDER` and open the Profile tab; its `*.trace.json.gz` also opens in Perfetto "
    "(ui.perfetto.dev). A trace from another device (torch.profiler) is `*.pt.trace.json`: "
    "open it in Perfetto."
)


def _profile_message_key(job_id: int) -> str:
    return f"job.profile_message.{job_id}"


def _ask_for_profile(engine: Engine, job_id: int, steps_key: str) -> None:
    steps = int(st.session_state.get(steps_key) or PROFILE_STEPS_DEFAULT)
    try:
        capture = request_profile(engine, job_id, steps)
    except (JobNotFound, JobStateError) as exc:
        message = ("error", f"No capture: {exc}.")
    else:
        message = (
            "info",
            f"Capture #{capture} asked for: the job records its next {steps} training steps "
            "from its next look at the database (within a few seconds).",
        )
    st.session_state[_profile_message_key(job_id)] = message


def profile_part(engine: Engine, job: Job) -> None:
    """The profile capture action (a running job), the job's captures and the trace's link."""
    st.markdown("**Profile**")
    steps_key = f"job.profile_steps.{job.id}"
    steps_column, button_column = st.columns([1, 3], vertical_alignment="bottom")
    steps_column.number_input(
        "Steps", 1, MAX_PROFILE_STEPS, PROFILE_STEPS_DEFAULT, key=steps_key,
        help="Training steps to record with the profiler.",
    )  # fmt: skip
    steps = int(st.session_state.get(steps_key) or PROFILE_STEPS_DEFAULT)
    button_column.button(
        f"Capture a profile of the next {steps} steps",
        key=f"job.profile.{job.id}",
        icon=":material/timer:",
        disabled=job.status != "running",
        help="Only a running job can be profiled.",
        on_click=_ask_for_profile,
        args=(engine, job.id, steps_key),
    )
    message = st.session_state.get(_profile_message_key(job.id))
    if message:
        getattr(st, message[0])(plain(message[1]))
    for capture in captures(engine, job.id, limit=5):
        words = f"#{capture.id} · {capture.steps} steps · {capture.status}"
        if capture.message:
            words += f" · {capture.message}"
        elif capture.status in OPEN and job.status != "running":
            words += f" · not recorded: the job is {job.status}"
        st.caption(plain(words))
    artifact = get_artifact(engine, job.id, "profile")
    if artifact is not None:
        name = store.display_name(artifact.path)
        st.link_button(
            f"Download the latest profile ({name})",
            link_for(artifact.path, f"job{job.id}-{name}", artifact.sha256),
            icon=":material/download:",
        )
        st.caption(PROFILE_HOW_TO_OPEN)

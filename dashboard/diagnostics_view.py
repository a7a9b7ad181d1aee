"""Parts of the job page about what the machine did: whether the input pipeline keeps up
(Diagnostics tab) and the TensorBoard download (Artifacts tab).

Each part is a function of (engine, job) that `dashboard/pages/job.py` calls in its tab, so the
page itself changes little when one is added.
"""

from __future__ import annotations

import streamlit as st

from dashboard.downloads import link_for_made
from dashboard.live import LiveJob
from db.engine import Engine
from db.models import Job
from db.telemetry import INPUT_BOUND_SHARE, INPUT_WAIT_SHARE
from db.tensorboard import run_name, zip_tensorboard


def input_wait_sentence(epoch: int, share: float) -> tuple[bool, str]:
    """(input-bound?, the sentence) for the share of a training pass spent waiting for data
    in `epoch` (counted from 0)."""
    if share > INPUT_BOUND_SHARE:
        return True, (
            f"Input-bound: {share:.0%} of each step waits for data (epoch {epoch + 1}): the "
            "host cannot load images as fast as the device trains on them. What helps: more "
            "DataLoader workers (a worker starts one per spare CPU core, so a machine with more "
            "cores), a smaller img_size, or a lighter item_tfms (images stored near the size "
            "trained on, so that each resize does less)."
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

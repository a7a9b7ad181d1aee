"""Parts of the job page about what the machine did: the TensorBoard download (Artifacts tab).

Each part is a function of (engine, job) that `dashboard/pages/job.py` calls in its tab, so the
page itself changes little when one is added.
"""

from __future__ import annotations

import streamlit as st

from dashboard.downloads import link_for_made
from db.engine import Engine
from db.models import Job
from db.tensorboard import run_name, zip_tensorboard


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

"""What a person can do to a job (cancel, retry, clone, delete), shared by the Jobs and Job pages.

Each action reports its outcome through `flash`, shown once at the top of the next run, so a
refused action (say, deleting a running job) is a sentence on the page, never a traceback. A
flash message is shown as plain text (it carries names and error messages from outside).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from common.files import remove_job_files
from dashboard.format import plain
from dashboard.nav import JOB_PAGE, NEW_JOB_PAGE
from db import queue
from db.engine import Engine
from db.models import FINISHED_STATUSES

CLONE_REQUEST_KEY = "clone_request"
_FLASH_KEY = "flash_messages"


def flash(level: str, message: str, job_id: int | None = None) -> None:
    """Show `message` (level: success, info, warning, error) at the top of the next run."""
    st.session_state.setdefault(_FLASH_KEY, []).append((level, message, job_id))


def show_flashes() -> None:
    for level, message, job_id in st.session_state.pop(_FLASH_KEY, []):
        getattr(st, level)(plain(message))
        if job_id is not None:
            st.page_link(JOB_PAGE, label=f"Open job #{job_id}", query_params={"job": job_id})


def _attempt(action: str, job_id: int, call: Any) -> Any:
    try:
        return call()
    except queue.JobNotFound:
        flash("error", f"Cannot {action} job #{job_id}: it no longer exists.")
    except queue.JobStateError as exc:
        flash("error", f"Cannot {action} job #{job_id}: {exc}.")
    except Exception as exc:  # the database went away, a file could not be removed, ...
        flash("error", f"Cannot {action} job #{job_id}: {type(exc).__name__}: {exc}")
    return None


def cancel(engine: Engine, job_id: int) -> None:
    outcome = _attempt("cancel", job_id, lambda: queue.cancel(engine, job_id))
    if outcome == "cancelled":
        flash("success", f"Job #{job_id} was cancelled before it started.")
    elif outcome == "cancelling":
        flash("info", f"Job #{job_id} will stop at its next batch.")


def retry(engine: Engine, job_id: int) -> None:
    new_id = _attempt("retry", job_id, lambda: queue.retry(engine, job_id))
    if new_id is not None:
        flash("success", f"Job #{job_id} was queued again as job #{new_id}.", new_id)


def delete(engine: Engine, job_id: int) -> None:
    def delete_rows_then_files() -> bool:
        queue.delete_job(engine, job_id)
        remove_job_files(job_id)
        return True

    if _attempt("delete", job_id, delete_rows_then_files):
        flash("success", f"Job #{job_id} and its files were deleted.")


def clone_into_form(job_id: int, spec: dict[str, Any]) -> None:
    """Open the New job form filled with this job's spec."""
    st.session_state[CLONE_REQUEST_KEY] = {"job_id": job_id, "spec": dict(spec)}
    st.switch_page(NEW_JOB_PAGE)


def render_buttons(engine: Engine, job_id: int, status: str, spec: dict[str, Any], key: str):
    """Cancel, retry, clone and delete buttons for one job, each enabled when it applies."""
    finished = status in FINISHED_STATUSES
    cancel_col, retry_col, clone_col, delete_col = st.columns(4)
    cancel_col.button(
        "Cancel",
        key=f"{key}-cancel",
        icon=":material/stop_circle:",
        disabled=finished,
        help="A queued job is cancelled at once, a running one at its next batch.",
        on_click=cancel,
        args=(engine, job_id),
        width="stretch",
    )
    retry_col.button(
        "Retry",
        key=f"{key}-retry",
        icon=":material/replay:",
        disabled=not finished,
        help="Queue a finished job again, as a new job with the same spec.",
        on_click=retry,
        args=(engine, job_id),
        width="stretch",
    )
    if clone_col.button(
        "Clone",
        key=f"{key}-clone",
        icon=":material/content_copy:",
        help="Open the New job form with this job's spec, to edit and submit.",
        width="stretch",
    ):
        clone_into_form(job_id, spec)
    confirm_key = f"{key}-confirm-delete"
    if delete_col.button(
        "Delete",
        key=f"{key}-delete",
        icon=":material/delete:",
        disabled=not finished,
        help="Delete a finished job, its metrics, log and files.",
        width="stretch",
    ):
        st.session_state[confirm_key] = job_id
    if st.session_state.get(confirm_key) == job_id and finished:
        st.warning(f"Delete job #{job_id} with its metrics, log and files? This cannot be undone.")
        yes, no = st.columns(2)
        yes.button(
            f"Yes, delete job #{job_id}",
            key=f"{key}-delete-yes",
            type="primary",
            on_click=_confirm_delete,
            args=(engine, job_id, confirm_key),
        )
        no.button(
            "Keep it", key=f"{key}-delete-no", on_click=st.session_state.pop, args=(confirm_key,)
        )


def _confirm_delete(engine: Engine, job_id: int, confirm_key: str) -> None:
    st.session_state.pop(confirm_key, None)
    delete(engine, job_id)

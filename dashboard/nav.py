"""The pages and their places in the navigation.

Pages link to each other by these paths (relative to `dashboard/app.py`), e.g.
`st.page_link(JOB_PAGE, query_params={"job": 7})`. The Datasets and TPU VMs pages are
listed as soon as their files exist.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

DASHBOARD_DIR = Path(__file__).resolve().parent

NEW_JOB_PAGE = "pages/new_job.py"
JOBS_PAGE = "pages/jobs.py"
JOB_PAGE = "pages/job.py"
COMPARE_PAGE = "pages/compare.py"
SWEEPS_PAGE = "pages/sweeps.py"
WORKERS_PAGE = "pages/workers.py"
DATASETS_PAGE = "pages/datasets.py"
TPU_VMS_PAGE = "pages/tpu_vms.py"
SETTINGS_PAGE = "pages/settings.py"


def _page_if_present(path: str, title: str, icon: str) -> list[st.Page]:
    if (DASHBOARD_DIR / path).is_file():
        return [st.Page(path, title=title, icon=icon)]
    return []


def build_navigation() -> st.Page:
    """Register every page with Streamlit; returns the page this run should show."""
    sections = {
        "Training": [
            st.Page(JOBS_PAGE, title="Jobs", icon=":material/list:", default=True),
            st.Page(NEW_JOB_PAGE, title="New job", icon=":material/add_circle:"),
            st.Page(JOB_PAGE, title="Job", icon=":material/monitoring:"),
            st.Page(COMPARE_PAGE, title="Compare", icon=":material/compare_arrows:"),
            st.Page(SWEEPS_PAGE, title="Sweeps", icon=":material/tune:"),
        ],
        "Data": _page_if_present(DATASETS_PAGE, "Datasets", ":material/photo_library:"),
        "Machines": [
            st.Page(WORKERS_PAGE, title="Workers", icon=":material/dns:"),
            *_page_if_present(TPU_VMS_PAGE, "TPU VMs", ":material/memory:"),
        ],
        "Settings": [st.Page(SETTINGS_PAGE, title="Settings", icon=":material/settings:")],
    }
    return st.navigation({section: pages for section, pages in sections.items() if pages})

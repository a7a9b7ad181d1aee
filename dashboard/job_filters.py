"""The filters of a list of jobs (status, tags, dataset, architecture, a text search), kept in
the page's address so that a filtered list can be shared.

Each filter is a widget whose value is also a query parameter: `?status=failed,cancelled&
tag=baseline&dataset=digits&arch=resnet18&q=lr`. A page opened at such an address starts with
those filters; changing a widget rewrites the address (`st.query_params`). Every filter is a
condition in SQL (`db.joblist.JobFilter`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from db.joblist import JobFilter
from db.labels import all_tags
from db.models import JOB_STATUSES
from db.queue import count_by_status, known_dataset_names
from db.spec import ARCHITECTURES

# Filter (a JobFilter field) → its query parameter.
PARAMS = {"statuses": "status", "tags": "tag", "dataset": "dataset", "arch": "arch", "search": "q"}
LISTS = ("statuses", "tags")


def from_address(query: dict[str, str]) -> dict[str, Any]:
    """The filters an address names; a list is comma-separated, an unknown status left out."""
    values: dict[str, Any] = {}
    for field, param in PARAMS.items():
        raw = query.get(param, "").strip()
        if field in LISTS:
            items = [item.strip() for item in raw.split(",") if item.strip()]
            if field == "statuses":
                items = [item for item in items if item in JOB_STATUSES]
            values[field] = list(dict.fromkeys(items))
        else:
            values[field] = raw or None
    return values


def to_address(filters: JobFilter) -> dict[str, str]:
    """The query parameters of `filters` (only those set)."""
    params = {}
    for field, param in PARAMS.items():
        value = getattr(filters, field)
        text = ",".join(value) if field in LISTS else value
        if text:
            params[param] = text
    return params


def _keys(prefix: str, search_key: str | None) -> dict[str, str]:
    keys = {field: f"{prefix}.{field}" for field in PARAMS}
    if search_key:
        keys["search"] = search_key
    return keys


def _choices(chosen: Any, known: list[str]) -> list[str]:
    """The known values, and those chosen (from an address) that are not known here."""
    extra = [chosen] if isinstance(chosen, str) else list(chosen or [])
    return sorted(set(known) | set(extra))


def _counted(counts: dict[str, int]) -> Callable[[str], str]:
    return lambda value: f"{value} ({counts.get(value, 0):,})"


def filter_widgets(engine: Any, prefix: str, search_key: str | None = None) -> JobFilter:
    """The filter widgets in a row, started from the address; the address then follows them."""
    keys = _keys(prefix, search_key)
    started = from_address(dict(st.query_params))
    for field, key in keys.items():
        if key not in st.session_state:
            st.session_state[key] = started[field] if field != "search" else started[field] or ""
    tags = all_tags(engine)
    status_column, tag_column, dataset_column, arch_column, search_column = st.columns(
        [3, 3, 2, 2, 3]
    )
    statuses = status_column.multiselect(
        "Status", JOB_STATUSES, format_func=_counted(count_by_status(engine)),
        placeholder="All statuses", key=keys["statuses"],
    )  # fmt: skip
    chosen_tags = tag_column.multiselect(
        "Tags", _choices(st.session_state[keys["tags"]], list(tags)), format_func=_counted(tags),
        placeholder="Any tags", key=keys["tags"], help="Jobs that carry every tag chosen.",
    )  # fmt: skip
    dataset = dataset_column.selectbox(
        "Dataset", _choices(st.session_state[keys["dataset"]], list(known_dataset_names(engine))),
        placeholder="Any dataset", key=keys["dataset"],
    )  # fmt: skip
    arch = arch_column.selectbox(
        "Architecture", _choices(st.session_state[keys["arch"]], list(ARCHITECTURES)),
        placeholder="Any architecture", key=keys["arch"],
    )  # fmt: skip
    search = search_column.text_input(
        "Find", placeholder="a job number, or words of its name or note", key=keys["search"]
    )
    filters = JobFilter(
        statuses=tuple(statuses), tags=tuple(chosen_tags), dataset=dataset or "",
        arch=arch or "", search=search.strip(),
    )  # fmt: skip
    keep_in_address(filters)
    return filters


def keep_in_address(filters: JobFilter) -> None:
    """Write the filters into the address, leaving the page's other parameters alone."""
    wanted = to_address(filters)
    for param in PARAMS.values():
        if param in wanted:
            if st.query_params.get(param) != wanted[param]:
                st.query_params[param] = wanted[param]
        elif param in st.query_params:
            del st.query_params[param]

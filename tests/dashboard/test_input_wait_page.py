"""The input-bound diagnosis on the job page's Diagnostics tab and in the Jobs table."""

from __future__ import annotations

import pytest

from db.telemetry import INPUT_WAIT_SHARE, MetricPoint, write_metrics
from tests.dashboard.test_pages import _fresh_engine_cache, open_page, show_tab  # noqa: F401
from tests.support import seed
from tests.support.markdown import shown


def test_an_input_bound_job_is_named_with_what_to_change(sqlite_engine):
    live = seed.running_job(sqlite_engine)
    calm = seed.running_job(sqlite_engine, name="calm run", worker_id="worker-b")
    write_metrics(sqlite_engine, live.id, [MetricPoint(INPUT_WAIT_SHARE, 0, 0.62, 0)])
    write_metrics(sqlite_engine, calm.id, [MetricPoint(INPUT_WAIT_SHARE, 0, 0.04, 0)])

    at = show_tab(open_page("pages/job.py", job=live.id), "Diagnostics")
    warnings = [shown(w.value) for w in at.warning]
    sentence = next(w for w in warnings if w.startswith("Input-bound:"))
    assert "62% of each step waits for data (epoch 1)" in sentence
    for remedy in ("DataLoader workers", "img_size", "item_tfms"):
        assert remedy in sentence

    at = show_tab(open_page("pages/job.py", job=calm.id), "Diagnostics")
    assert not [w for w in at.warning if shown(w.value).startswith("Input-bound")]
    captions = [shown(c.value) for c in at.caption]
    assert "Input keeps up: 4% of each step waited for data in epoch 1." in captions

    frame = open_page("pages/jobs.py").dataframe[0].value.set_index("name")
    assert frame.loc["live run", "waits for data"] == pytest.approx(0.62)
    assert frame.loc["calm run", "waits for data"] == pytest.approx(0.04)


def test_a_job_that_measured_nothing_says_nothing_about_input(sqlite_engine):
    live = seed.running_job(sqlite_engine)
    at = show_tab(open_page("pages/job.py", job=live.id), "Diagnostics")
    assert not [c for c in at.caption if "waited for data" in shown(c.value)]
    assert not [w for w in at.warning if "waits for data" in shown(w.value)]

"""The job page's XLA panel shows the persistent compilation cache: hits and misses per epoch,
and a sentence for the whole job (on SQLite and Postgres)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import xla
from db import queue
from db.engine import dispose_engines
from db.telemetry import add_xla_report
from tests.support import seed

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def _summary(compiles: int, hits: int, misses: int, load_failures: int = 0) -> dict:
    return seed.xla_summary(compiles) | {
        "persistent_cache_hits": hits,
        "persistent_cache_misses": misses,
        "persistent_cache_load_failures": load_failures,
    }


def test_cache_counters_become_per_epoch_figures_and_one_sentence():
    first_job = [(0, _summary(14, 0, 14)), (1, _summary(15, 0, 15)), (2, _summary(15, 0, 15))]
    second_job = [(0, _summary(0, 14, 0)), (1, _summary(0, 15, 0))]

    first = xla.per_epoch(first_job)
    second = xla.per_epoch(second_job)

    assert [row.cache_misses for row in first] == [14, 1, 0]
    assert [row.cache_hits for row in second] == [14, 1]
    assert xla.cache_summary(first) == (
        "Compilation cache: 0 of 15 graphs loaded from the cache, 15 compiled and stored in it."
    )
    assert xla.cache_summary(second).startswith("Compilation cache: 15 of 15 graphs loaded")


def test_a_cache_this_backend_cannot_load_and_old_reports_are_told_apart():
    on_cpu = xla.per_epoch([(0, _summary(14, 0, 0, load_failures=14))])
    assert xla.cache_summary(on_cpu) == (
        "Compilation cache: 0 of 14 graphs loaded from the cache, 0 compiled and stored in it; "
        "14 found in the cache but not loadable by this XLA backend (torch_xla 2.8 and 2.9 "
        "cannot load cached executables: pytorch/xla#9094), so compiled again."
    )
    old_worker = xla.per_epoch([(0, seed.xla_summary(12) | {"persistent_cache_hits": 0})])
    assert xla.cache_summary(old_worker) is None


@pytest.fixture
def _fresh_engine_cache():
    dispose_engines()
    yield
    dispose_engines()


def test_the_job_page_shows_cache_hits_and_misses(engine, _fresh_engine_cache):
    queue.submit(engine, {"name": "cached", "epochs": 2, "device": "xla"})
    job = queue.claim(engine, "worker-a")
    add_xla_report(engine, job.id, 0, _summary(14, 12, 2), "Metric: CompileTime")
    add_xla_report(engine, job.id, 1, _summary(15, 13, 2), "Metric: CompileTime")

    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/job.py")
    at.query_params["job"] = str(job.id)
    at.session_state["job.tab"] = "Diagnostics"  # tabs are lazy: only the open one runs
    at.run()

    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    assert table["cache hits"].tolist() == [12, 1]
    assert table["cache misses"].tolist() == [2, 0]
    captions = [caption.value for caption in at.caption]
    assert (
        "Compilation cache: 13 of 15 graphs loaded from the cache, 2 compiled and stored in it."
    ) in captions


def test_a_job_that_followed_one_with_the_same_graphs_says_how_many_it_found_compiled():
    kept = {"graphs_kept": 7, "graphs_kept_from_job": 41}
    reused = [(0, seed.xla_summary(0) | kept), (1, seed.xla_summary(1) | kept)]
    assert xla.kept_graphs_summary(reused) == (
        "Graphs kept from job 41: this job ran in the worker process that trained job 41 "
        "before it, with 7 compiled graphs in memory; this job compiled 1 of its own."
    )
    assert xla.kept_graphs_summary([(0, seed.xla_summary(6))]) is None
    retried = [(0, seed.xla_summary(0) | kept), (1, seed.xla_summary(6))]  # a fresh process
    assert xla.kept_graphs_summary(retried) is None
    assert xla.kept_graphs_summary([]) is None


def test_the_job_page_shows_the_graphs_kept_from_the_previous_job(engine, _fresh_engine_cache):
    queue.submit(engine, {"name": "second", "epochs": 1, "device": "xla"})
    job = queue.claim(engine, "worker-a")
    kept = {"graphs_kept": 6, "graphs_kept_from_job": 3}
    add_xla_report(engine, job.id, 0, seed.xla_summary(0) | kept, "Metric: CompileTime")

    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/job.py")
    at.query_params["job"] = str(job.id)
    at.session_state["job.tab"] = "Diagnostics"
    at.run()

    assert not at.exception, [e.value for e in at.exception]
    assert (
        "Graphs kept from job 3: this job ran in the worker process that trained job 3 before "
        "it, with 6 compiled graphs in memory; this job compiled 0 of its own."
    ) in [caption.value for caption in at.caption]

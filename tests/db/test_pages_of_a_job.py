"""A job's log and its validation predictions read a page at a time, on SQLite and Postgres."""

from __future__ import annotations

from db import queue
from db.results import get_results, prediction_count, prediction_page, save_results
from db.telemetry import add_events, log_line_count, log_page


def _job(engine) -> int:
    return queue.submit(engine, {"name": "paged"})


def test_the_log_is_read_a_page_at_a_time_newest_first_and_searched_in_sql(engine):
    job_id = _job(engine)
    other = _job(engine)
    add_events(engine, job_id, [("info", f"line {n}") for n in range(10)])
    add_events(engine, other, [("info", "line of another job")])
    add_events(engine, job_id, [("warning", "100% of a_b done")])

    newest = log_page(engine, job_id, 4)
    assert [row.message for row in newest] == ["line 7", "line 8", "line 9", "100% of a_b done"]
    older = log_page(engine, job_id, 4, before_id=newest[0].id)
    assert [row.message for row in older] == ["line 3", "line 4", "line 5", "line 6"]
    newer = log_page(engine, job_id, 2, after_id=older[-1].id)
    assert [row.message for row in newer] == ["line 7", "line 8"]
    assert log_line_count(engine, job_id) == 11
    assert log_line_count(engine, job_id, before_id=older[0].id) == 3

    # % and _ are text, and case does not matter.
    assert [row.message for row in log_page(engine, job_id, 5, query="100% OF A_B")] == [
        "100% of a_b done"
    ]
    assert log_page(engine, job_id, 5, query="1_0") == []
    assert log_line_count(engine, job_id, query="LINE 1") == 1


def test_predictions_are_counted_and_read_in_pages_without_reading_them_all(engine):
    job_id = _job(engine)
    rows = [[f"/data/{n % 3}/{n}.png", str(n % 3), str((n + 1) % 3)] for n in range(25)]
    save_results(
        engine,
        job_id,
        classes=["0", "1", "2"],
        confusion=[[1, 0, 0], [0, 1, 0], [0, 0, 1]],
        per_class=[{"class": c, "precision": 1.0, "recall": 1.0, "support": 1} for c in "012"],
        top_losses=[],
        predictions=rows,
        accuracy=1.0,
        valid_loss=0.1,
    )
    assert prediction_count(engine, job_id) == 25
    assert prediction_count(engine, _job(engine)) == 0
    assert prediction_page(engine, job_id, 0, 10) == rows[:10]
    assert prediction_page(engine, job_id, 20, 10) == rows[20:]
    assert prediction_page(engine, job_id, 30, 10) == []

    summary = get_results(engine, job_id, predictions=False)
    assert summary.classes == ["0", "1", "2"]
    assert "predictions" not in summary.__dict__  # never read

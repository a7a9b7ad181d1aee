"""The Sweeps page through AppTest: the trials of a sweep with their values and objective,
the best trial, the parallel-coordinates plot and the objective by trial; a trial's job page
links back to its sweep. The trials are run as a worker would, without training."""

from __future__ import annotations

from db import queue, sweeps
from tests.dashboard.test_pages import figures, open_page, show_tab, texts

DEFINITION = {
    "name": "lr **search** <b>x</b>",
    "base": {"dataset": "digits", "epochs": 2, "img_size": 16, "device": "cpu"},
    "space": {"lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-1}, "arch": ["resnet18"]},
    "objective": {"metric": "accuracy"},
    "trials": 3,
    "max_concurrent": 1,
    "sampler": "random",
    "pruner": {"type": "median", "startup_trials": 1},
    "first_trials": [{"lr": 0.01}, {"lr": 0.0001}],
}


def _run_trial(engine, values, pruned=False):
    claimed = queue.claim(engine, "test-worker")
    trial = sweeps.trial_of(engine, claimed.id)
    for epoch, value in enumerate(values):
        sweeps.report_epoch(engine, trial, epoch, value)
    if pruned:
        sweeps.end_trial(engine, trial, "pruned")
        queue.finish(engine, claimed.lease, "pruned")
    else:
        sweeps.end_trial(engine, trial, "complete", kept_epoch=len(values) - 1)
        queue.finish(engine, claimed.lease, "succeeded")
    return claimed.id


def test_the_sweeps_page_shows_trials_the_best_and_the_plots(sqlite_engine):
    engine = sqlite_engine
    sweep_id = sweeps.submit_sweep(engine, DEFINITION)
    best_job = _run_trial(engine, [0.6, 0.9])
    sweeps.drive(engine, sweep_id, "test")
    _run_trial(engine, [0.1], pruned=True)
    sweeps.drive(engine, sweep_id, "test")  # trial 2 queued, not started

    at = open_page("pages/sweeps.py", sweep=sweep_id)
    shown = texts(at)
    assert "lr **search** <b>x</b>" in shown, "the name as typed, not as Markdown or HTML"
    table = at.dataframe[0].value
    assert table["trial"].tolist() == [0, 1, 2]
    assert table["status"].tolist() == ["succeeded", "pruned", "queued"]
    assert table["accuracy"].tolist()[:2] == [0.9, 0.1]
    assert table["lr"].tolist()[:2] == ["0.01", "0.0001"]
    links = [link for link in at.get("page_link")]
    assert any(f"job #{best_job}" in link.proto.label for link in links)
    drawn = {figure["layout"]["title"]["text"]: figure for figure in figures(at)}
    parallel = drawn["accuracy by the values of each trial"]["data"][0]
    labels = [dimension["label"] for dimension in parallel["dimensions"]]
    assert labels == ["log10 lr", "arch", "accuracy"]
    by_trial = drawn["accuracy by trial"]["data"]
    assert {trace["name"] for trace in by_trial} == {"succeeded", "pruned"}
    by_value = drawn["accuracy by lr"]
    assert by_value["layout"]["xaxis"]["type"] == "log"
    assert "Parameter importances appear once two trials" in texts(at), "one has finished"

    _run_trial(engine, [0.3, 0.5])  # a second finished trial: importances can be judged
    at = open_page("pages/sweeps.py", sweep=sweep_id)
    drawn = {figure["layout"]["title"]["text"]: figure for figure in figures(at)}
    assert "lr" in drawn["Parameter importance"]["data"][0]["y"]

    at = show_tab(open_page("pages/job.py", job=best_job), "Spec")
    assert any(f"sweep #{sweep_id}" in link.proto.label for link in at.get("page_link"))


def test_the_sweeps_page_without_sweeps_says_how_to_submit_one(sqlite_engine):
    at = open_page("pages/sweeps.py")
    assert "python -m db sweep submit FILE" in texts(at)

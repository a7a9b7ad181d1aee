"""The Sweeps page through AppTest: the trials of a sweep with their values and objective,
the best trial, the parallel-coordinates plot and the objective by trial; a trial's job page
links back to its sweep. The trials are run as a worker would, without training."""

from __future__ import annotations

from db import queue, sweeps
from tests.dashboard.test_pages import figures, open_page, show_tab, texts
from tests.support.markdown import shown

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


# --- the New sweep form ---------------------------------------------------------------------


def _form(at, kind: str, key: str):
    return getattr(at, kind)(key=f"sweep_form.{key}")


def _start(at):
    from tests.dashboard.test_pages import button

    button(at, "Start sweep").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_new_sweep_form_starts_a_sweep_checked_as_the_cli_checks_it(sqlite_engine):
    at = open_page("pages/sweeps.py")
    assert [e.label for e in at.expander if "New sweep" in e.label], "the form is on the page"
    _form(at, "text_input", "name").set_value("lr & arch <i>search</i>")
    _form(at, "multiselect", "varied").set_value(["lr", "arch"])
    at.run()
    _form(at, "number_input", "space.lr.low").set_value(1e-4)
    _form(at, "number_input", "space.lr.high").set_value(0.05)
    _form(at, "multiselect", "space.arch.values").set_value(["resnet18"])
    _form(at, "selectbox", "direction").set_value("minimize")
    _form(at, "number_input", "trials").set_value(3)
    _form(at, "number_input", "max_concurrent").set_value(1)
    _form(at, "selectbox", "sampler").set_value("random")
    _form(at, "selectbox", "pruner").set_value("asha")
    at.run()
    _form(at, "number_input", "pruner.asha.reduction_factor").set_value(2)
    _form(at, "number_input", "base.epochs").set_value(2)
    _form(at, "number_input", "base.img_size").set_value(16)
    _form(at, "selectbox", "base.device").set_value("cpu")
    _start(at)

    listed = sweeps.list_sweeps(sqlite_engine)
    assert len(listed) == 1, texts(at)
    sweep = listed[0]
    definition = sweep.definition
    assert sweep.name == "lr & arch <i>search</i>"
    assert definition["space"] == {
        "lr": {"type": "log_uniform", "low": 1e-4, "high": 0.05},
        "arch": {"type": "choice", "values": ["resnet18"]},
    }
    assert definition["objective"] == {"metric": "accuracy", "direction": "minimize"}
    assert (definition["trials"], definition["max_concurrent"]) == (3, 1)
    assert definition["sampler"] == "random"
    assert definition["pruner"] == {"type": "asha", "min_epochs": 1, "reduction_factor": 2}
    assert (definition["base"]["epochs"], definition["base"]["img_size"]) == (2, 16)
    assert definition["base"]["device"] == "cpu"
    summary = sweeps.summary(sqlite_engine, sweep.id)
    assert len(summary.trials) == 1, "one trial at a time: the first is queued"
    assert f"Started sweep #{sweep.id}" in texts(at)
    assert at.query_params["sweep"] == str(sweep.id), "the address names the new sweep"
    assert at.dataframe[0].value["trial"].tolist() == [0], "the new sweep's trials are shown"


def test_the_new_sweep_form_refuses_a_bad_definition_naming_the_field(sqlite_engine):
    at = open_page("pages/sweeps.py")
    _form(at, "number_input", "space.lr.low").set_value(0.1)
    _form(at, "number_input", "space.lr.high").set_value(0.001)
    _form(at, "selectbox", "sampler").set_value("grid")
    _form(at, "number_input", "trials").set_value(4)
    _start(at)
    assert sweeps.list_sweeps(sqlite_engine) == []
    errors = [element.value for element in at.error]
    shown_text = texts(at)
    assert "No sweep was started" in shown_text, errors
    assert "Learning rate (space.lr): low 0.1 is above high 0.001" in shown_text, shown_text
    assert "**" not in shown_text and "<" not in shown_text

    # Fixed, but a grid needs listed values: refused again, naming the place.
    _form(at, "number_input", "space.lr.high").set_value(0.5)
    _start(at)
    assert sweeps.list_sweeps(sqlite_engine) == []
    assert "Learning rate (space.lr): a grid needs listed values" in texts(at), texts(at)

    _form(at, "selectbox", "space.lr.kind").set_value("choice")
    at.run()
    _form(at, "text_input", "space.lr.text").set_value("0.01, 0.001, oops")
    _start(at)
    assert "Learning rate (space.lr): 'oops'" in texts(at), texts(at)


def test_a_sweeps_tags_and_note_are_edited_on_its_page_and_set_by_the_form(sqlite_engine):
    at = open_page("pages/sweeps.py")
    _form(at, "text_input", "tags").set_value("lr, first")
    _form(at, "text_area", "note").set_value("see [here](http://x.example) <b>now</b>")
    _form(at, "number_input", "trials").set_value(1)
    _start(at)
    (sweep,) = sweeps.list_sweeps(sqlite_engine)
    assert (sweep.tags, sweep.note) == (["lr", "first"], "see [here](http://x.example) <b>now</b>")
    shown_text = texts(at)
    assert "Tags: lr, first" in shown_text
    assert "see [here](http://x.example) <b>now</b>" in shown_text, "the note as text"

    at.text_input(key=f"sweep.tags.{sweep.id}").set_value("best, lr")
    at.text_area(key=f"sweep.note.{sweep.id}").set_value("")
    at.button(key=f"FormSubmitter:sweep.labels.{sweep.id}-Save tags and note").click().run()
    assert not at.exception
    sweep = sweeps.get_sweep(sqlite_engine, sweep.id)
    assert (sweep.tags, sweep.note) == (["best", "lr"], "")
    assert "Saved the sweep's tags and note." in texts(at)

    at.text_input(key=f"sweep.tags.{sweep.id}").set_value("x" * 80)
    at.button(key=f"FormSubmitter:sweep.labels.{sweep.id}-Save tags and note").click().run()
    assert sweeps.get_sweep(sqlite_engine, sweep.id).tags == ["best", "lr"], "refused"
    errors = [shown(element.value) for element in at.error]
    assert any("a tag must be at most 50 characters" in error for error in errors), errors

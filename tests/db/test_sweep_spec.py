"""Sweep definitions: a valid one reads back as stored, and each mistake is refused at
submit with the place and the problem named."""

from __future__ import annotations

import pytest

from db.spec import SpecError
from db.sweep_spec import parse_sweep

GOOD = {
    "name": "lr on digits",
    "base": {"dataset": "digits", "epochs": 2, "img_size": 16, "device": "cpu"},
    "space": {
        "lr": {"type": "log_uniform", "low": 1e-5, "high": 1e-1},
        "bs": [32, 64],
        "arch": {"type": "choice", "values": ["resnet18", "resnet34"]},
    },
    "objective": {"metric": "accuracy"},
    "trials": 8,
    "max_concurrent": 2,
    "sampler": "tpe",
    "pruner": {"type": "median", "startup_trials": 2},
}


def _with(**changes):
    return {**GOOD, **changes}


def test_a_good_definition_reads_back_as_it_is_stored():
    sweep = parse_sweep(_with(first_trials=[{"lr": 0.01, "bs": 64}]), {"digits"})
    assert sweep.first_trials == ({"lr": 0.01, "bs": 64},)
    assert (sweep.metric, sweep.direction) == ("accuracy", "maximize")
    assert sweep.pruner_options == {"startup_trials": 2, "warmup_epochs": 0}
    assert [param.field for param in sweep.space] == ["lr", "bs", "arch"]
    assert parse_sweep(sweep.as_json()) == sweep
    assert sweep.trial_spec({"lr": 0.01})["lr"] == 0.01


def test_a_grid_of_listed_values_runs_each_point_once():
    grid = _with(space={"bs": [32, 64], "img_size": {"type": "int", "low": 16, "high": 24,
                                                     "step": 8}},
                 sampler="grid", trials=4)  # fmt: skip
    sweep = parse_sweep(grid)
    assert [param.grid_values() for param in sweep.space] == [(32, 64), (16, 24)]


@pytest.mark.parametrize(
    ("definition", "where", "message"),
    [
        (_with(space={"lrate": [0.1]}), "space.lrate", "is not a spec field"),
        (_with(space={"dataset": ["a"]}), "space.dataset", "cannot be varied"),
        (_with(space={}), "space", "at least one spec field"),
        (_with(space={"bs": []}), "space.bs", "an empty choice"),
        (
            _with(space={"lr": {"type": "uniform", "low": 0.1, "high": 0.01}}),
            "space.lr",
            "low 0.1 is above high 0.01",
        ),
        (
            _with(space={"lr": {"type": "uniform", "low": 0.1, "high": 0.1}}),
            "space.lr",
            "an empty range",
        ),
        (
            _with(space={"lr": {"type": "log_uniform", "low": 0, "high": 0.1}}),
            "space.lr.low",
            "greater than 0 on a log scale",
        ),
        (
            _with(space={"lr": {"type": "uniform", "low": 0.1, "high": 20}}),
            "space.lr",
            "20: must be at most 10",
        ),
        (_with(space={"bs": [32, 0]}), "space.bs", "0: must be at least 1"),
        (_with(space={"bs": [32, 32]}), "space.bs", "lists a value twice"),
        (
            _with(space={"arch": {"type": "int", "low": 1, "high": 2}}),
            "space.arch",
            "must be {type: choice",
        ),
        (
            _with(space={"lr": {"type": "uniform", "low": 0.1, "high": 0.2, "step": 1}}),
            "space.lr.step",
            "is not part of a uniform range",
        ),
        (_with(space={"epochs": [1, 2]}), "space.epochs", "fix epochs in base"),
        (_with(sampler="grid"), "space.lr", "a grid needs listed values"),
        (
            _with(sampler="grid", space={"bs": [16, 32, 64]}, trials=2),
            "trials",
            "the grid has 3 points, more than trials (2)",
        ),
        (_with(sampler="grid", space={"bs": [16, 32]}, trials=3), "trials", "would repeat them"),
        (
            _with(sampler="grid", space={"seed": {"type": "int", "low": 0, "high": 5000}}),
            "space",
            "more than 1000 points",
        ),
        (_with(objective={"metric": "f1"}), "objective.metric", "must be one of valid_loss"),
        (
            _with(objective={"metric": "accuracy", "direction": "up"}),
            "objective.direction",
            "minimize or maximize",
        ),
        (_with(trials=0), "trials", "from 1 to 1000"),
        (_with(trials=True), "trials", "from 1 to 1000"),
        (_with(max_concurrent=0), "max_concurrent", "from 1 to 100"),
        (_with(sampler="bayes"), "sampler", "random, tpe, grid"),
        (_with(pruner="asap"), "pruner", "must be one of none, median, asha, hyperband"),
        (
            _with(pruner={"type": "asha", "patience": 2}),
            "pruner.patience",
            "not an option of the asha pruner",
        ),
        (
            _with(pruner={"type": "hyperband", "min_epochs": 3}),
            "pruner.min_epochs",
            "must be below the base's epochs (2)",
        ),
        (
            _with(pruner={"type": "asha", "min_epochs": 2}),
            "pruner.min_epochs",
            "the pruner is not asked after a trial's last epoch",
        ),
        (
            _with(pruner={"type": "median", "warmup_epochs": 2}),
            "pruner.warmup_epochs",
            "must be below the base's epochs (2)",
        ),
        (
            _with(base={"dataset": "digits", "epochs": 1, "device": "cpu"}, pruner="asha"),
            "pruner",
            "base epochs must be 2 or more",
        ),
        (_with(base={"epochs": 0}), "base.epochs", "must be at least 1"),
        (_with(base={"dataset": "pets"}), "base.dataset", "unknown dataset 'pets'"),
        (_with(colour="blue"), "colour", "is not part of a sweep definition"),
        ([1, 2], "sweep", "must be a mapping"),
        (_with(first_trials=[{"wd": 0.1}]), "first_trials[0].wd", "not a field of the space"),
        (_with(first_trials=[{"lr": 0.5}]), "first_trials[0].lr", "0.5 is not in the space"),
        (_with(first_trials=[{"bs": 48}]), "first_trials[0].bs", "48 is not in the space"),
        (_with(first_trials=[{}] * 9), "first_trials", "lists 9 trials, more than trials (8)"),
    ],
)
def test_a_bad_definition_is_refused_naming_the_problem(definition, where, message):
    with pytest.raises(SpecError) as refused:
        parse_sweep(definition, {"digits"})
    assert message in refused.value.problems.get(where, ""), refused.value.problems


def test_a_batch_larger_than_the_dataset_is_refused():
    with pytest.raises(SpecError) as refused:
        parse_sweep(GOOD, {"digits"}, training_images=40)
    assert refused.value.problems == {
        "space.bs": "batch size 64 is larger than the 40 training images of dataset 'digits'"
    }

"""A sweep definition: a base job spec, which spec fields to vary and how, the objective, how
many trials (and how many at once), the sampler and the pruner.

`parse_sweep` checks all of it before anything is stored and raises `SpecError` whose
problems name the place, e.g. `space.lr` or `base.bs`, in words a person understands. Every
bound and every listed value of the space is checked as that field of the base spec, so each
trial's spec is valid whatever the sampler draws (the fields that depend on each other,
mixed_precision and cores against device, cannot be varied together: device is not searchable).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from db.spec import (
    EPOCH_METRICS,
    JobSpec,
    Labels,
    SpecError,
    lower_is_better,
    parse_labels,
    parse_spec,
)

SAMPLERS = ("random", "tpe", "grid")
PRUNERS = ("none", "median", "asha", "hyperband")
DIRECTIONS = ("minimize", "maximize")
MAX_TRIALS = 1000
MAX_CONCURRENT = 100
MAX_CHOICES = 100
# Spec fields a sweep may vary, by the ranges they take. The rest (dataset, device, the
# validation split, limits) stay fixed in the base, so that every trial is measured alike.
FLOAT_FIELDS = ("lr", "wd", "grad_clip")
INT_FIELDS = ("bs", "img_size", "epochs", "grad_accum", "seed")
CHOICE_FIELDS = ("arch", "schedule", "augment", "pretrained", "mixed_precision")
SEARCHABLE = FLOAT_FIELDS + INT_FIELDS + CHOICE_FIELDS
KINDS = {
    **dict.fromkeys(FLOAT_FIELDS, ("log_uniform", "uniform", "choice")),
    **dict.fromkeys(INT_FIELDS, ("int", "choice")),
    **dict.fromkeys(CHOICE_FIELDS, ("choice",)),
}
TOP_LEVEL = (
    "name", "base", "space", "objective", "trials", "max_concurrent", "sampler", "seed",
    "pruner", "first_trials", "tags", "note",
)  # fmt: skip
PRUNER_OPTIONS = {
    "none": {},
    # Optuna's MedianPruner: a trial whose epoch is worse than the median of the finished
    # trials at that epoch stops, once `startup_trials` have finished.
    "median": {"startup_trials": 1, "warmup_epochs": 0},
    # Optuna's SuccessiveHalvingPruner (asynchronous successive halving, ASHA) and
    # HyperbandPruner; the resource is the epoch, up to the base's epochs.
    "asha": {"min_epochs": 1, "reduction_factor": 3},
    "hyperband": {"min_epochs": 1, "reduction_factor": 3},
}


@dataclass(frozen=True)
class Param:
    """How one spec field varies: a range (`low`..`high`, on a log scale for log_uniform or
    with `log`) or listed `values`."""

    field: str
    kind: str  # log_uniform | uniform | int | choice
    low: float | None = None
    high: float | None = None
    step: int = 1
    log: bool = False
    values: tuple[Any, ...] = ()

    def grid_values(self) -> tuple[Any, ...]:
        if self.kind == "choice":
            return self.values
        assert self.kind == "int" and self.low is not None and self.high is not None
        return tuple(range(int(self.low), int(self.high) + 1, self.step))

    def admits(self, value: Any) -> bool:
        """Whether `value` is one this range can draw."""
        if self.kind == "choice":
            return json.dumps(value) in {json.dumps(choice) for choice in self.values}
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        assert self.low is not None and self.high is not None
        return self.low <= value <= self.high

    def as_json(self) -> dict[str, Any]:
        if self.kind == "choice":
            return {"type": "choice", "values": list(self.values)}
        data: dict[str, Any] = {"type": self.kind, "low": self.low, "high": self.high}
        if self.kind == "int":
            data.update(step=self.step, log=self.log)
        return data


@dataclass(frozen=True)
class SweepSpec:
    name: str
    base: JobSpec
    space: tuple[Param, ...]
    metric: str
    direction: str
    trials: int
    max_concurrent: int
    sampler: str
    seed: int
    pruner: str
    pruner_options: dict[str, int]
    # Values to try first, in order, before the sampler draws (Optuna's enqueue_trial).
    first_trials: tuple[dict[str, Any], ...] = ()
    # The sweep's own tags and note as given at submit. They are edited later, so the sweep's
    # row keeps them (db.sweeps) and `as_json` leaves them out of the stored definition.
    labels: Labels = dataclasses.field(default_factory=Labels)

    @property
    def display_name(self) -> str:
        fields = ", ".join(param.field for param in self.space)
        return self.name or f"{self.metric} over {fields}"

    def trial_spec(self, params: dict[str, Any]) -> dict[str, Any]:
        """The job spec of a trial: the base with the trial's values."""
        return {**self.base.model_dump(mode="json"), **params}

    def as_json(self) -> dict[str, Any]:
        """The definition as stored, in the form `parse_sweep` reads back."""
        return {
            "name": self.name,
            "base": self.base.model_dump(mode="json"),
            "space": {param.field: param.as_json() for param in self.space},
            "objective": {"metric": self.metric, "direction": self.direction},
            "trials": self.trials,
            "max_concurrent": self.max_concurrent,
            "sampler": self.sampler,
            "seed": self.seed,
            "pruner": {"type": self.pruner, **self.pruner_options},
            "first_trials": [dict(values) for values in self.first_trials],
        }


class _Problems:
    """Collects every problem of a definition, so one refusal lists them all."""

    def __init__(self) -> None:
        self.found: dict[str, str] = {}

    def add(self, where: str, message: str) -> None:
        self.found.setdefault(where, message)

    def raise_any(self) -> None:
        if self.found:
            raise SpecError(self.found)


def _whole(value: Any, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def parse_sweep(
    data: Any, known_datasets: set[str] | None = None, training_images: int | None = None
) -> SweepSpec:
    """Validate a sweep definition (a mapping, as read from JSON or YAML), or raise
    SpecError naming each problem. `training_images` is how many images the base's dataset
    trains on, where known, so that no batch size of the space is larger."""
    if not isinstance(data, dict):
        raise SpecError({"sweep": "must be a mapping of name, base, space, objective, …"})
    problems = _Problems()
    for key in data:
        if key not in TOP_LEVEL:
            problems.add(str(key), f"is not part of a sweep definition ({', '.join(TOP_LEVEL)})")
    base = _base(data.get("base", {}), known_datasets, problems)
    name = data.get("name", "")
    if not isinstance(name, str) or len(name) > 200:
        problems.add("name", "must be text of at most 200 characters")
    metric, direction = _objective(data.get("objective"), problems)
    trials = _whole(data.get("trials"), 1, MAX_TRIALS)
    if trials is None:
        problems.add("trials", f"must be a whole number from 1 to {MAX_TRIALS}")
    max_concurrent = _whole(data.get("max_concurrent", 1), 1, MAX_CONCURRENT)
    if max_concurrent is None:
        problems.add("max_concurrent", f"must be a whole number from 1 to {MAX_CONCURRENT}")
    sampler = data.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        problems.add("sampler", f"must be one of {', '.join(SAMPLERS)}")
    seed = _whole(data.get("seed", 0), 0, 2**31 - 1)
    if seed is None:
        problems.add("seed", "must be a whole number from 0 to 2147483647")
    pruner, options = _pruner(data.get("pruner", "none"), problems)
    space = _space(data.get("space"), base, pruner, training_images, problems)
    first_trials = _first_trials(data.get("first_trials", []), space, trials, problems)
    labels = _labels(data, problems)
    problems.raise_any()
    assert base is not None and trials is not None and max_concurrent is not None
    if sampler == "grid":
        _check_grid(space, trials, problems)
    if "bs" not in {param.field for param in space} and (
        problem := _batch_problem(base, training_images)
    ):
        problems.add("base.bs", problem)
    if (problem := _pruner_problem(pruner, options, base.epochs)) is not None:
        problems.add(*problem)
    problems.raise_any()
    return SweepSpec(
        name=name.strip(),
        base=base,
        space=space,
        metric=metric,
        direction=direction,
        trials=trials,
        max_concurrent=max_concurrent,
        sampler=sampler,
        seed=seed or 0,
        pruner=pruner,
        pruner_options=options,
        first_trials=first_trials,
        labels=labels,
    )


def _pruner_problem(pruner: str, options: dict[str, int], epochs: int) -> tuple[str, str] | None:
    """A pruner that could never stop a trial: it is not asked after a trial's last epoch
    (db.sweeps.report_epoch), so it must be able to judge one before."""
    if pruner == "none":
        return None
    if epochs < 2:
        return (
            "pruner",
            "a pruner stops trials before their last epoch: base epochs must be 2 or more",
        )
    if pruner == "median" and options["warmup_epochs"] >= epochs:
        return "pruner.warmup_epochs", f"must be below the base's epochs ({epochs})"
    if pruner in ("asha", "hyperband") and options["min_epochs"] >= epochs:
        return (
            "pruner.min_epochs",
            f"must be below the base's epochs ({epochs}): the pruner is not asked after a "
            "trial's last epoch",
        )
    return None


def _labels(data: dict[str, Any], problems: _Problems) -> Labels:
    """The sweep's tags and note, by the rules of a job's."""
    try:
        return parse_labels({key: data[key] for key in ("tags", "note") if key in data})
    except SpecError as exc:
        for field, message in exc.problems.items():
            problems.add(field, message)
        return Labels()


class _Loader(yaml.SafeLoader):
    """YAML as people write it: `1e-5` is a number (YAML 1.1 wants `1.0e-5`)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def definition_from_text(text: str) -> Any:
    """A definition as written in a YAML or JSON file (JSON is YAML too), not yet checked."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be read"
        raise SpecError({"sweep": f"is not valid YAML or JSON ({problem}{where})"}) from None
    except RecursionError:
        raise SpecError({"sweep": "is nested too deeply to be a sweep definition"}) from None


def _first_trials(
    data: Any, space: tuple[Param, ...], trials: int | None, problems: _Problems
) -> tuple[dict[str, Any], ...]:
    """Trials to run first: each maps fields of the space to a value it admits."""
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        problems.add("first_trials", "must be a list of {field: value} mappings")
        return ()
    if trials is not None and len(data) > trials:
        problems.add("first_trials", f"lists {len(data)} trials, more than trials ({trials})")
    params = {param.field: param for param in space}
    for index, values in enumerate(data):
        for field, value in values.items():
            where = f"first_trials[{index}].{field}"
            if field not in params:
                problems.add(where, "is not a field of the space")
            elif not params[field].admits(value):
                problems.add(where, f"{value!r} is not in the space of {field}")
    return tuple(data)


def _base(data: Any, known_datasets: set[str] | None, problems: _Problems) -> JobSpec | None:
    try:
        return parse_spec(data, known_datasets)
    except SpecError as exc:
        for field, message in exc.problems.items():
            problems.add(f"base.{field}", message)
        return None


def _objective(data: Any, problems: _Problems) -> tuple[str, str]:
    """The epoch metric and its direction; a bare metric name takes the natural direction."""
    if isinstance(data, str):
        data = {"metric": data}
    if not isinstance(data, dict):
        problems.add("objective", "must name an epoch metric, e.g. {metric: valid_loss}")
        return "valid_loss", "minimize"
    metric = data.get("metric")
    if metric not in EPOCH_METRICS:
        problems.add("objective.metric", f"must be one of {', '.join(EPOCH_METRICS)}")
        return "valid_loss", "minimize"
    natural = "minimize" if lower_is_better(metric) else "maximize"
    direction = data.get("direction", natural)
    if direction not in DIRECTIONS:
        problems.add("objective.direction", "must be minimize or maximize")
    for key in data:
        if key not in ("metric", "direction"):
            problems.add(f"objective.{key}", "is not part of an objective (metric, direction)")
    return metric, direction


def _pruner(data: Any, problems: _Problems) -> tuple[str, dict[str, int]]:
    if isinstance(data, str):
        data = {"type": data}
    if not isinstance(data, dict) or data.get("type") not in PRUNERS:
        problems.add("pruner", f"must be one of {', '.join(PRUNERS)} (or {{type: …, options}})")
        return "none", {}
    kind = data["type"]
    options = dict(PRUNER_OPTIONS[kind])
    for key, value in data.items():
        if key == "type":
            continue
        if key not in options:
            known = ", ".join(options) or "none"
            problems.add(f"pruner.{key}", f"is not an option of the {kind} pruner ({known})")
            continue
        low = 2 if key == "reduction_factor" else (1 if key == "min_epochs" else 0)
        whole = _whole(value, low, 1000)
        if whole is None:
            problems.add(f"pruner.{key}", f"must be a whole number from {low} to 1000")
        else:
            options[key] = whole
    return kind, options


def _space(
    data: Any,
    base: JobSpec | None,
    pruner: str,
    training_images: int | None,
    problems: _Problems,
) -> tuple[Param, ...]:
    if not isinstance(data, dict) or not data:
        problems.add("space", "must map at least one spec field to its range or values")
        return ()
    params = []
    for field, range_ in data.items():
        where = f"space.{field}"
        if field not in JobSpec.model_fields:
            problems.add(where, "is not a spec field")
        elif field not in SEARCHABLE:
            problems.add(where, f"cannot be varied (searchable: {', '.join(SEARCHABLE)})")
        elif field == "epochs" and pruner != "none":
            problems.add(where, "the pruner's resource is the epoch: fix epochs in base")
        elif (param := _param(field, range_, where, problems)) is not None and base is not None:
            _check_values(param, base, training_images, where, problems)
            params.append(param)
    return tuple(params)


def _param(field: str, data: Any, where: str, problems: _Problems) -> Param | None:
    """The shape of one range, before its values are checked against the spec."""
    kinds = KINDS[field]
    if isinstance(data, list):
        data = {"type": "choice", "values": data}
    if not isinstance(data, dict) or data.get("type") not in kinds:
        problems.add(where, f"must be {{type: {' | '.join(kinds)}, …}} or a list of values")
        return None
    kind = data["type"]
    allowed = {"choice": ("values",), "int": ("low", "high", "step", "log")}.get(
        kind, ("low", "high")
    )
    for key in data:
        if key != "type" and key not in allowed:
            problems.add(f"{where}.{key}", f"is not part of a {kind} range ({', '.join(allowed)})")
            return None
    if kind == "choice":
        values = data.get("values")
        if not isinstance(values, list) or not values:
            problems.add(where, "an empty choice: list at least one value")
            return None
        if len(values) > MAX_CHOICES:
            problems.add(where, f"lists more than {MAX_CHOICES} values")
            return None
        if len({json.dumps(value) for value in values}) < len(values):
            problems.add(where, "lists a value twice")
            return None
        return Param(field, kind, values=tuple(values))
    return _range(field, kind, data, where, problems)


def _range(
    field: str, kind: str, data: dict[str, Any], where: str, problems: _Problems
) -> Param | None:
    low, high = data.get("low"), data.get("high")
    number = (int,) if kind == "int" else (int, float)
    for key, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, number) or not math.isfinite(value):
            what = "a whole number" if kind == "int" else "a number"
            problems.add(f"{where}.{key}", f"must be {what}")
            return None
    if low > high:
        problems.add(where, f"low {low:g} is above high {high:g}")
        return None
    if low == high:
        problems.add(where, f"an empty range: low and high are both {low:g}; fix it in base")
        return None
    log = kind == "log_uniform" or bool(data.get("log", False))
    if log and low <= 0:
        problems.add(f"{where}.low", "must be greater than 0 on a log scale")
        return None
    step = data.get("step", 1)
    if kind == "int" and _whole(step, 1, int(high - low)) is None:
        problems.add(f"{where}.step", f"must be a whole number from 1 to {high - low}")
        return None
    return Param(field, kind, low=low, high=high, step=step, log=log)


def _check_values(
    param: Param, base: JobSpec, training_images: int | None, where: str, problems: _Problems
) -> None:
    """Each bound or listed value must be valid as that field of the base spec."""
    values = param.values if param.kind == "choice" else (param.low, param.high)
    for value in values:
        try:
            spec = parse_spec({**base.model_dump(mode="json"), param.field: value})
        except SpecError as exc:
            message = exc.problems.get(param.field) or "; ".join(exc.problems.values())
            problems.add(where, f"{value!r}: {message}")
            return
        if param.field == "bs" and (problem := _batch_problem(spec, training_images)):
            problems.add(where, problem)
            return


def _batch_problem(spec: JobSpec, training_images: int | None) -> str | None:
    if training_images is None or spec.bs <= training_images:
        return None
    return (
        f"batch size {spec.bs} is larger than the {training_images} training images of "
        f"dataset {spec.dataset!r}"
    )


def _check_grid(space: tuple[Param, ...], trials: int, problems: _Problems) -> None:
    """A grid lists every point once: its size must be the number of trials."""
    size = 1
    for param in space:
        if param.kind not in ("choice", "int"):
            problems.add(
                f"space.{param.field}",
                f"a grid needs listed values, not a {param.kind} range: use a choice",
            )
            return
        size *= len(param.grid_values())
        if size > MAX_TRIALS:
            problems.add("space", f"the grid has more than {MAX_TRIALS} points")
            return
    if size > trials:
        problems.add(
            "trials", f"the grid has {size} points, more than trials ({trials}): raise trials "
            f"to {size} or list fewer values"
        )  # fmt: skip
    elif size < trials:
        problems.add(
            "trials", f"the grid has {size} points; trials ({trials}) would repeat them: set "
            f"trials to {size}"
        )  # fmt: skip

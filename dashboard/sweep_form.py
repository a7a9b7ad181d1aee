"""The New sweep form on the Sweeps page: a base spec (the New job form's own fields), the
fields to vary with their ranges or values, the objective and its direction, how many trials
and how many at once, the sampler and the pruner.

The widgets of a varied field come from the same field definitions as the New job form
(`dashboard.spec_form.describe`: label, bounds, choices) and from the kinds of range a sweep
allows for it (`db.sweep_spec.KINDS`). The form only gathers a definition; it is checked by
`db.sweeps.submit_sweep`, as `python -m db sweep submit` and the API check it, and each problem
is shown as text naming its place (`space.lr: low 0.1 is above high 0.001`).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from common.errors import first_line
from dashboard import spec_form
from dashboard.format import plain
from db import queue, sweeps
from db.engine import DatabaseError, Engine
from db.spec import EPOCH_METRICS, SpecError, lower_is_better
from db.sweep_spec import (
    KINDS,
    MAX_CONCURRENT,
    MAX_TRIALS,
    PRUNER_OPTIONS,
    PRUNERS,
    SAMPLERS,
    SEARCHABLE,
)

PREFIX = "sweep_form."
BASE_PREFIX = PREFIX + "base."
SPACE_PREFIX = PREFIX + "space."
PROBLEMS_KEY = PREFIX + "problems"
STARTED_KEY = PREFIX + "started"
# The sweep names its trials and carries its own tags and note: the base leaves them out.
BASE_LEAVES_OUT = ("name", "tags", "note")
# A range offered when a field is first picked to vary (any range within the field's bounds
# may be typed instead).
SUGGESTED = {
    "lr": (1e-5, 1e-1),
    "wd": (1e-5, 1e-1),
    "grad_clip": (0.1, 10.0),
    "bs": (16, 128),
    "img_size": (16, 64),
    "epochs": (1, 10),
    "grad_accum": (1, 4),
    "seed": (0, 9),
}
KIND_LABELS = {
    "log_uniform": "range, log scale",
    "uniform": "range, linear scale",
    "int": "whole numbers in a range",
    "choice": "listed values",
}
NATURAL = "natural"
PRUNER_OPTION_LOW = {"reduction_factor": 2, "min_epochs": 1}


def _key(*parts: str) -> str:
    return PREFIX + ".".join(parts)


def _bounded(field: spec_form.FieldKind, value: float) -> float:
    if field.minimum is not None and value < field.minimum:
        value = field.minimum
    if field.maximum is not None and value > field.maximum:
        value = field.maximum
    return value


def _choices(field: spec_form.FieldKind) -> tuple[Any, ...]:
    return field.choices if field.kind == "choice" else (True, False)


def _listed_numbers(text: str, whole: bool) -> list[Any]:
    """Comma-separated values as numbers; an item that is not one is passed on as typed, so
    that the definition's check names it."""
    values: list[Any] = []
    for item in (item.strip() for item in text.split(",")):
        if not item:
            continue
        try:
            number = float(item)
            values.append(int(number) if whole and number.is_integer() else number)
        except ValueError:
            values.append(item)
    return values


def range_widgets(field: spec_form.FieldKind) -> dict[str, Any]:
    """The widgets of one varied field; its range (or values) as the definition writes it."""
    name = field.name
    kinds = KINDS[name]
    kind = kinds[0]
    if len(kinds) > 1:
        kind = st.selectbox(
            f"{field.label}: values to try",
            kinds,
            format_func=KIND_LABELS.__getitem__,
            key=SPACE_PREFIX + name + ".kind",
        )
    if kind == "choice":
        if field.kind in ("choice", "bool"):
            options = _choices(field)
            values = st.multiselect(
                f"{field.label}: values",
                options,
                default=list(options[:2]),
                format_func=str,
                key=SPACE_PREFIX + name + ".values",
            )
            return {"type": "choice", "values": list(values)}
        text = st.text_input(
            f"{field.label}: values, separated by commas",
            key=SPACE_PREFIX + name + ".text",
            placeholder="e.g. 0.001, 0.01",
        )
        return {"type": "choice", "values": _listed_numbers(text, field.kind == "int")}
    whole = kind == "int"
    cast = int if whole else float
    low, high = SUGGESTED.get(name, (field.minimum or 0, field.maximum or 1))
    options: dict[str, Any] = {
        "min_value": None if field.minimum is None else cast(field.minimum),
        "max_value": None if field.maximum is None else cast(field.maximum),
        "step": 1 if whole else spec_form.FLOAT_STEPS.get(name, 0.01),
        "format": "%d" if whole else "%g",
    }
    left, right = st.columns(2)
    chosen_low = left.number_input(
        f"{field.label}: low", value=cast(_bounded(field, low)), key=SPACE_PREFIX + name + ".low",
        **options,
    )  # fmt: skip
    chosen_high = right.number_input(
        f"{field.label}: high", value=cast(_bounded(field, high)),
        key=SPACE_PREFIX + name + ".high", **options,
    )  # fmt: skip
    data: dict[str, Any] = {"type": kind, "low": chosen_low, "high": chosen_high}
    if whole:
        data["step"] = st.number_input(
            f"{field.label}: step", min_value=1, value=1, step=1, key=SPACE_PREFIX + name + ".step"
        )
    return data


def space_widgets() -> dict[str, Any]:
    fields = {name: spec_form.describe(name, BASE_PREFIX) for name in SEARCHABLE}
    varied = st.multiselect(
        "Fields to vary",
        list(SEARCHABLE),
        default=["lr"],
        format_func=lambda name: fields[name].label,
        key=_key("varied"),
        help="Every other field keeps the base's value in every trial.",
    )
    space = {}
    for name in varied:
        with st.container(border=True):
            space[name] = range_widgets(fields[name])
    return space


def objective_widgets() -> dict[str, Any]:
    left, right = st.columns(2)
    metric = left.selectbox(
        "Objective (an epoch metric)",
        EPOCH_METRICS,
        index=EPOCH_METRICS.index("accuracy"),
        key=_key("metric"),
    )
    natural = "minimize" if lower_is_better(metric) else "maximize"
    direction = right.selectbox(
        "Direction",
        (NATURAL, "minimize", "maximize"),
        format_func=lambda d: f"{natural} (natural for {metric})" if d == NATURAL else d,
        key=_key("direction"),
    )
    objective = {"metric": metric}
    if direction != NATURAL:
        objective["direction"] = direction
    return objective


def search_widgets() -> dict[str, Any]:
    columns = st.columns(4)
    trials = columns[0].number_input(
        "Trials", min_value=1, max_value=MAX_TRIALS, value=8, step=1, key=_key("trials")
    )
    at_once = columns[1].number_input(
        "At most at once", min_value=1, max_value=MAX_CONCURRENT, value=2, step=1,
        key=_key("max_concurrent"), help="How many trials may be queued or running together.",
    )  # fmt: skip
    sampler = columns[2].selectbox(
        "Sampler", SAMPLERS, index=SAMPLERS.index("tpe"), key=_key("sampler")
    )
    seed = columns[3].number_input(
        "Sampler seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key=_key("seed")
    )
    pruner = st.selectbox(
        "Pruner (stops hopeless trials after an epoch)",
        PRUNERS,
        key=_key("pruner"),
        help="median: Optuna's MedianPruner; asha: successive halving; hyperband. The "
        "resource is the epoch, up to the base's epochs.",
    )
    chosen: dict[str, Any] = {"type": pruner}
    options = PRUNER_OPTIONS[pruner]
    if options:
        columns = st.columns(len(options))
        for column, (option, default) in zip(columns, options.items(), strict=True):
            chosen[option] = column.number_input(
                option.replace("_", " ").capitalize(),
                min_value=PRUNER_OPTION_LOW.get(option, 0),
                max_value=1000,
                value=default,
                step=1,
                key=_key("pruner", pruner, option),
            )
    return {
        "trials": int(trials),
        "max_concurrent": int(at_once),
        "sampler": sampler,
        "seed": int(seed),
        "pruner": chosen,
    }


def base_widgets(engine: Engine) -> dict[str, Any]:
    """The base spec, with the New job form's widgets (kept apart from that form's values)."""
    spec_form.set_defaults(BASE_PREFIX, BASE_LEAVES_OUT)
    names = sorted(queue.known_dataset_names(engine))
    dataset_key = BASE_PREFIX + "dataset"
    if st.session_state.get(dataset_key) not in names:
        names.append(st.session_state[dataset_key])
    st.selectbox("Dataset", names, key=dataset_key)
    for title, fields in spec_form.form_fields(BASE_PREFIX, BASE_LEAVES_OUT).items():
        st.markdown(f"**{plain(title)}**")
        columns = st.columns(3)
        for index, field in enumerate(fields):
            with columns[index % 3]:
                spec_form.render_field(field, None)
    return spec_form.collect(BASE_PREFIX, BASE_LEAVES_OUT)


def problem_lines(problems: dict[str, str]) -> list[str]:
    """`Learning rate (space.lr): low 0.1 is above high 0.001`: the place, named as the
    definition names it, with the field's label where it is a spec field."""
    lines = []
    for where, message in problems.items():
        parts = where.split(".")
        field = parts[1] if len(parts) > 1 and parts[0] in ("space", "base") else None
        label = spec_form.LABELS.get(field) if field else None
        lines.append(f"{label} ({where}): {message}" if label else f"{where}: {message}")
    return lines


def submit(engine: Engine, definition: dict[str, Any]) -> None:
    try:
        sweep_id = sweeps.submit_sweep(engine, definition)
    except SpecError as exc:
        st.session_state[PROBLEMS_KEY] = exc.problems
        st.session_state.pop(STARTED_KEY, None)
        return
    except DatabaseError as exc:
        st.session_state[PROBLEMS_KEY] = {"sweep": f"the database refused it: {first_line(exc)}"}
        return
    st.session_state.pop(PROBLEMS_KEY, None)
    st.session_state[STARTED_KEY] = sweep_id
    st.query_params["sweep"] = str(sweep_id)


def new_sweep_form(engine: Engine) -> None:
    """The form's widgets and its Start button; what the last Start said."""
    name = st.text_input(
        "Sweep name", key=_key("name"), placeholder="empty: named by its objective"
    )
    st.markdown("**What to vary**")
    space = space_widgets()
    st.markdown("**Objective and search**")
    objective = objective_widgets()
    search = search_widgets()
    left, right = st.columns(2)
    tags = left.text_input("Sweep tags", key=_key("tags"), help="Separated by commas.")
    note = right.text_area("Sweep note", key=_key("note"), help="Markdown source; shown as text.")
    with st.expander("Base spec: what every trial starts from"):
        base = base_widgets(engine)
    definition = {
        "name": name, "base": base, "space": space, "objective": objective, **search,
        "tags": tags, "note": note,
    }  # fmt: skip
    # Checked after every widget has drawn this run's values, so the definition is the one shown.
    if st.button("Start sweep", type="primary", icon=":material/play_arrow:"):
        submit(engine, definition)
        st.rerun()  # the list of sweeps above now holds the new one
    problems = st.session_state.get(PROBLEMS_KEY)
    if problems:
        st.error(plain("No sweep was started:\n" + "\n".join(problem_lines(problems))))
    started = st.session_state.get(STARTED_KEY)
    if started is not None:
        st.success(f"Started sweep #{started}; its first trials are queued.")

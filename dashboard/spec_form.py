"""The New job form, built from `db.spec.JobSpec` so that it stays in step with the spec.

Each spec field becomes a widget by its type: a choice (Literal) a select box, a bool a
checkbox, a number a number input with the field's bounds (empty allowed when the field may
be None), a number-or-word field (`lr`: a number or "find") a number input plus a checkbox,
a list (`tags`) a text input of comma-separated items, and the note a text area.
Labels and grouping are a presentation choice made here; a field this module has never heard
of still appears, under "More", with its description as help.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
import streamlit as st

from dashboard.format import plain
from db.spec import JobSpec

KEY_PREFIX = "spec."
DATASET_KEY = KEY_PREFIX + "dataset"

LABELS = {
    "name": "Job name",
    "arch": "Architecture",
    "pretrained": "Start from pretrained weights",
    "epochs": "Epochs",
    "lr": "Learning rate",
    "schedule": "Schedule",
    "bs": "Batch size",
    "img_size": "Image size (px)",
    "valid_pct": "Validation share",
    "seed": "Random seed",
    "augment": "Augment images",
    "mixed_precision": "Mixed precision",
    "grad_accum": "Gradient accumulation (batches)",
    "grad_clip": "Gradient clipping (max norm)",
    "wd": "Weight decay",
    "device": "Device",
    "cores": "XLA cores",
    "hosts": "Hosts (TPU VMs of one slice)",
    "priority": "Priority",
    "max_attempts": "Max attempts",
    "time_limit": "Time limit (s)",
    "tags": "Tags",
    "note": "Note",
    "monitor": "Watched metric",
    "early_stop": "Stop early after epochs without improvement",
    "min_delta": "Smallest improvement that counts",
    "keep": "Model to keep (last or best epoch)",
}
WORD_LABELS = {("lr", "find"): "Find it first with lr_find, and use its suggestion"}
SECTIONS = {
    "Model and data": ["arch", "pretrained", "img_size", "augment", "valid_pct", "seed"],
    "Training": ["epochs", "lr", "schedule", "bs", "wd", "grad_accum", "grad_clip"],
    "Where it runs": [
        "name",
        "device",
        "cores",
        "hosts",
        "mixed_precision",
        "priority",
        "max_attempts",
    ],
    "Stopping and keeping": ["monitor", "early_stop", "min_delta", "keep"],
    "Limits": ["time_limit"],
    "Tags and note": ["tags", "note"],
}
# Text fields edited in a text area (several lines).
TEXT_AREAS = ("note",)
# Fields the page renders itself (the dataset picker shows counts and sample images).
RENDERED_BY_PAGE = ("dataset",)
FLOAT_STEPS = {"lr": 1e-4, "valid_pct": 0.05, "wd": 0.01, "grad_clip": 0.5, "min_delta": 0.001}


@dataclass(frozen=True)
class FieldKind:
    name: str
    kind: Literal["text", "list", "choice", "bool", "int", "float"]
    optional: bool = False
    choices: tuple[Any, ...] = ()
    words: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    default: Any = None
    description: str = ""
    # Where its widgets keep their values: the New job form's, or another form's (a sweep's base).
    prefix: str = KEY_PREFIX

    @property
    def label(self) -> str:
        return LABELS.get(self.name, self.name.replace("_", " ").capitalize())

    @property
    def key(self) -> str:
        return self.prefix + self.name

    def word_key(self, word: str) -> str:
        return f"{self.key}.{word}"

    def help(self) -> str:
        parts = [self.description]
        if self.kind in ("int", "float"):
            low = "" if self.minimum is None else f"{self.minimum:g}"
            high = "" if self.maximum is None else f"{self.maximum:g}"
            if low or high:
                parts.append(f"Range: {low} to {high}.")
        shown_default = "empty" if self.default in (None, "", ()) else self.default
        parts.append(f"Default: {shown_default}.")
        return " ".join(part for part in parts if part)


def describe(name: str, prefix: str = KEY_PREFIX) -> FieldKind:
    """How field `name` of JobSpec is edited, read from its annotation and constraints; its
    widgets' keys start with `prefix`."""
    info = JobSpec.model_fields[name]
    members = _union_members(info.annotation)
    optional = type(None) in members
    members = [member for member in members if member is not type(None)]
    literals = [member for member in members if typing.get_origin(member) is Literal]
    others = [member for member in members if typing.get_origin(member) is not Literal]
    minimum = maximum = None
    for constraint in info.metadata:
        if isinstance(constraint, annotated_types.Ge):
            minimum = constraint.ge
        elif isinstance(constraint, annotated_types.Gt):
            minimum = constraint.gt
        elif isinstance(constraint, annotated_types.Le):
            maximum = constraint.le
        elif isinstance(constraint, annotated_types.Lt):
            maximum = constraint.lt
    common = {
        "name": name,
        "optional": optional,
        "minimum": minimum,
        "maximum": maximum,
        "default": info.default,
        "description": info.description or "",
        "prefix": prefix,
    }
    if literals and not others:
        choices = tuple(value for literal in literals for value in typing.get_args(literal))
        return FieldKind(kind="choice", choices=choices, **common)
    words = tuple(str(value) for literal in literals for value in typing.get_args(literal))
    if others == [bool]:
        return FieldKind(kind="bool", **common)
    if len(others) == 1 and typing.get_origin(others[0]) is tuple:
        return FieldKind(kind="list", **common)
    if others == [int]:
        return FieldKind(kind="int", words=words, **common)
    if float in others:
        return FieldKind(kind="float", words=words, **common)
    return FieldKind(kind="text", words=words, **common)


def _union_members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]


def form_fields(
    prefix: str = KEY_PREFIX, leave_out: tuple[str, ...] = ()
) -> dict[str, list[FieldKind]]:
    """Every JobSpec field the form renders, by section, in order; a form that sets some
    fields itself (a sweep's base: name, tags and note are the sweep's) leaves them out."""
    listed = {name for names in SECTIONS.values() for name in names}
    sections = {
        title: [
            describe(name, prefix)
            for name in names
            if name in JobSpec.model_fields and name not in leave_out
        ]
        for title, names in SECTIONS.items()
    }
    unlisted = [
        describe(name, prefix)
        for name in JobSpec.model_fields
        if name not in listed and name not in RENDERED_BY_PAGE and name not in leave_out
    ]
    if unlisted:
        sections["More"] = unlisted
    return {title: fields for title, fields in sections.items() if fields}


def widget_values(field: FieldKind, value: Any) -> dict[str, Any]:
    """Session-state entries that make the field's widgets show `value`."""
    if field.kind == "list":
        return {field.key: ", ".join(value) if isinstance(value, list | tuple) else str(value)}
    if field.words:
        is_word = isinstance(value, str) and value in field.words
        entries: dict[str, Any] = {
            field.word_key(word): is_word and value == word for word in field.words
        }
        if not is_word:
            entries[field.key] = value
        return entries
    return {field.key: value}


def set_defaults(prefix: str = KEY_PREFIX, leave_out: tuple[str, ...] = ()) -> None:
    """Give every widget its spec default, unless it already has a value."""
    for fields in form_fields(prefix, leave_out).values():
        for field in fields:
            for key, value in widget_values(field, field.default).items():
                st.session_state.setdefault(key, value)
    st.session_state.setdefault(prefix + "dataset", JobSpec.model_fields["dataset"].default)


def load_spec(spec: dict[str, Any]) -> list[str]:
    """Fill the widgets from an existing job's spec. Returns notes on what could not be kept."""
    notes = []
    fields = {field.name: field for fields in form_fields().values() for field in fields}
    for name, value in spec.items():
        if name == "dataset":
            st.session_state[DATASET_KEY] = value
            continue
        field = fields.get(name)
        if field is None:
            notes.append(f"`{name}` is no longer a spec field; it was left out.")
            continue
        if field.kind == "list" and not isinstance(value, list | tuple):
            notes.append(f"{field.label}: {value!r} is not a list; it was left out.")
            continue
        if field.kind == "choice" and value not in field.choices:
            notes.append(f"{field.label}: {value!r} is no longer a choice; the default is used.")
            continue
        if _outside_bounds(field, value):
            notes.append(f"{field.label}: {value!r} is out of bounds now; the default is used.")
            continue
        st.session_state.update(widget_values(field, value))
    return notes


def _outside_bounds(field: FieldKind, value: Any) -> bool:
    if field.kind not in ("int", "float") or not isinstance(value, int | float):
        return False
    too_low = field.minimum is not None and value < field.minimum
    too_high = field.maximum is not None and value > field.maximum
    return too_low or too_high


def render_field(field: FieldKind, problem: str | None) -> None:
    """The widget(s) of one field, with its problem (if any) right below."""
    uses_word = any(st.session_state.get(field.word_key(word)) for word in field.words)
    if field.kind == "choice":
        st.selectbox(field.label, field.choices, key=field.key, help=field.help())
    elif field.kind == "bool":
        st.checkbox(field.label, key=field.key, help=field.help())
    elif field.kind in ("int", "float"):
        _number_input(field, disabled=uses_word)
    elif field.name in TEXT_AREAS:
        st.text_area(field.label, key=field.key, help=field.help())
    else:
        st.text_input(field.label, key=field.key, help=field.help(), disabled=uses_word)
    for word in field.words:
        label = WORD_LABELS.get((field.name, word), f"{field.label}: {word}")
        st.checkbox(label, key=field.word_key(word))
    if problem:
        st.error(plain(problem), icon=":material/error:")


def _number_input(field: FieldKind, disabled: bool) -> None:
    is_int = field.kind == "int"
    cast = int if is_int else float
    options: dict[str, Any] = {
        "min_value": None if field.minimum is None else cast(field.minimum),
        "max_value": None if field.maximum is None else cast(field.maximum),
        "step": 1 if is_int else FLOAT_STEPS.get(field.name, 0.01),
        "format": "%d" if is_int else "%g",
    }
    if field.optional:
        options["value"] = None
        options["placeholder"] = "empty: none"
    st.number_input(field.label, key=field.key, help=field.help(), disabled=disabled, **options)


def collect(prefix: str = KEY_PREFIX, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """The spec the widgets show now, as a plain dict for `db.queue.submit`."""
    data: dict[str, Any] = {"dataset": st.session_state.get(prefix + "dataset")}
    for fields in form_fields(prefix, leave_out).values():
        for field in fields:
            chosen = [word for word in field.words if st.session_state.get(field.word_key(word))]
            value = chosen[0] if chosen else st.session_state.get(field.key)
            if value is None and not field.optional:
                value = field.default
            data[field.name] = value
    return data

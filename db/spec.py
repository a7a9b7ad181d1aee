"""The job spec: everything a person sets for one training job, with defaults and bounds.

The dashboard form and the CLI both build a `JobSpec`; `SpecError` carries messages that
name the field, in words a person understands.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)


def normalize_dataset_name(name: str | None) -> str:
    """The stored form of a dataset name: stripped and NFC, so that 'é' typed as one
    character or as 'e' plus an accent names the same dataset and the same folder."""
    return unicodedata.normalize("NFC", (name or "").strip())


# Architecture names the worker knows how to build (torchvision models via fastai).
ARCHITECTURES: tuple[str, ...] = (
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "convnext_tiny",
    "efficientnet_b0",
    "mobilenet_v3_small",
)
SCHEDULES = ("one_cycle", "fine_tune")
MIXED_PRECISION = ("none", "bf16", "fp16")
DEVICES = ("auto", "xla", "cuda", "cpu")
# Epoch metrics a job can watch (early_stop, keep=best) and a sweep can optimise. Losses and
# error_rate are better lower, accuracies higher (`lower_is_better`).
EPOCH_METRICS = ("valid_loss", "accuracy", "error_rate", "top5_accuracy", "train_loss")
KEEP = ("last", "best")

MAX_NAME_LENGTH = 200
# The most TPU VM hosts one job may span (a v5p-12288 slice has 1,536).
MAX_HOSTS = 4096
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
# A note keeps its line breaks and tabs; no other control character.
_NOTE_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
MAX_TAGS = 20
MAX_TAG_LENGTH = 50
MAX_NOTE_LENGTH = 20_000
# Spec fields kept in their own columns (`db.labels`), editable after submit, not in the stored
# spec the worker reads.
LABEL_FIELDS = ("tags", "note")


def _tag_list(value: Any) -> tuple[str, ...]:
    """Tags from a list of them or from one string of comma-separated tags: each stripped and
    NFC, the empty ones dropped, each kept once, in the order given."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list | tuple):
        raise ValueError("must be a list of tags, or tags separated by commas")
    tags: list[str] = []
    for item in value:
        if not isinstance(item, str):
            raise ValueError("must be a list of tags, or tags separated by commas")
        tag = unicodedata.normalize("NFC", item.strip())
        if "," in tag:
            raise ValueError(f"a tag must not contain a comma ({tag!r})")
        if _CONTROL_CHARS.search(tag):
            raise ValueError("a tag must not contain control characters")
        if len(tag) > MAX_TAG_LENGTH:
            raise ValueError(f"a tag must be at most {MAX_TAG_LENGTH} characters ({tag!r})")
        if tag and tag not in tags:
            tags.append(tag)
    if len(tags) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags, not {len(tags)}")
    return tuple(tags)


def _note_text(value: str) -> str:
    value = value.replace("\r\n", "\n").replace("\r", "\n")
    if _NOTE_CONTROL_CHARS.search(value):
        raise ValueError("must not contain control characters (line breaks and tabs are fine)")
    return value.strip()


Tags = Annotated[tuple[str, ...], BeforeValidator(_tag_list)]
Note = Annotated[str, Field(max_length=MAX_NOTE_LENGTH), AfterValidator(_note_text)]
TAGS_DESCRIPTION = "Free tags to find the job by, separated by commas."
NOTE_DESCRIPTION = "A note about the job (Markdown source, shown as text)."


class SpecError(ValueError):
    """A job spec was refused. `problems` maps each field to what is wrong with it."""

    def __init__(self, problems: dict[str, str]):
        self.problems = problems
        super().__init__("; ".join(f"{field}: {message}" for field, message in problems.items()))


class JobSpec(BaseModel):
    """One training job. Validate with `parse_spec` to get person-readable errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        "",
        max_length=MAX_NAME_LENGTH,
        description="A name to find the job by; empty means 'arch on dataset'.",
    )
    dataset: str = Field(
        "digits",
        min_length=1,
        max_length=100,
        description="A registered dataset; 'digits' is built in.",
    )
    arch: Literal[ARCHITECTURES] = Field(
        "resnet18",  # type: ignore[valid-type]
        description="The torchvision architecture.",
    )
    pretrained: bool = Field(
        False,
        description="Start from ImageNet weights (they must be in "
        "the torch cache of the worker, or the worker must be online).",
    )
    epochs: int = Field(3, ge=1, le=1000, description="Passes over the training set.")
    lr: float | Literal["find"] = Field(
        1e-3,
        description="Peak learning rate, or 'find' to run fastai's lr_find and use its suggestion.",
    )
    schedule: Literal[SCHEDULES] = Field(
        "one_cycle",  # type: ignore[valid-type]
        description="fit_one_cycle, or fine_tune (freeze the "
        "body for one epoch, then train everything).",
    )
    bs: int = Field(64, ge=1, le=4096, description="Global batch size.")
    img_size: int = Field(
        64, ge=8, le=1024, description="Images are resized to this square, in pixels."
    )
    valid_pct: float = Field(
        0.2,
        ge=0.05,
        le=0.5,
        description="Share of the images held out "
        "for validation (ignored when the dataset has train/ and valid/).",
    )
    seed: int = Field(
        42, ge=0, le=2**31 - 1, description="Random seed for the split and the initial weights."
    )
    augment: bool = Field(False, description="fastai's aug_transforms (flips, rotation, lighting).")
    mixed_precision: Literal[MIXED_PRECISION] = Field(  # type: ignore[valid-type]
        "none", description="bf16 autocast (XLA, CUDA, CPU) or fp16 with loss scaling (CUDA)."
    )
    grad_accum: int = Field(
        1,
        ge=1,
        le=1024,
        description="Accumulate gradients over this many batches before each optimizer step.",
    )
    grad_clip: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="Clip the gradient norm to this value; empty for no clipping.",
    )
    wd: float = Field(0.01, ge=0, le=1, description="Weight decay.")
    device: Literal[DEVICES] = Field(
        "auto",  # type: ignore[valid-type]
        description="auto takes a TPU, else CUDA, else the CPU.",
    )
    cores: int | None = Field(
        None, ge=1, le=4096, description="XLA devices to use; empty means all the worker has."
    )
    hosts: int = Field(
        1,
        ge=1,
        le=MAX_HOSTS,
        description="TPU VM hosts that run the job together: 1, or every host of one "
        "multi-host pod slice (each host's worker joins; they start, fail and resume as one).",
    )
    priority: int = Field(
        0, ge=-100, le=100, description="Higher runs first; equal priorities run oldest first."
    )
    max_attempts: int = Field(
        3,
        ge=1,
        le=20,
        description="How many times the job may be claimed before a lost worker fails it for good.",
    )
    time_limit: int | None = Field(
        None,
        ge=1,
        le=30 * 24 * 3600,
        description="Seconds of "
        "training after which the job is stopped and failed; "
        "empty for none.",
    )
    checkpoint_interval: int | None = Field(
        None,
        ge=0,
        le=24 * 3600,
        description="Seconds between checkpoint writes (0: every epoch); empty for the "
        "worker's TRAINDECK_CHECKPOINT_INTERVAL. A stop writes the newest epoch's state.",
    )

    tags: Tags = Field((), description=TAGS_DESCRIPTION)
    note: Note = Field("", description=NOTE_DESCRIPTION)
    monitor: Literal[EPOCH_METRICS] = Field(  # type: ignore[valid-type]
        "valid_loss",
        description="The epoch metric that early_stop and keep=best watch (top5_accuracy needs "
        "more than 5 classes).",
    )
    early_stop: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="End training, as succeeded, after this many epochs in a row in which "
        "monitor did not improve; empty to train every epoch.",
    )
    min_delta: float = Field(
        0.0, ge=0, le=1e6, description="How much monitor must improve for an epoch to count."
    )
    keep: Literal[KEEP] = Field(  # type: ignore[valid-type]
        "last",
        description="Which epoch's model the export and the results use: the last one, or the "
        "best by monitor.",
    )

    @field_validator("name", "dataset")
    @classmethod
    def _printable(cls, value: str) -> str:
        value = value.strip()
        if _CONTROL_CHARS.search(value):
            raise ValueError("must not contain control characters")
        return value

    @field_validator(
        "epochs",
        "lr",
        "bs",
        "img_size",
        "valid_pct",
        "seed",
        "grad_accum",
        "grad_clip",
        "wd",
        "cores",
        "hosts",
        "priority",
        "max_attempts",
        "time_limit",
        "checkpoint_interval",
        "early_stop",
        "min_delta",
        mode="before",
    )
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        # JSON true would otherwise pass as the number 1.
        if isinstance(value, bool):
            raise ValueError("must be a number, not true or false")
        return value

    @field_validator("lr", mode="before")
    @classmethod
    def _lr_number_or_find(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip().lower()
            if text == "find":
                return "find"
            try:
                return float(text)
            except ValueError:
                raise ValueError("must be a positive number or 'find'") from None
        return value

    @field_validator("lr")
    @classmethod
    def _lr_bounds(cls, value: float | str) -> float | str:
        if value == "find":
            return value
        if not value > 0:
            raise ValueError("must be greater than 0 (or 'find')")
        if value > 10:
            raise ValueError("must be at most 10")
        return value

    @field_validator("dataset")
    @classmethod
    def _stored_form(cls, value: str) -> str:
        return normalize_dataset_name(value)

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str, info: ValidationInfo) -> str:
        known = (info.context or {}).get("datasets")
        if known is not None and value not in known:
            choices = ", ".join(sorted(known)) or "none"
            raise ValueError(f"unknown dataset {value!r}; registered: {choices}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.mixed_precision == "fp16" and self.device == "xla":
            raise ValueError("mixed_precision: fp16 runs on CUDA only; use bf16 on XLA")
        if self.mixed_precision == "fp16" and self.device == "cpu":
            raise ValueError("mixed_precision: fp16 runs on CUDA only; use bf16 or none on the CPU")
        if self.cores is not None and self.device not in ("xla", "auto"):
            raise ValueError("cores: only XLA jobs spread over several cores")
        if self.hosts > 1 and self.device not in ("xla", "auto"):
            raise ValueError(
                f"hosts: a job on {self.hosts} hosts runs on a TPU pod slice; use device xla "
                "or auto"
            )
        return self

    @property
    def display_name(self) -> str:
        return self.name or f"{self.arch} on {self.dataset}"

    def stored(self) -> dict[str, Any]:
        """The spec as the jobs table keeps it: without its tags and note (own columns)."""
        return self.model_dump(mode="json", exclude=set(LABEL_FIELDS))


class Labels(BaseModel):
    """A job's tags and note, as edited after submit (the same rules as the spec's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tags: Tags = Field((), description=TAGS_DESCRIPTION)
    note: Note = Field("", description=NOTE_DESCRIPTION)


FIELD_NAMES: tuple[str, ...] = tuple(JobSpec.model_fields)


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of an epoch metric is better (fastai's rule in TrackerCallback:
    a name with 'loss' or 'error' in it)."""
    return "loss" in metric or "error" in metric


def training_images(item_count: int, valid_pct: float) -> int:
    """How many of `item_count` images a random split trains on. The same arithmetic as
    fastai's RandomSplitter (it holds out `int(valid_pct * n)`), so that a batch refused at
    submit is exactly one the worker could not fill."""
    return item_count - int(valid_pct * item_count)


def batch_size_problem(bs: int, training_count: int | None, dataset: str) -> str | None:
    """Why a batch of `bs` cannot be drawn from `training_count` images, or None. fastai drops
    the last incomplete training batch, so a larger batch would leave no batch at all."""
    if training_count is None or bs <= training_count:
        return None
    return (
        f"batch size {bs} is larger than the {training_count} training images of "
        f"dataset {dataset!r}; lower bs"
    )


_Model = TypeVar("_Model", bound=BaseModel)


def _humanize(error: dict[str, Any]) -> tuple[str, str]:
    """(field, message) for one pydantic error, in plain words."""
    loc = [str(part) for part in error.get("loc", ()) if not str(part).startswith("function-")]
    kind = error.get("type", "")
    message = str(error.get("msg", "is invalid"))
    ctx = error.get("ctx") or {}
    field = loc[0] if loc else ""
    if kind == "extra_forbidden":
        return field, "is not a spec field"
    if kind == "literal_error":
        return field, f"must be one of {ctx.get('expected', '')}".replace("'", "")
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        words = {
            "greater_than_equal": "at least",
            "less_than_equal": "at most",
            "greater_than": "greater than",
            "less_than": "less than",
        }[kind]
        limit = next(iter(ctx.values()), "")
        return field, f"must be {words} {limit}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return field, "must be a whole number"
    if kind in ("float_parsing", "float_type"):
        return field, "must be a number"
    if kind in ("bool_parsing", "bool_type"):
        return field, "must be true or false"
    if kind == "string_too_long":
        return field, f"must be at most {ctx.get('max_length')} characters"
    if kind == "string_too_short":
        return field, "must not be empty"
    if kind == "string_type":
        return field, "must be text"
    if kind == "string_unicode":
        return field, "must be valid Unicode text"
    if kind == "int_parsing_size":
        return field, "is far too large a number"
    message = message.removeprefix("Value error, ")
    if not field and ": " in message:
        field, message = message.split(": ", 1)
    return field or "spec", message


def _validate(model: type[_Model], data: Any, context: dict | None = None) -> _Model:
    if not isinstance(data, dict):
        raise SpecError({"spec": "must be a JSON object of field: value"})
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        problems: dict[str, str] = {}
        for error in exc.errors():
            field, message = _humanize(error)
            problems.setdefault(field, message)
        raise SpecError(problems) from None


def parse_spec(data: Any, known_datasets: set[str] | None = None) -> JobSpec:
    """Validate `data` (a mapping) into a `JobSpec`, or raise `SpecError` naming each field."""
    if isinstance(data, JobSpec):
        data = data.model_dump()
    context = {"datasets": known_datasets} if known_datasets is not None else None
    return _validate(JobSpec, data, context)


def parse_labels(data: Any) -> Labels:
    """Validate `data` ({tags, note}) into `Labels`, or raise `SpecError` naming each field."""
    return _validate(Labels, data)


def json_value(text: str | bytes, field: str = "spec") -> Any:
    """The JSON value in `text`, or SpecError naming `field` when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError({field: f"is not valid JSON ({exc.msg} at line {exc.lineno})"}) from None
    except UnicodeDecodeError:
        raise SpecError({field: "is not UTF-8 text"}) from None
    except RecursionError:
        raise SpecError({field: "is nested too deeply to be a job spec"}) from None


def spec_from_json(text: str, known_datasets: set[str] | None = None) -> JobSpec:
    return parse_spec(json_value(text), known_datasets)

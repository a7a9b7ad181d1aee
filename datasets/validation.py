"""What a dataset must pass before it is registered: where it lies, that its images decode,
and that every class can be both trained on and validated.

Allowed data roots (`datasets.roots`): the data folder (`TRAINDECK_DATA`) and every folder an
admin lists in `TRAINDECK_DATASET_ROOTS` (separated by `os.pathsep`, ':' on Linux), but never
the jobs folder inside the data folder. A dataset outside them is refused, so a browser user
cannot point the server at /etc, at someone's home folder or at other jobs' files.

The images are decoded at a bounded cost, in a pool of processes (`datasets.image_checks`):
`TRAINDECK_IMAGE_MAX_MEGAPIXELS` per image, read from its header before it is decoded, and
`TRAINDECK_CHECK_MAX_MEGAPIXELS` decoded per dataset.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import config
from common.files import jobs_dir
from datasets import image_checks
from datasets.image_checks import DRAFT_SIZE, PixelLimits
from datasets.labelling import DatasetError, LabelledItems, relative_name, scan_items
from datasets.roots import DATASET_ROOTS_ENV, ItemRule, allowed_roots
from db.spec import normalize_dataset_name

__all__ = ["DATASET_ROOTS_ENV", "DRAFT_SIZE", "allowed_roots"]

MAX_NAME_LENGTH = 100
# The upload folder is named after the dataset, and its staging folder adds 18 characters:
# both must stay under the 255 bytes most file systems allow in one name.
MAX_NAME_BYTES = 200
NAME_PUNCTUATION = frozenset("._-")
NAME_RULE = (
    "may hold only letters and digits (of any script, with their accents), '.', '_' and '-', "
    "and must start with a letter or digit"
)
RESERVED_NAMES = frozenset({"digits"})
MAX_NAMED_IN_MESSAGE = 5

ProgressCallback = Callable[[int, int], None]


def resolve_inside_roots(path: Path | str, what: str = "folder") -> Path:
    """The absolute, link-free form of `path`, if it exists inside an allowed data root.

    A relative path is taken relative to the data folder.
    """
    text = str(path).strip()
    if not text:
        raise DatasetError(f"no {what} given")
    try:
        candidate = Path(text).expanduser()
        if not candidate.is_absolute():
            candidate = config.data_dir() / candidate
        resolved = candidate.resolve()
        roots = allowed_roots()
        inside = any(resolved.is_relative_to(root) for root in roots)
        exists = inside and resolved.exists()
        in_jobs = resolved.is_relative_to(jobs_dir().resolve())
    except (ValueError, UnicodeError, OSError, RuntimeError):
        # A NUL byte, text that is no file name on this system, a name too long, a link loop.
        raise DatasetError(f"{what} {text!r} is not a usable path") from None
    if not inside:
        listed = ", ".join(str(root) for root in roots)
        raise DatasetError(
            f"{what} {text} is outside the allowed data roots ({listed}); an admin can allow "
            f"more folders with {DATASET_ROOTS_ENV}"
        )
    if in_jobs:
        raise DatasetError(f"{what} {text} is in the jobs folder, which holds jobs' files")
    if not exists:
        raise DatasetError(f"{what} {text} does not exist")
    return resolved


def _name_character_allowed(char: str, first: bool) -> bool:
    category = unicodedata.category(char)
    if category[0] == "L" or category == "Nd":
        return True
    # Combining accents and vowel signs belong to the letter before them.
    return not first and (category[0] == "M" or char in NAME_PUNCTUATION)


def validate_dataset_name(name: str) -> str:
    """The name in its stored form, if it can name a dataset (and its upload folder)."""
    name = normalize_dataset_name(name)
    if not name:
        raise DatasetError("a dataset needs a name")
    if len(name) > MAX_NAME_LENGTH:
        raise DatasetError(f"the dataset name is longer than {MAX_NAME_LENGTH} characters")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise DatasetError(
            f"the dataset name is longer than {MAX_NAME_BYTES} bytes in UTF-8, too long for "
            "a folder name; shorten it"
        )
    if not all(_name_character_allowed(c, i == 0) for i, c in enumerate(name)):
        raise DatasetError(f"dataset name {name!r} {NAME_RULE}")
    if name.lower() in RESERVED_NAMES:
        raise DatasetError(f"{name!r} is the name of a built-in dataset; choose another")
    return name


def check_image(path: Path) -> tuple[str | None, str | None]:
    """(its mode, None) when the image at `path` reads as training reads it ('RGB',
    'L 16-bit', …: `datasets.images.mode_label`), else (None, why it cannot be decoded).
    One image, in this process; a dataset's images are checked by `find_bad_files`."""
    found = image_checks.check(path, PixelLimits.from_env())
    return found.mode, found.problem


def image_problem(path: Path) -> str | None:
    """Why the image at `path` cannot be decoded, or None when it can."""
    return check_image(path)[1]


@dataclass
class DatasetReport:
    """What registration learned about a dataset folder."""

    root: Path
    label_rule: dict[str, Any]
    class_counts: dict[str, int]
    split_counts: dict[str, dict[str, int]] | None
    bad_files: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # Decodable images per file mode ('RGB', 'L 16-bit', …), most common first.
    modes: dict[str, int] = field(default_factory=dict)
    # Pixels decoded to check the images (bounded by TRAINDECK_CHECK_MAX_MEGAPIXELS).
    decoded_pixels: int = 0
    # The usable images, relative to `root` with forward slashes, their labels and (for a
    # fixed split) their flags: what the manifest keeps (`datasets.manifest`).
    files: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    valid: list[bool] | None = None

    @property
    def classes(self) -> list[str]:
        return sorted(self.class_counts)

    @property
    def item_count(self) -> int:
        return sum(self.class_counts.values())

    def raise_problems(self, name: str) -> None:
        if self.problems:
            raise DatasetError(f"dataset {name!r} cannot be used: " + "; ".join(self.problems))

    def summary(self) -> str:
        """One paragraph a person reads after registering."""
        split = "a fixed train/valid split" if self.split_counts else "a random split per job"
        lines = [
            f"{self.item_count} images in {len(self.class_counts)} classes, {split} "
            f"(rule: {self.label_rule.get('type')})"
        ]
        if self.modes:
            lines.append("modes: " + ", ".join(f"{m} ×{n:,}" for m, n in self.modes.items()))
        if self.bad_files:
            lines.append(
                f"left out {counted(len(self.bad_files), 'file')} that cannot be decoded: "
                + _first_few(f"{name} ({reason})" for name, reason in self.bad_files.items())
            )
        if self.skipped:
            lines.append(
                f"{counted(len(self.skipped), 'file')} skipped: " + _first_few(self.skipped)
            )
        return "\n".join(lines)


def counted(count: int, noun: str) -> str:
    """'1 file', '2 files'."""
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _first_few(entries: Any) -> str:
    entries = list(entries)
    shown = "; ".join(entries[:MAX_NAMED_IN_MESSAGE])
    if len(entries) > MAX_NAMED_IN_MESSAGE:
        shown += f"; and {len(entries) - MAX_NAMED_IN_MESSAGE} more"
    return shown


def _class_list(classes: list[str]) -> str:
    return _first_few(repr(c) for c in sorted(classes)).replace("; ", ", ")


def find_bad_files(
    root: Path,
    items: LabelledItems,
    progress: ProgressCallback | None = None,
    modes: Counter[str] | None = None,
    limits: PixelLimits | None = None,
) -> dict[str, str]:
    """Relative name → reason for every item that cannot be decoded (or has too many pixels
    to), or that lies in the jobs folder or links there or out of the allowed roots (the
    scans skip those already; an item list made elsewhere is checked too). Counts the mode
    of every decodable image in `modes`. A DatasetError when checking the images would
    decode more than `TRAINDECK_CHECK_MAX_MEGAPIXELS`."""
    return _find_bad_files(root, items, progress, modes, limits)[0]


def _find_bad_files(
    root: Path,
    items: LabelledItems,
    progress: ProgressCallback | None,
    modes: Counter[str] | None,
    limits: PixelLimits | None,
) -> tuple[dict[str, str], int]:
    rule = ItemRule(root)
    bad: dict[str, str] = {}
    to_check: list[Path] = []
    for path, _ in items.items:
        problem = rule.problem(path)
        if problem is not None:
            bad[relative_name(path, root)] = problem
        else:
            to_check.append(path)
    checked, decoded = image_checks.check_images(to_check, limits, progress)
    for path, found in zip(to_check, checked, strict=True):
        if found.problem is not None:
            bad[relative_name(path, root)] = found.problem
        elif modes is not None and found.mode is not None:
            modes[found.mode] += 1
    return bad, decoded


def inspect_dataset(
    root: Path,
    rule: dict[str, Any],
    *,
    check_images: bool = True,
    progress: ProgressCallback | None = None,
) -> DatasetReport:
    """Scan `root` by `rule`, decode every image, count the classes and list the problems
    that keep the dataset from training."""
    items = scan_items(root, rule)
    modes: Counter[str] = Counter()
    bad, decoded = _find_bad_files(root, items, progress, modes, None) if check_images else ({}, 0)
    kept_files: list[str] = []
    kept_labels: list[str] = []
    kept_flags: list[bool] = []
    for index, (path, label) in enumerate(items.items):
        relative = relative_name(path, root)
        if relative in bad:
            continue
        kept_files.append(relative)
        kept_labels.append(label)
        if items.is_valid is not None:
            kept_flags.append(items.is_valid[index])
    counts = dict(sorted(Counter(kept_labels).items()))
    split_counts = None
    if items.is_valid is not None:
        split_counts = {
            part: dict(
                sorted(
                    Counter(
                        label
                        for label, flag in zip(kept_labels, kept_flags, strict=True)
                        if flag == wanted
                    ).items()
                )
            )
            for part, wanted in (("train", False), ("valid", True))
        }
    report = DatasetReport(root, rule, counts, split_counts, bad, list(items.skipped))
    report.modes = dict(sorted(modes.items(), key=lambda entry: (-entry[1], entry[0])))
    report.decoded_pixels = decoded
    report.files, report.labels = kept_files, kept_labels
    report.valid = kept_flags if items.is_valid is not None else None
    report.problems = _problems(report)
    return report


def _problems(report: DatasetReport) -> list[str]:
    counts = report.class_counts
    if not counts:
        return [f"no usable images found in {report.root}"]
    problems: list[str] = []
    if len(counts) < 2:
        problems.append(
            f"found 1 class ({_class_list(list(counts))}); a classifier needs at least 2"
        )
    if report.split_counts is not None:
        for part in ("train", "valid"):
            missing = [c for c in counts if c not in report.split_counts[part]]
            if missing:
                problems.append(f"classes with no image to {part} on: {_class_list(missing)}")
    else:
        single = [c for c, n in counts.items() if n < 2]
        if single:
            problems.append(
                f"classes with a single image: {_class_list(single)}; each class needs at "
                "least 2, one to train on and one to validate on"
            )
    return problems

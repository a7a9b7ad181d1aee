"""What a dataset must pass before it is registered: where it lies, that its images decode,
and that every class can be both trained on and validated.

Allowed data roots (`datasets.roots`): the data folder (`TRAINDECK_DATA`) and every folder an
admin lists in `TRAINDECK_DATASET_ROOTS` (separated by `os.pathsep`, ':' on Linux), but never
the jobs folder inside the data folder. A dataset outside them is refused, so a browser user
cannot point the server at /etc, at someone's home folder or at other jobs' files.
"""

from __future__ import annotations

import unicodedata
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import config
from common.files import jobs_dir
from datasets.labelling import DatasetError, LabelledItems, relative_name, scan_items
from datasets.roots import DATASET_ROOTS_ENV, ItemRule, allowed_roots
from db.spec import normalize_dataset_name

__all__ = ["DATASET_ROOTS_ENV", "allowed_roots"]

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
# Decoding a JPEG at a reduced scale proves it is readable at a fraction of the cost.
DRAFT_SIZE = (64, 64)
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
    'L 16-bit', …: `datasets.images.mode_label`), else (None, why it cannot be decoded)."""
    from PIL import Image

    from datasets.images import SOURCE_MODE, open_image

    try:
        with warnings.catch_warnings():
            # Bomb-sized images are refused below; PIL's other warnings (a palette's
            # transparency dropped by RGB) would repeat once per file of a dataset.
            warnings.simplefilter("ignore")
            image = open_image(path, draft=DRAFT_SIZE)
    except Image.DecompressionBombError:
        return None, "has too many pixels to decode safely"
    except Exception as exc:
        detail = str(exc).replace(str(path), path.name) or type(exc).__name__
        return None, f"cannot be decoded: {detail}"
    return image.info[SOURCE_MODE], None


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
) -> dict[str, str]:
    """Relative name → reason for every item that cannot be decoded, or that lies in the
    jobs folder or links there or out of the dataset folder and the allowed roots (the scans
    skip the jobs folder already; an item list made elsewhere is checked too). Counts the
    mode of every decodable image in `modes`."""
    rule = ItemRule(root)
    bad: dict[str, str] = {}
    total = len(items.items)
    for index, (path, _) in enumerate(items.items):
        problem = rule.problem(path)
        if problem is not None:
            bad[relative_name(path, root)] = problem
        else:
            mode, reason = check_image(path)
            if reason:
                bad[relative_name(path, root)] = reason
            elif modes is not None:
                modes[mode] += 1
        if progress is not None:
            progress(index + 1, total)
    return bad


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
    bad = find_bad_files(root, items, progress, modes) if check_images else {}
    kept_labels: list[str] = []
    kept_flags: list[bool] = []
    for index, (path, label) in enumerate(items.items):
        if relative_name(path, root) in bad:
            continue
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

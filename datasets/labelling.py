"""How the images of a dataset folder get their labels, and which of them are held out.

A labelling rule is a small JSON object stored in the registry (`datasets.label_rule`):

- `{"type": "folder"}`: `root/<class>/<image>`, the ImageNet layout.
- `{"type": "regex", "pattern": RE}`: the label is the first group (or the group named
  `label`) of `RE` searched in the file name, as in the Oxford-IIIT Pets layout; every image
  under the root is used, or only those under `subfolder` (Pets keeps them in `images/`).
- `{"type": "csv", "file": "labels.csv"}`: rows of `file,label[,is_valid]`, paths relative
  to the root; a first row whose file cell is not an image name is a header.
- `{"type": "auto", "label_regex": RE | None}`: a `url` dataset whose layout is known only once
  the worker has fetched it; `detect_label_rule` turns it into one of the above.

`folder` and `regex` take `"split": {"train": "train", "valid": "valid"}` when the root has a
training and a validation folder (fastai's GrandparentSplitter); the items then carry one
`is_valid` flag each. Without it the worker splits at random by the job's valid_pct and seed.

A file or folder in the jobs folder, or a link leading there, is never part of a dataset: the
scans skip it and say why (`datasets.roots.ItemRule.jobs_problem`).

Pure file work: no database, no torch.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from datasets.item_table import ItemTable
from datasets.roots import ItemRule

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
TRAIN_FOLDER = "train"
VALID_FOLDERS = ("valid", "val")
IMAGES_FOLDER = "images"
# Oxford-IIIT Pets: the breed is the part of the file name before the last "_".
PETS_LABEL_REGEX = r"^(.+)_[^_]+$"
TRUE_WORDS = frozenset({"1", "true", "yes", "valid", "y", "t"})
FALSE_WORDS = frozenset({"0", "false", "no", "train", "n", "f", ""})
MAX_CSV_BYTES = 256 << 20


class DatasetError(ValueError):
    """A dataset cannot be used as it is; the message says what is wrong with it."""


@dataclass(frozen=True)
class LabelledItems:
    """The images of a dataset with their labels, ready for the worker to load.

    `is_valid` is None for a random split (by the job's valid_pct and seed), or one flag per
    item when the dataset fixes its own split (a `train/` and a `valid/` folder, or a CSV
    `is_valid` column). `skipped` names the files left out and why, one line each.
    """

    # (path, label) pairs: a list of (Path, str) from a scan, an `ItemTable` (compact, its
    # paths as str) from a manifest
    items: Sequence[tuple[Path | str, str]]
    is_valid: Sequence[bool] | None = None  # a list, or a numpy bool array from a manifest
    skipped: list[str] = field(default_factory=list)

    @property
    def classes(self) -> list[str]:
        if isinstance(self.items, ItemTable):
            return self.items.present_classes()
        return sorted({label for _, label in self.items})


def is_image_name(path: Path | PurePosixPath | str) -> bool:
    return PurePosixPath(str(path)).suffix.lower() in IMAGE_SUFFIXES


def is_hidden(name: str) -> bool:
    """Dot files and the resource forks macOS adds to zips are never part of a dataset."""
    return name.startswith(".") or name == "__MACOSX"


def relative_name(path: Path, root: Path) -> str:
    """`path` relative to `root`, with forward slashes: how bad files are stored."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def _visible_children(folder: Path) -> list[Path]:
    try:
        return sorted(child for child in folder.iterdir() if not is_hidden(child.name))
    except OSError as exc:
        raise DatasetError(f"cannot read folder {folder}: {exc.strerror or exc}") from None


def _allowed(path: Path, root: Path, rule: ItemRule, skipped: list[str]) -> bool:
    """Whether `path` may be an item (or hold items) of the dataset at `root`; if not, say
    why in `skipped`."""
    problem = rule.jobs_problem(path)
    if problem is None:
        return True
    skipped.append(f"{relative_name(path, root)} ({problem})")
    return False


def _images_below(folder: Path, root: Path, rule: ItemRule, skipped: list[str]) -> list[Path]:
    """Every image file under `folder`, at any depth, skipping hidden files and folders and
    what `rule` refuses."""
    found: list[Path] = []
    for child in _visible_children(folder):
        if child.is_dir():
            if _allowed(child, root, rule, skipped):
                found.extend(_images_below(child, root, rule, skipped))
        elif child.is_file() and is_image_name(child) and _allowed(child, root, rule, skipped):
            found.append(child)
    return found


def split_folders(root: Path) -> dict[str, str] | None:
    """`{"train": ..., "valid": ...}` when `root` holds a training and a validation folder."""
    if not (root / TRAIN_FOLDER).is_dir():
        return None
    for name in VALID_FOLDERS:
        if (root / name).is_dir():
            return {"train": TRAIN_FOLDER, "valid": name}
    return None


def dataset_root(folder: Path) -> Path:
    """Step into a lone wrapping folder, as archives often have (`pets.zip` → `pets/…`)."""
    while True:
        children = _visible_children(folder)
        if len(children) != 1 or not children[0].is_dir():
            return folder
        only = children[0]
        if only.name in (TRAIN_FOLDER, IMAGES_FOLDER, *VALID_FOLDERS):
            return folder
        inside = _visible_children(only)
        if not any(p.is_dir() or p.suffix.lower() == ".csv" for p in inside):
            return folder  # a lone class folder: a dataset of one class, reported as such
        folder = only


def compile_label_regex(pattern: str) -> re.Pattern[str]:
    """The compiled pattern, or a DatasetError saying why it cannot label anything."""
    if not pattern or not pattern.strip():
        raise DatasetError("the label regex is empty")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise DatasetError(f"the label regex {pattern!r} is not valid: {exc}") from None
    if compiled.groups < 1:
        raise DatasetError(
            f"the label regex {pattern!r} needs a group that captures the label, "
            r"e.g. ^(.+)_\d+\.jpg$"
        )
    return compiled


def _has_class_folders(root: Path) -> bool:
    return any(
        child.is_dir() and any(is_image_name(f) and f.is_file() for f in _visible_children(child))
        for child in _visible_children(root)
    )


def _lists_images(csv_path: Path) -> bool:
    """Whether the first rows of a CSV name image files (a labels file, not some table)."""
    try:
        with open(csv_path, encoding="utf-8-sig", newline="") as handle:
            head = [row for _, row in zip(range(3), csv.reader(handle), strict=False)]
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return any(row and is_image_name(row[0].strip()) for row in head)


def detect_label_rule(root: Path, label_regex: str | None = None) -> dict[str, Any]:
    """The labelling rule that fits the files under `root`, or a DatasetError explaining why
    none does."""
    split = split_folders(root)
    if label_regex:
        compile_label_regex(label_regex)
        rule: dict[str, Any] = {"type": "regex", "pattern": label_regex}
        if split:
            rule["split"] = split
        elif (root / IMAGES_FOLDER).is_dir():
            rule["subfolder"] = IMAGES_FOLDER
        return rule
    if split:
        return {"type": "folder", "split": split}
    csv_files = [
        p
        for p in _visible_children(root)
        if p.is_file() and p.suffix.lower() == ".csv" and _lists_images(p)
    ]
    if len(csv_files) == 1:
        return {"type": "csv", "file": csv_files[0].name}
    if len(csv_files) > 1:
        names = ", ".join(p.name for p in csv_files)
        raise DatasetError(
            f"{root} has several CSV files of images ({names}); register the one that holds "
            "the labels as a CSV dataset"
        )
    if _has_class_folders(root):
        return {"type": "folder"}
    raise DatasetError(
        f"no labelled images found in {root}: expected one folder of images per class "
        "(cat/1.jpg), train/ and valid/ folders of those, a CSV of file,label, or file "
        "names with a label regex"
    )


def _folder_items(
    root: Path, folder: Path, rule: ItemRule, skipped: list[str]
) -> list[tuple[Path, str]]:
    items: list[tuple[Path, str]] = []
    for child in _visible_children(folder):
        if child.is_dir():
            if not _allowed(child, root, rule, skipped):
                continue
            for path in _visible_children(child):
                if path.is_file() and is_image_name(path) and _allowed(path, root, rule, skipped):
                    items.append((path, child.name))
        elif child.is_file() and is_image_name(child):
            skipped.append(f"{relative_name(child, root)} (not inside a class folder)")
    return items


def _regex_items(
    root: Path, folder: Path, pattern: re.Pattern[str], rule: ItemRule, skipped: list[str]
) -> list[tuple[Path, str]]:
    items: list[tuple[Path, str]] = []
    for path in _images_below(folder, root, rule, skipped):
        match = pattern.search(path.name)
        label = None
        if match:
            label = match.group("label") if "label" in pattern.groupindex else match.group(1)
        if label:
            items.append((path, label))
        else:
            skipped.append(f"{relative_name(path, root)} (name does not match the label regex)")
    return items


def _split_items(root: Path, split: dict[str, str], collect, skipped: list[str]) -> LabelledItems:
    items: list[tuple[Path, str]] = []
    is_valid: list[bool] = []
    for key, flag in (("train", False), ("valid", True)):
        part = root / split[key]
        if not part.is_dir():
            raise DatasetError(f"the {key} folder {part} does not exist")
        found = collect(part)
        items.extend(found)
        is_valid.extend([flag] * len(found))
    return LabelledItems(items, is_valid, skipped)


def _parse_flag(text: str) -> bool | None:
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None


def _csv_rows(csv_path: Path) -> list[list[str]]:
    try:
        if csv_path.stat().st_size > MAX_CSV_BYTES:
            raise DatasetError(f"{csv_path} is larger than {MAX_CSV_BYTES >> 20} MB")
        text = csv_path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise DatasetError(f"cannot read {csv_path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise DatasetError(f"{csv_path} is not UTF-8 text") from None
    try:
        return [row for row in csv.reader(text.splitlines()) if any(c.strip() for c in row)]
    except csv.Error as exc:
        raise DatasetError(f"{csv_path} is not a valid CSV file: {exc}") from None


def _csv_items(root: Path, csv_name: str, rule: ItemRule, skipped: list[str]) -> LabelledItems:
    csv_path = root / csv_name
    rows = _csv_rows(csv_path)
    first_line = 1
    if rows and not is_image_name(rows[0][0].strip()):
        rows, first_line = rows[1:], 2
    if not rows:
        raise DatasetError(f"{csv_path} has no rows of file,label")
    with_split = any(len(row) >= 3 for row in rows)
    resolved_root = root.resolve()
    items: list[tuple[Path, str]] = []
    flags: list[bool] = []
    for line, row in enumerate(rows, start=first_line):
        cells = [cell.strip() for cell in row]
        where = f"{csv_name} line {line}"
        if len(cells) < 2 or not cells[0] or not cells[1]:
            skipped.append(f"{where} (expected file,label)")
            continue
        name, label = cells[0], cells[1]
        relative = PurePosixPath(name.replace("\\", "/"))
        if relative.is_absolute() or ".." in relative.parts:
            skipped.append(f"{where}: {name} (must be a path inside {root})")
            continue
        path = root.joinpath(*relative.parts)
        if not is_image_name(path):
            skipped.append(f"{where}: {name} (not an image file name)")
            continue
        if not path.is_file():
            skipped.append(f"{where}: {name} (no such file)")
            continue
        if not path.resolve().is_relative_to(resolved_root):
            skipped.append(f"{where}: {name} (links outside {root})")
            continue
        problem = rule.jobs_problem(path)
        if problem is not None:
            skipped.append(f"{where}: {name} ({problem})")
            continue
        flag = False
        if with_split:
            parsed = _parse_flag(cells[2] if len(cells) >= 3 else "")
            if parsed is None:
                skipped.append(f"{where}: is_valid {cells[2]!r} is not true or false")
                continue
            flag = parsed
        items.append((path, label))
        flags.append(flag)
    return LabelledItems(items, flags if with_split else None, skipped)


def scan_items(root: Path, rule: dict[str, Any]) -> LabelledItems:
    """Every labelled image under `root` by `rule`. Files that do not fit the rule are
    listed in `skipped`; images are not decoded here."""
    if not root.is_dir():
        raise DatasetError(f"folder {root} does not exist")
    kind = rule.get("type", "folder")
    skipped: list[str] = []
    split = rule.get("split")
    where = ItemRule(root)
    if kind == "auto":
        return scan_items(root, detect_label_rule(root, rule.get("label_regex")))
    if kind == "folder":
        if split:
            return _split_items(
                root, split, lambda part: _folder_items(root, part, where, skipped), skipped
            )
        return LabelledItems(_folder_items(root, root, where, skipped), None, skipped)
    if kind == "regex":
        pattern = compile_label_regex(str(rule.get("pattern", "")))
        if split:
            return _split_items(
                root,
                split,
                lambda part: _regex_items(root, part, pattern, where, skipped),
                skipped,
            )
        folder = root / rule["subfolder"] if rule.get("subfolder") else root
        if not folder.is_dir():
            raise DatasetError(f"folder {folder} does not exist")
        return LabelledItems(_regex_items(root, folder, pattern, where, skipped), None, skipped)
    if kind == "csv":
        return _csv_items(root, str(rule.get("file", "")), where, skipped)
    raise DatasetError(f"unknown labelling rule {kind!r}")

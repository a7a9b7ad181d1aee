"""Labelling rules on image sets the tests write: folders, file names, CSV, fixed splits."""

from __future__ import annotations

from pathlib import Path

import pytest

from datasets.labelling import (
    PETS_LABEL_REGEX,
    DatasetError,
    dataset_root,
    detect_label_rule,
    scan_items,
)
from tests.support.images import (
    make_csv_dataset,
    make_folder_dataset,
    make_pets_dataset,
    make_split_dataset,
    write_image,
)


def labels_by_name(root: Path, rule: dict) -> dict[str, str]:
    return {
        path.relative_to(root).as_posix(): label for path, label in scan_items(root, rule).items
    }


def test_folder_per_class_labels_every_image_by_its_folder(tmp_path: Path) -> None:
    root = make_folder_dataset(tmp_path / "ds", ("cat", "dog", "fox"), per_class=3)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()
    write_image(root / ".hidden" / "x.png", (0, 0, 0))
    write_image(root / "stray.png", (0, 0, 0))

    rule = detect_label_rule(root)
    items = scan_items(root, rule)

    assert rule == {"type": "folder"}
    assert items.classes == ["cat", "dog", "fox"]
    assert len(items.items) == 9
    assert items.is_valid is None
    assert items.skipped == ["stray.png (not inside a class folder)"]


@pytest.mark.parametrize("valid_name", ["valid", "val"])
def test_train_and_valid_folders_fix_the_split(tmp_path: Path, valid_name: str) -> None:
    root = make_split_dataset(tmp_path / "ds", ("a", "b"), 3, 2, valid_name=valid_name)
    (root / "test" / "a").mkdir(parents=True)
    write_image(root / "test" / "a" / "0.png", (0, 0, 0))

    rule = detect_label_rule(root)
    items = scan_items(root, rule)

    assert rule == {"type": "folder", "split": {"train": "train", "valid": valid_name}}
    assert items.is_valid is not None
    pairs = [
        (path.relative_to(root).parts[0], label, flag)
        for (path, label), flag in zip(items.items, items.is_valid, strict=True)
    ]
    assert sorted(set(pairs)) == [
        ("train", "a", False),
        ("train", "b", False),
        (valid_name, "a", True),
        (valid_name, "b", True),
    ]
    assert sum(items.is_valid) == 4
    assert len(items.items) == 10


def test_pets_file_names_give_the_breed_before_the_last_underscore(tmp_path: Path) -> None:
    root = make_pets_dataset(tmp_path / "oxford-iiit-pet", per_breed=2)

    rule = detect_label_rule(root, PETS_LABEL_REGEX)
    labels = labels_by_name(root, rule)

    assert rule == {"type": "regex", "pattern": PETS_LABEL_REGEX, "subfolder": "images"}
    assert labels == {
        "images/Abyssinian_1.jpg": "Abyssinian",
        "images/Abyssinian_2.jpg": "Abyssinian",
        "images/american_bulldog_1.jpg": "american_bulldog",
        "images/american_bulldog_2.jpg": "american_bulldog",
        "images/great_pyrenees_1.jpg": "great_pyrenees",
        "images/great_pyrenees_2.jpg": "great_pyrenees",
    }


def test_fastai_style_regex_and_named_group(tmp_path: Path) -> None:
    root = make_pets_dataset(tmp_path / "pets", breeds=("Bengal", "shiba_inu"), per_breed=1)
    write_image(root / "images" / "README.png", (0, 0, 0))

    fastai_rule = detect_label_rule(root, r"^(.*)_\d+.jpg$")
    named_rule = detect_label_rule(root, r"^(?P<label>[a-z_]+)_\d+\.jpg$")

    assert set(labels_by_name(root, fastai_rule).values()) == {"Bengal", "shiba_inu"}
    assert labels_by_name(root, named_rule) == {"images/shiba_inu_1.jpg": "shiba_inu"}
    skipped = scan_items(root, fastai_rule).skipped
    assert skipped == ["images/README.png (name does not match the label regex)"]


def test_regex_with_train_and_valid_folders(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_image(root / "train" / "cat_1.png", (0, 0, 0))
    write_image(root / "train" / "dog_1.png", (0, 0, 0))
    write_image(root / "valid" / "cat_2.png", (0, 0, 0))
    write_image(root / "valid" / "dog_2.png", (0, 0, 0))

    items = scan_items(root, detect_label_rule(root, PETS_LABEL_REGEX))

    assert [label for _, label in items.items] == ["cat", "dog", "cat", "dog"]
    assert items.is_valid == [False, False, True, True]


@pytest.mark.parametrize(
    ("pattern", "message"),
    [("([a-z", "is not valid"), (r"^\w+\.png$", "needs a group"), ("  ", "is empty")],
)
def test_a_bad_label_regex_is_refused_with_a_reason(
    tmp_path: Path, pattern: str, message: str
) -> None:
    root = make_pets_dataset(tmp_path / "pets", per_breed=1)
    with pytest.raises(DatasetError, match=message):
        detect_label_rule(root, pattern)


@pytest.mark.parametrize("header", [True, False])
def test_csv_of_file_and_label(tmp_path: Path, header: bool) -> None:
    csv_path = make_csv_dataset(tmp_path / "ds", ("cat", "dog"), per_class=2, header=header)

    rule = detect_label_rule(csv_path.parent)
    items = scan_items(csv_path.parent, rule)

    assert rule == {"type": "csv", "file": "labels.csv"}
    assert [(p.name, label) for p, label in items.items] == [
        ("cat-0.png", "cat"),
        ("cat-1.png", "cat"),
        ("dog-0.png", "dog"),
        ("dog-1.png", "dog"),
    ]
    assert items.is_valid is None
    assert items.skipped == []


def test_csv_is_valid_column_and_bad_rows(tmp_path: Path) -> None:
    csv_path = make_csv_dataset(tmp_path / "ds", ("cat", "dog"), per_class=2, with_split=True)
    outside = write_image(tmp_path / "outside.png", (0, 0, 0))
    with open(csv_path, "a") as handle:
        handle.write("pics/missing.png,cat,false\n")
        handle.write("../outside.png,cat,false\n")
        handle.write(f"{outside},cat,false\n")
        handle.write("pics/cat-0.png,cat,maybe\n")
        handle.write("pics/cat-1.png\n")

    items = scan_items(csv_path.parent, {"type": "csv", "file": "labels.csv"})

    assert [(p.name, label) for p, label in items.items] == [
        ("cat-0.png", "cat"),
        ("cat-1.png", "cat"),
        ("dog-0.png", "dog"),
        ("dog-1.png", "dog"),
    ]
    assert items.is_valid == [True, False, True, False]
    assert len(items.skipped) == 5
    assert "line 6: pics/missing.png (no such file)" in items.skipped[0]
    assert "must be a path inside" in items.skipped[1]
    assert "must be a path inside" in items.skipped[2]
    assert "is not true or false" in items.skipped[3]
    assert "expected file,label" in items.skipped[4]


def test_csv_that_is_not_text_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    (root / "labels.csv").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(DatasetError, match="is not UTF-8 text"):
        scan_items(root, {"type": "csv", "file": "labels.csv"})


def test_a_folder_without_a_known_layout_says_what_is_expected(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_image(root / "loose.png", (0, 0, 0))
    with pytest.raises(DatasetError, match="expected one folder of images per class"):
        detect_label_rule(root)


def test_a_lone_wrapping_folder_is_stepped_into(tmp_path: Path) -> None:
    make_folder_dataset(tmp_path / "upload" / "wrapper" / "pets", per_class=1)
    make_split_dataset(tmp_path / "split" / "mnist", ("a", "b"), 1, 1)

    assert dataset_root(tmp_path / "upload") == tmp_path / "upload" / "wrapper" / "pets"
    assert dataset_root(tmp_path / "split") == tmp_path / "split" / "mnist"
    assert dataset_root(tmp_path / "split" / "mnist") == tmp_path / "split" / "mnist"

"""Registering datasets on SQLite and Postgres: validation, bad files, uploads, removal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from sqlalchemy import Engine

from common.files import jobs_dir
from datasets.folders import local_root, uploads_dir, url_data_dir
from datasets.items import dataset_items, preview_items
from datasets.labelling import PETS_LABEL_REGEX, DatasetError
from datasets.register import (
    record_fetched,
    register_csv,
    register_folder,
    register_url,
    register_zip,
    unregister_dataset,
)
from db import queue
from db.datasets import get_dataset, list_datasets
from tests.support.images import (
    files_under,
    make_csv_dataset,
    make_folder_dataset,
    make_pets_dataset,
    make_split_dataset,
    write_corrupt_png,
    write_image,
    zip_folder,
)


def test_a_folder_is_registered_with_its_counts(engine: Engine, data_dir: Path) -> None:
    root = make_folder_dataset(data_dir / "animals", ("cat", "dog", "fox"), per_class=3)

    registration = register_folder(engine, "animals", root)

    dataset = get_dataset(engine, "animals")
    assert dataset is not None
    assert (dataset.kind, dataset.location) == ("folder", str(root))
    assert dataset.label_rule == {"type": "folder"}
    assert dataset.classes == ["cat", "dog", "fox"]
    assert dataset.class_counts == {"cat": 3, "dog": 3, "fox": 3}
    assert dataset.item_count == 9
    assert dataset.bad_files == []
    assert "9 images in 3 classes, a random split per job" in registration.summary()
    assert "animals" in queue.known_dataset_names(engine)


def test_a_corrupt_png_is_reported_stored_and_left_out(engine: Engine, data_dir: Path) -> None:
    root = make_folder_dataset(data_dir / "animals", per_class=3)
    write_corrupt_png(root / "cat" / "broken.png")
    (root / "dog" / "empty.png").write_bytes(b"")

    registration = register_folder(engine, "animals", root)

    dataset = get_dataset(engine, "animals")
    assert dataset.bad_files == ["cat/broken.png", "dog/empty.png"]
    assert dataset.class_counts == {"cat": 3, "dog": 3}
    assert registration.report.bad_files["cat/broken.png"].startswith("cannot be decoded")
    assert "left out 2 files that cannot be decoded: cat/broken.png" in registration.summary()
    items = dataset_items(dataset)
    assert len(items.items) == 6
    assert all(path.name not in ("broken.png", "empty.png") for path, _ in items.items)
    assert "cat/broken.png (cannot be decoded)" in items.skipped


def test_grayscale_rgba_and_palette_images_are_all_valid(engine: Engine, data_dir: Path) -> None:
    root = make_folder_dataset(data_dir / "mixed", per_class=4, modes=("L", "RGBA", "P", "RGB"))

    register_folder(engine, "mixed", root)

    dataset = get_dataset(engine, "mixed")
    assert dataset.bad_files == []
    assert dataset.class_counts == {"cat": 4, "dog": 4}


def test_pets_file_names_register_with_the_right_labels(engine: Engine, data_dir: Path) -> None:
    root = make_pets_dataset(data_dir / "oxford-iiit-pet", per_breed=2)

    register_folder(engine, "pets", root, PETS_LABEL_REGEX)

    dataset = get_dataset(engine, "pets")
    assert dataset.class_counts == {"Abyssinian": 2, "american_bulldog": 2, "great_pyrenees": 2}
    labels = {path.name: label for path, label in dataset_items(dataset).items}
    assert labels["great_pyrenees_2.jpg"] == "great_pyrenees"
    assert labels["Abyssinian_1.jpg"] == "Abyssinian"


def test_a_fixed_split_needs_every_class_in_train_and_valid(engine: Engine, data_dir: Path) -> None:
    root = make_split_dataset(data_dir / "split", ("a", "b"), 2, 1)
    make_folder_dataset(root / "train", ("c",), per_class=2)

    with pytest.raises(DatasetError, match=r"classes with no image to valid on: 'c'"):
        register_folder(engine, "split", root)
    assert get_dataset(engine, "split") is None

    make_folder_dataset(root / "valid", ("c",), per_class=1)
    register_folder(engine, "split", root)
    items = dataset_items(get_dataset(engine, "split"))
    assert items.is_valid is not None
    assert sum(items.is_valid) == 3


@pytest.mark.parametrize(
    ("classes", "per_class", "message"),
    [
        (("only",), 3, r"found 1 class \('only'\); a classifier needs at least 2"),
        (("a", "b"), 1, r"classes with a single image: 'a', 'b'"),
    ],
)
def test_too_few_classes_or_images_are_refused(
    engine: Engine, data_dir: Path, classes: tuple[str, ...], per_class: int, message: str
) -> None:
    root = make_folder_dataset(data_dir / "small", classes, per_class)
    with pytest.raises(DatasetError, match=message):
        register_folder(engine, "small", root)
    assert list_datasets(engine) == []


def test_a_path_outside_the_data_roots_is_refused(
    engine: Engine, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = make_folder_dataset(tmp_path / "elsewhere", per_class=2)
    (data_dir / "sneaky").symlink_to(outside)

    for path in (outside, data_dir / "sneaky", data_dir / ".." / "elsewhere", Path("/etc")):
        with pytest.raises(DatasetError, match="is outside the allowed data roots"):
            register_folder(engine, "outside", path)
    assert get_dataset(engine, "outside") is None

    monkeypatch.setenv("TRAINDECK_DATASET_ROOTS", f"/nonexistent:{tmp_path / 'elsewhere'}")
    register_folder(engine, "outside", outside)
    assert get_dataset(engine, "outside").location == str(outside)


def test_relative_paths_are_inside_the_data_folder(engine: Engine, data_dir: Path) -> None:
    make_folder_dataset(data_dir / "animals", per_class=2)
    register_folder(engine, "animals", "animals")
    assert get_dataset(engine, "animals").location == str(data_dir / "animals")
    with pytest.raises(DatasetError, match="folder missing does not exist"):
        register_folder(engine, "missing", "missing")


def test_an_image_linking_outside_the_roots_is_a_bad_file(
    engine: Engine, data_dir: Path, tmp_path: Path
) -> None:
    root = make_folder_dataset(data_dir / "animals", per_class=2)
    secret = make_folder_dataset(tmp_path / "secret", ("x",), per_class=1)
    (root / "cat" / "leak.png").symlink_to(secret / "x" / "000.png")

    register_folder(engine, "animals", root)

    assert get_dataset(engine, "animals").bad_files == ["cat/leak.png"]


def test_links_into_the_jobs_folder_are_never_images(engine: Engine, data_dir: Path) -> None:
    """Another job's files lie inside the data folder, an allowed root, but belong to no
    dataset: an image-named link to one, a class folder linking there, a CSV row naming one
    and the jobs folder itself are refused, at registration and when a job reads the set."""
    root = make_folder_dataset(data_dir / "animals", per_class=2)
    theirs = write_image(jobs_dir() / "7" / "results" / "top.png", (9, 9, 9))
    (root / "cat" / "peek.png").symlink_to(theirs)
    (root / "spy").symlink_to(theirs.parent, target_is_directory=True)

    registration = register_folder(engine, "animals", root)

    dataset = get_dataset(engine, "animals")
    assert dataset.class_counts == {"cat": 2, "dog": 2}
    assert dataset.bad_files == []
    assert registration.report.skipped == [
        "cat/peek.png (links into the jobs folder)",
        "spy (links into the jobs folder)",
    ]
    assert "2 files skipped: cat/peek.png (links into the jobs folder)" in registration.summary()
    read = [path.name for path, _ in dataset_items(dataset).items]
    assert sorted(read) == ["000.png", "000.png", "001.png", "001.png"]

    labels = data_dir / "labels.csv"
    labels.write_text(
        "".join(f"animals/{c}/00{n}.png,{c}\n" for c in ("cat", "dog") for n in range(2))
        + "jobs/7/results/top.png,cat\n"
    )
    listed = register_csv(engine, "listed", labels)
    assert listed.report.skipped == [
        "labels.csv line 5: jobs/7/results/top.png (lies in the jobs folder)"
    ]
    assert get_dataset(engine, "listed").class_counts == {"cat": 2, "dog": 2}

    for folder in (jobs_dir() / "7", jobs_dir()):
        with pytest.raises(DatasetError, match="is in the jobs folder"):
            register_folder(engine, "jobs", folder)


@pytest.mark.parametrize("name", ["", "../up", "a b", "x" * 101, "digits", "-dash"])
def test_bad_names_are_refused(engine: Engine, data_dir: Path, name: str) -> None:
    root = make_folder_dataset(data_dir / "animals", per_class=2)
    with pytest.raises(DatasetError):
        register_folder(engine, name, root)


def test_a_name_is_registered_once(engine: Engine, data_dir: Path) -> None:
    root = make_folder_dataset(data_dir / "animals", per_class=2)
    register_folder(engine, "animals", root)
    with pytest.raises(DatasetError, match="'animals' is already registered"):
        register_url(engine, "animals", "URLs.PETS")


def test_a_csv_dataset_with_its_own_split(engine: Engine, data_dir: Path) -> None:
    csv_path = make_csv_dataset(data_dir / "listed", per_class=3, with_split=True)

    register_csv(engine, "listed", csv_path)

    dataset = get_dataset(engine, "listed")
    assert dataset.label_rule == {"type": "csv", "file": "labels.csv"}
    assert dataset.class_counts == {"cat": 3, "dog": 3}
    items = dataset_items(dataset)
    assert items.is_valid == [True, False, False, True, False, False]


def test_a_zip_is_unpacked_checked_and_registered(engine: Engine, data_dir: Path, tmp_path):
    source = make_folder_dataset(tmp_path / "src", per_class=3)
    write_corrupt_png(source / "dog" / "bad.png")
    (source / "notes.txt").write_text("hello")
    archive = zip_folder(source, tmp_path / "pets.zip", prefix="pets/")

    registration = register_zip(engine, "pets", io.BytesIO(archive.read_bytes()))

    dataset = get_dataset(engine, "pets")
    assert dataset.kind == "upload"
    assert Path(dataset.location) == uploads_dir() / "pets" / "pets"
    assert dataset.class_counts == {"cat": 3, "dog": 3}
    assert dataset.bad_files == ["dog/bad.png"]
    assert "skipped 1 member that is not an image: pets/notes.txt" in registration.summary()
    assert files_under(uploads_dir()) == {
        "pets",
        "pets/pets",
        "pets/pets/cat",
        "pets/pets/dog",
        *(f"pets/pets/{c}/{n:03d}.png" for c in ("cat", "dog") for n in range(3)),
        "pets/pets/dog/bad.png",
    }


def test_a_failed_upload_leaves_no_files_and_no_row(engine: Engine, data_dir: Path, tmp_path):
    source = make_folder_dataset(tmp_path / "src", ("lonely",), per_class=3)
    archive = zip_folder(source, tmp_path / "one-class.zip")
    hostile = tmp_path / "hostile.zip"
    hostile.write_bytes(b"PK\x03\x04 this is not really a zip")

    with pytest.raises(DatasetError, match="a classifier needs at least 2"):
        register_zip(engine, "lonely", archive)
    with pytest.raises(DatasetError, match="not a readable zip archive"):
        register_zip(engine, "lonely", hostile)

    assert get_dataset(engine, "lonely") is None
    assert files_under(uploads_dir()) == set()


def test_removing_an_upload_deletes_its_files_but_never_a_users_folder(
    engine: Engine, data_dir: Path, tmp_path: Path
) -> None:
    archive = zip_folder(make_folder_dataset(tmp_path / "src", per_class=2), tmp_path / "a.zip")
    register_zip(engine, "uploaded", archive)
    own = make_folder_dataset(data_dir / "mine", per_class=2)
    register_folder(engine, "mine", own)
    job_id = queue.submit(engine, {"dataset": "uploaded", "epochs": 1, "bs": 2})

    with pytest.raises(DatasetError, match=f"used by queued or running jobs \\({job_id}\\)"):
        unregister_dataset(engine, "uploaded")
    queue.cancel(engine, job_id)
    manifest_url = get_dataset(engine, "uploaded").manifest_url
    deleted = unregister_dataset(engine, "uploaded")
    unregister_dataset(engine, "mine")

    assert sorted(deleted) == sorted([manifest_url, str(uploads_dir() / "uploaded")])
    assert files_under(uploads_dir()) == set()
    assert len(list(own.glob("*/*.png"))) == 4
    assert list_datasets(engine) == []
    with pytest.raises(DatasetError, match="no dataset named 'mine'"):
        unregister_dataset(engine, "mine")


def test_a_url_dataset_is_checked_once_fetched(engine: Engine, data_dir: Path) -> None:
    register_url(engine, "pets", "URLs.PETS", PETS_LABEL_REGEX)
    dataset = get_dataset(engine, "pets")
    assert (dataset.kind, dataset.location) == ("url", "URLs.PETS")
    with pytest.raises(DatasetError, match="has not been fetched on this machine yet"):
        dataset_items(dataset)

    # What the worker's fetch leaves behind: the archive's folder under the data folder.
    make_pets_dataset(url_data_dir("pets") / "oxford-iiit-pet", per_breed=2)
    write_corrupt_png(url_data_dir("pets") / "oxford-iiit-pet" / "images" / "Bengal_1.jpg")
    root = local_root(dataset)
    record_fetched(engine, dataset, root)

    fetched = get_dataset(engine, "pets")
    assert root == url_data_dir("pets") / "oxford-iiit-pet"
    assert fetched.class_counts == {"Abyssinian": 2, "american_bulldog": 2, "great_pyrenees": 2}
    assert fetched.bad_files == ["images/Bengal_1.jpg"]
    assert fetched.label_rule["detected"]["type"] == "regex"
    assert len(dataset_items(fetched).items) == 6
    assert len(preview_items(fetched, count=4)) == 4


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x.tgz", "neither a fastai dataset name"),
        ("https://example.com/page.html", "does not name an archive"),
        ("pets", "neither a fastai dataset name"),
    ],
)
def test_bad_urls_are_refused(engine: Engine, url: str, message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        register_url(engine, "remote", url)


def test_preview_takes_samples_from_every_class(engine: Engine, data_dir: Path) -> None:
    root = make_folder_dataset(data_dir / "animals", ("a", "b", "c"), per_class=5)
    register_folder(engine, "animals", root)

    sample = preview_items(get_dataset(engine, "animals"), count=7)

    labels = [label for _, label in sample]
    assert len(sample) == 7
    assert {labels.count(c) for c in ("a", "b", "c")} == {2, 3}
    assert len({path for path, _ in sample}) == 7

"""The Datasets page under Streamlit's AppTest: register, refuse with a message, preview."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine
from streamlit.testing.v1 import AppTest

from datasets.register import register_folder, register_url
from db.datasets import get_dataset
from tests.support.images import (
    make_folder_dataset,
    make_split_dataset,
    write_corrupt_png,
    zip_folder,
)
from tests.support.markdown import shown

PAGE = str(Path(__file__).resolve().parents[2] / "dashboard" / "pages" / "datasets.py")
TIMEOUT_S = 60


@pytest.fixture
def page(sqlite_engine: Engine) -> AppTest:
    app = AppTest.from_file(PAGE, default_timeout=TIMEOUT_S)
    app.run()
    assert not app.exception
    return app


def texts(elements) -> list[str]:
    """What a person reads in these Markdown elements (AppTest gives their source)."""
    return [shown(element.value) for element in elements]


def by_key(app: AppTest, key: str):
    return next(widget for widget in app.text_input if widget.key == key)


def submit(app: AppTest, form_key: str) -> AppTest:
    button = next(b for b in app.button if b.proto.form_id == form_key)
    return button.click().run()


def test_an_empty_registry_says_how_to_start(page: AppTest) -> None:
    assert page.title[0].value == "Datasets"
    assert any("No datasets yet" in message for message in texts(page.info))
    assert not page.error


def test_a_folder_is_registered_and_previewed(page: AppTest, data_dir: Path) -> None:
    root = make_folder_dataset(data_dir / "animals", ("cat", "dog", "fox"), per_class=3)
    write_corrupt_png(root / "cat" / "broken.png")

    by_key(page, "datasets.folder.name").input("animals")
    by_key(page, "datasets.folder.path").input(str(root))
    submit(page, "datasets.folder")

    assert not page.exception
    assert not page.error
    [success] = texts(page.success)
    assert "registered 'animals'" in success
    assert "left out 1 file that cannot be decoded: cat/broken.png" in success
    assert page.selectbox(key="datasets.preview").value == "animals"
    [chart] = page.get("plotly_chart")
    assert '"x":["cat","dog","fox"]' in chart.proto.spec.replace(" ", "")
    captions = [caption for image in page.get("image") for caption in image.captions]
    assert sorted(captions) == ["cat"] * 3 + ["dog"] * 3 + ["fox"] * 3
    assert any("1 file cannot be decoded" in e.label for e in page.expander)


def test_a_folder_outside_the_roots_gets_a_message(page: AppTest, tmp_path: Path) -> None:
    outside = make_folder_dataset(tmp_path / "elsewhere", per_class=2)

    by_key(page, "datasets.folder.name").input("outside")
    by_key(page, "datasets.folder.path").input(str(outside))
    submit(page, "datasets.folder")

    assert not page.exception
    [error] = texts(page.error)
    assert "is outside the allowed data roots" in error
    assert not page.success


def test_a_zip_upload_is_registered(
    page: AppTest, sqlite_engine: Engine, data_dir: Path, tmp_path: Path
) -> None:
    source = make_split_dataset(tmp_path / "src", ("a", "b"), 2, 1)
    archive = zip_folder(source, tmp_path / "letters.zip", prefix="letters/")

    page.get("file_uploader")[0].set_value(("letters.zip", archive.read_bytes(), "application/zip"))
    submit(page, "datasets.zip")

    assert not page.exception
    assert not page.error
    dataset = get_dataset(sqlite_engine, "letters")
    assert dataset.kind == "upload"
    assert dataset.class_counts == {"a": 3, "b": 3}
    [chart] = page.get("plotly_chart")
    assert '"name":"valid"' in chart.proto.spec.replace(" ", "")


def test_a_hostile_zip_upload_gets_a_message(page: AppTest, data_dir: Path) -> None:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("cat/1.png", b"x")
        archive.writestr("../../evil.png", b"x")

    page.get("file_uploader")[0].set_value(("evil.zip", buffer.getvalue(), "application/zip"))
    submit(page, "datasets.zip")

    assert not page.exception
    [error] = texts(page.error)
    assert "points outside the dataset folder" in error
    assert not list((data_dir / "datasets" / "uploads").iterdir())


def test_a_url_dataset_before_its_first_fetch(page: AppTest, sqlite_engine: Engine) -> None:
    by_key(page, "datasets.url.name").input("pets")
    by_key(page, "datasets.url.url").input("URLs.PETS")
    submit(page, "datasets.url")

    assert not page.exception
    assert "registered 'pets'" in texts(page.success)[0]
    assert any("has not been fetched on this machine yet" in m for m in texts(page.info))
    assert get_dataset(sqlite_engine, "pets").location == "URLs.PETS"


def test_remove_needs_a_confirmation(sqlite_engine: Engine, data_dir: Path) -> None:
    register_folder(sqlite_engine, "animals", make_folder_dataset(data_dir / "a", per_class=2))
    register_url(sqlite_engine, "remote", "URLs.MNIST_TINY")
    app = AppTest.from_file(PAGE, default_timeout=TIMEOUT_S).run()

    remove = app.button(key="datasets.remove.animals")
    assert remove.disabled
    app.checkbox(key="datasets.remove.confirm.animals").check().run()
    app.button(key="datasets.remove.animals").click().run()

    assert not app.exception
    assert "Removed dataset 'animals'." in texts(app.success)
    assert get_dataset(sqlite_engine, "animals") is None
    assert (data_dir / "a" / "cat").is_dir()
    assert app.selectbox(key="datasets.preview").options == ["remote"]

"""Hostile and broken zips: nothing is written outside the dataset's folder, nothing is left
half-written, and the message names the problem."""

from __future__ import annotations

import io
import os
import stat
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest

from common.settings import SettingsError
from datasets.uploads import UploadError, UploadLimits, extract_tar, extract_zip, member_parts
from tests.support.images import files_under, write_image

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A folder holding the upload destination's parent and a bystander file."""
    (tmp_path / "uploads").mkdir()
    (tmp_path / "bystander.txt").write_text("untouched")
    return tmp_path


def extract_refused(source: Path | io.BytesIO, workspace: Path, match: str, **limits: int) -> None:
    """Extraction fails with a message matching `match`, and the workspace is unchanged."""
    before = files_under(workspace)
    destination = workspace / "uploads" / "ds"
    with pytest.raises(UploadError, match=match):
        extract_zip(source, destination, UploadLimits(**limits) if limits else None)
    assert files_under(workspace) == before
    assert not destination.exists()


def zip_with(members: list[tuple[zipfile.ZipInfo | str, bytes]]) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for info, data in members:
            archive.writestr(info, data)
    buffer.seek(0)
    return buffer


def test_a_parent_path_member_is_refused(workspace: Path) -> None:
    hostile = zip_with([("cat/1.png", PNG), ("../evil.png", PNG), ("a/../../evil2.png", PNG)])
    extract_refused(hostile, workspace, r"'\.\./evil\.png' points outside the dataset folder")
    assert not (workspace / "uploads" / "evil.png").exists()
    assert not (workspace / "evil2.png").exists()


def test_an_absolute_path_member_is_refused(workspace: Path) -> None:
    target = workspace / "absolute-evil.png"
    hostile = zip_with([("cat/1.png", PNG), (str(target), PNG), ("C:/windows/evil.png", PNG)])
    extract_refused(hostile, workspace, "has an absolute path")
    assert not target.exists()


def test_a_symlink_member_is_refused(workspace: Path) -> None:
    link = zipfile.ZipInfo("cat/link.png")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    hostile = zip_with([("cat/1.png", PNG), (link, b"/etc/passwd")])
    extract_refused(hostile, workspace, "'cat/link.png' is a symbolic link")


def test_ten_thousand_tiny_files_are_refused_by_the_default_limit(workspace: Path) -> None:
    many = zip_with([(f"cat/{n:05d}.png", b"x") for n in range(10_000)])
    extract_refused(many, workspace, "has 10,000 members; the limit is 5,000")


def test_a_limit_can_be_raised_by_the_admin(workspace: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRAINDECK_UPLOAD_MAX_FILES", "3")
    archive = zip_with([(f"cat/{n}.png", PNG) for n in range(4)])
    extract_refused(archive, workspace, "TRAINDECK_UPLOAD_MAX_FILES")
    monkeypatch.setenv("TRAINDECK_UPLOAD_MAX_FILES", "lots")
    with pytest.raises(
        SettingsError, match=r"^TRAINDECK_UPLOAD_MAX_FILES='lots' is not valid: a whole"
    ):
        UploadLimits.from_env()


@pytest.fixture(scope="module")
def gigabyte_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4 MB zip whose one member unpacks to 1 GB of zeros (written as a stream)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.zip"
    chunk = bytes(1 << 22)
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive,
        archive.open("cat/bomb.png", "w", force_zip64=True) as member,
    ):
        for _ in range(239):
            member.write(chunk)
    return path


def test_a_one_gigabyte_bomb_is_refused_before_anything_is_written(
    workspace: Path, gigabyte_bomb: Path
) -> None:
    assert gigabyte_bomb.stat().st_size < 10_000_000
    with zipfile.ZipFile(gigabyte_bomb) as archive:
        assert archive.infolist()[0].file_size > 1_000_000_000
    extract_refused(gigabyte_bomb, workspace, r"unpacks to 1,002 MB; the limit is 500 MB")


def test_the_sizes_of_all_members_add_up_against_the_limit(workspace: Path) -> None:
    archive = zip_with([(f"cat/{n}.png", PNG + bytes(4000)) for n in range(5)])
    extract_refused(
        archive, workspace, "unpacks to 20,120 bytes; the limit is 10,000", max_bytes=10_000
    )


def _lie_about_size(data: bytes, declared: int) -> bytes:
    """Rewrite the uncompressed size of the only member in its local and central headers."""
    patched = bytearray(data)
    local = patched.find(b"PK\x03\x04")
    struct.pack_into("<I", patched, local + 22, declared)
    central = patched.find(b"PK\x01\x02")
    struct.pack_into("<I", patched, central + 24, declared)
    return bytes(patched)


def test_a_member_that_unpacks_to_more_than_it_declares_stops_early(workspace: Path) -> None:
    honest = zip_with([("cat/big.png", bytes(20_000_000))]).getvalue()
    lying = io.BytesIO(_lie_about_size(honest, 1000))
    with zipfile.ZipFile(lying) as archive:
        assert archive.infolist()[0].file_size == 1000
    extract_refused(lying, workspace, "'cat/big.png' is corrupt")


def test_non_images_are_skipped_and_named(workspace: Path) -> None:
    archive = zip_with(
        [
            ("pets/cat/1.png", PNG),
            ("pets/dog/1.png", PNG),
            ("pets/labels.csv", b"cat/1.png,cat\n"),
            ("pets/README.txt", b"hello"),
            ("pets/tool.exe", b"MZ"),
            ("__MACOSX/pets/._1.png", b"fork"),
            ("pets/.DS_Store", b"junk"),
            ("pets/empty/", b""),
        ]
    )
    destination = workspace / "uploads" / "ds"

    report = extract_zip(archive, destination)

    assert files_under(destination) == {
        "pets",
        "pets/cat",
        "pets/cat/1.png",
        "pets/dog",
        "pets/dog/1.png",
        "pets/labels.csv",
    }
    assert report.files_written == 3
    assert report.skipped == [
        "skipped 2 members that are not images: pets/README.txt, pets/tool.exe"
    ]


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_duplicate_members_and_clashing_names_are_refused(workspace: Path) -> None:
    extract_refused(zip_with([("a/1.png", PNG), ("a/1.png", PNG)]), workspace, "appears twice")
    extract_refused(zip_with([("a/x.png", PNG), ("a/x.png/1.png", PNG)]), workspace, "clashes with")


def test_something_that_is_not_a_zip_is_refused(workspace: Path) -> None:
    not_zip = write_image(workspace / "photo.png", (1, 2, 3))
    extract_refused(not_zip, workspace, "is not a readable zip archive")


def test_member_names_are_checked_component_by_component() -> None:
    assert member_parts("./cats/./1.png") == ("cats", "1.png")
    assert member_parts("cats\\1.png") == ("cats", "1.png")
    assert member_parts("cats..png") == ("cats..png",)
    for hostile in ("..", "a/../../b", "..\\b", "/etc/passwd", "d:x.png", "a\x00b"):
        with pytest.raises(UploadError):
            member_parts(hostile)


# A downloaded tar (`extract_tar`, for url datasets) follows the same rules, member by member.


def tar_with(
    members: list[tuple[tarfile.TarInfo | str, bytes]], mode: str = "w:gz", **options
) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode, **options) as archive:
        for info, data in members:
            member = tarfile.TarInfo(info) if isinstance(info, str) else info
            if member.isreg():
                member.size = len(data)
            archive.addfile(member, io.BytesIO(data) if member.isreg() else None)
    buffer.seek(0)
    return buffer


def tar_refused(source: io.BytesIO, workspace: Path, match: str, **limits: int) -> None:
    """Extraction fails with a message matching `match`, and the workspace is unchanged."""
    before = files_under(workspace)
    destination = workspace / "uploads" / "ds"
    with pytest.raises(UploadError, match=match):
        extract_tar(source, destination, UploadLimits(**limits) if limits else None)
    assert files_under(workspace) == before
    assert not destination.exists()


def _special(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    member.linkname = target
    return member


@pytest.mark.parametrize(
    ("member", "words"),
    [
        ("../evil.png", r"'\.\./evil\.png' points outside the dataset folder"),
        ("/tmp/absolute-evil.png", "has an absolute path"),
        (_special("cat/link.png", tarfile.SYMTYPE, "/etc/passwd"), "is a symbolic link"),
        (_special("cat/hard.png", tarfile.LNKTYPE, "cat/1.png"), "is a hard link"),
        (_special("cat/tty.png", tarfile.CHRTYPE), "is a special file"),
        (_special("cat/pipe.png", tarfile.FIFOTYPE), "is a special file"),
    ],
)
def test_a_hostile_tar_member_is_refused_and_nothing_stays(
    workspace: Path, member: tarfile.TarInfo | str, words: str
) -> None:
    hostile = tar_with([("cat/1.png", PNG), ("dog/1.png", PNG), (member, PNG)])
    tar_refused(hostile, workspace, words)


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_a_tar_is_unpacked_by_the_rules_of_an_upload(workspace: Path, mode: str) -> None:
    archive = tar_with(
        [
            ("pets/cat/1.png", PNG),
            ("pets/dog/1.png", PNG),
            ("pets/labels.csv", b"cat/1.png,cat\n"),
            ("pets/README.txt", b"hello"),
            ("pets/.DS_Store", b"junk"),
            (_special("pets/empty", tarfile.DIRTYPE), b""),
        ],
        mode,
    )
    destination = workspace / "uploads" / "ds"

    report = extract_tar(archive, destination)

    assert files_under(destination) == {
        "pets",
        "pets/cat",
        "pets/cat/1.png",
        "pets/dog",
        "pets/dog/1.png",
        "pets/labels.csv",
    }
    assert (report.files_written, report.bytes_written) == (3, 2 * len(PNG) + 14)
    assert report.skipped == ["skipped 1 member that is not an image: pets/README.txt"]


def test_a_tar_counts_every_member_against_the_limits(workspace: Path) -> None:
    many = tar_with([(f"cat/{n}.png", PNG) for n in range(4)])
    tar_refused(many, workspace, "more than 3 members", max_files=3)
    skipped_too = tar_with([("cat/1.png", PNG), ("notes.txt", bytes(20_000))])
    tar_refused(skipped_too, workspace, "unpacks to more than 10,000 bytes", max_bytes=10_000)


def test_a_tar_header_too_large_to_hold_is_refused(workspace: Path) -> None:
    member = tarfile.TarInfo("cat/1.png")
    member.pax_headers = {"comment": "x" * 2_000_000}
    huge = tar_with([(member, PNG)], format=tarfile.PAX_FORMAT)
    tar_refused(huge, workspace, "an extended header of 2 MB")


def test_a_tar_bomb_stops_at_the_limit(workspace: Path) -> None:
    bomb = tar_with([("cat/1.png", PNG), ("cat/zeros.png", bytes(50_000_000))])
    assert len(bomb.getvalue()) < 200_000
    tar_refused(bomb, workspace, r"unpacks to more than 10 MB", max_bytes=10_000_000)


def test_something_that_is_not_a_tar_is_refused(workspace: Path) -> None:
    tar_refused(io.BytesIO(b"<html>not found</html>" * 40), workspace, "not a readable tar")
    truncated = tar_with([("cat/1.png", os.urandom(100_000))]).getvalue()[:50_000]
    tar_refused(io.BytesIO(truncated), workspace, "corrupt|not a readable tar")

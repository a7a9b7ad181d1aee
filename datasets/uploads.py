"""Safe extraction of an uploaded zip of images.

Every member is checked before a byte is written: no absolute paths, no `..`, no links or
special files, no encryption, at most `max_files` members and `max_bytes` declared in all.
While writing, the bytes actually produced are counted too, since a header can lie. Members
that are not images (nor a CSV of labels) are skipped and named. Files are only ever created
inside the destination folder, which is new; on any failure it is removed again, so a failed
upload leaves nothing behind.

Limits: `TRAINDECK_UPLOAD_MAX_FILES` (default 5,000 members) and `TRAINDECK_UPLOAD_MAX_MB`
(default 500 MB uncompressed), read through `common.settings`.
"""

from __future__ import annotations

import re
import shutil
import stat
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from common.settings import Settings, settings
from datasets.labelling import DatasetError, is_hidden, is_image_name

MAX_FILES_ENV = "TRAINDECK_UPLOAD_MAX_FILES"
MAX_MB_ENV = "TRAINDECK_UPLOAD_MAX_MB"
DEFAULT_MAX_FILES: int = Settings.model_fields["upload_max_files"].default
DEFAULT_MAX_MB: int = Settings.model_fields["upload_max_mb"].default
CHUNK_BYTES = 1 << 20
KEPT_SUFFIXES = frozenset({".csv"})
MAX_PROBLEMS_SHOWN = 5
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")


class UploadError(DatasetError):
    """An archive was refused; the message names the members at fault."""


@dataclass(frozen=True)
class UploadLimits:
    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_MB * 1_000_000

    @classmethod
    def from_env(cls) -> UploadLimits:
        """The limits in the environment (a bad value is a one-line SettingsError)."""
        current = settings()
        return cls(max_files=current.upload_max_files, max_bytes=current.upload_max_mb * 1_000_000)


def _size(byte_count: int) -> str:
    if byte_count >= 1_000_000:
        return f"{byte_count / 1e6:,.0f} MB"
    return f"{byte_count:,} bytes"


@dataclass
class ExtractReport:
    files_written: int = 0
    bytes_written: int = 0
    skipped: list[str] = field(default_factory=list)


def member_parts(name: str) -> tuple[str, ...]:
    """The path components of a member name, or an UploadError when it could land outside
    the destination folder."""
    text = name.replace("\\", "/")
    if "\x00" in text:
        raise UploadError(f"member {name!r} has a NUL character in its name")
    if text.startswith("/") or _WINDOWS_DRIVE.match(text):
        raise UploadError(f"member {name!r} has an absolute path")
    parts = tuple(part for part in PurePosixPath(text).parts if part not in ("", "."))
    if ".." in parts:
        raise UploadError(f"member {name!r} points outside the dataset folder (..)")
    return parts


def _member_kind(info: zipfile.ZipInfo) -> str:
    """'dir', 'file', or the kind of special file that is refused."""
    mode = info.external_attr >> 16
    file_type = stat.S_IFMT(mode)
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if info.is_dir() or file_type == stat.S_IFDIR:
        return "dir"
    if file_type not in (0, stat.S_IFREG):
        return "a special file"
    return "file"


def _plan(
    archive: zipfile.ZipFile, limits: UploadLimits, report: ExtractReport
) -> list[tuple[zipfile.ZipInfo, tuple[str, ...]]]:
    """The members to write, after refusing the archive if any member is hostile."""
    members = archive.infolist()
    if len(members) > limits.max_files:
        raise UploadError(
            f"the archive has {len(members):,} members; the limit is {limits.max_files:,} "
            f"(an admin can raise it with {MAX_FILES_ENV})"
        )
    problems: list[str] = []
    planned: list[tuple[zipfile.ZipInfo, tuple[str, ...]]] = []
    not_images: list[str] = []
    declared = 0
    for info in members:
        try:
            parts = member_parts(info.filename)
        except UploadError as exc:
            problems.append(str(exc))
            continue
        kind = _member_kind(info)
        if kind == "dir" or not parts:
            continue
        if kind != "file":
            problems.append(f"member {info.filename!r} is {kind}")
            continue
        if info.flag_bits & 0x1:
            problems.append(f"member {info.filename!r} is encrypted")
            continue
        if any(is_hidden(part) for part in parts):
            continue
        suffix = PurePosixPath(parts[-1]).suffix.lower()
        if not is_image_name(parts[-1]) and suffix not in KEPT_SUFFIXES:
            not_images.append(info.filename)
            continue
        declared += info.file_size
        planned.append((info, parts))
    if problems:
        shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
        more = len(problems) - MAX_PROBLEMS_SHOWN
        raise UploadError(
            "the archive was refused: " + shown + (f"; and {more} more" if more > 0 else "")
        )
    if declared > limits.max_bytes:
        raise UploadError(
            f"the archive unpacks to {_size(declared)}; the limit is "
            f"{_size(limits.max_bytes)} (an admin can raise it with {MAX_MB_ENV})"
        )
    if not_images:
        shown = ", ".join(not_images[:MAX_PROBLEMS_SHOWN])
        more = len(not_images) - MAX_PROBLEMS_SHOWN
        report.skipped.append(
            f"skipped {len(not_images)} "
            + (
                "member that is not an image"
                if len(not_images) == 1
                else "members that are not images"
            )
            + f": {shown}"
            + (f" and {more} more" if more > 0 else "")
        )
    return planned


def _copy_member(
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    target: Path,
    limits: UploadLimits,
    report: ExtractReport,
) -> None:
    written = 0
    with archive.open(info) as source, open(target, "xb") as sink:
        while chunk := source.read(CHUNK_BYTES):
            written += len(chunk)
            if written > info.file_size:
                raise UploadError(
                    f"member {info.filename!r} unpacks to more than the "
                    f"{info.file_size:,} bytes its header declares"
                )
            if report.bytes_written + written > limits.max_bytes:
                raise UploadError(
                    f"the archive unpacks to more than {_size(limits.max_bytes)} "
                    f"(an admin can raise the limit with {MAX_MB_ENV})"
                )
            sink.write(chunk)
    report.bytes_written += written
    report.files_written += 1


def _write(
    archive: zipfile.ZipFile,
    planned: list[tuple[zipfile.ZipInfo, tuple[str, ...]]],
    destination: Path,
    limits: UploadLimits,
    report: ExtractReport,
) -> None:
    for info, parts in planned:
        target = destination.joinpath(*parts)
        if not target.parent.resolve().is_relative_to(destination):
            raise UploadError(f"member {info.filename!r} points outside the dataset folder")
        clash = UploadError(
            f"member {info.filename!r} clashes with a file or folder of the same name"
        )
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise clash from None
        try:
            _copy_member(archive, info, target, limits, report)
        except FileExistsError:
            if target.is_dir():
                raise clash from None
            raise UploadError(f"member {info.filename!r} appears twice in the archive") from None
        except (NotADirectoryError, IsADirectoryError):
            raise clash from None
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise UploadError(f"member {info.filename!r} is corrupt: {exc}") from None
        except NotImplementedError as exc:
            raise UploadError(f"member {info.filename!r} cannot be unpacked: {exc}") from None
        except OSError as exc:
            raise UploadError(
                f"cannot write member {info.filename!r}: {exc.strerror or exc}"
            ) from None


def extract_zip(
    source: Path | BinaryIO, destination: Path, limits: UploadLimits | None = None
) -> ExtractReport:
    """Unpack the zip `source` into the new folder `destination`, safely (see the module
    docstring). On failure `destination` is removed and an UploadError says why."""
    limits = limits or UploadLimits.from_env()
    destination = destination.resolve()
    report = ExtractReport()
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise UploadError(f"the upload is not a readable zip archive ({exc})") from None
    except OSError as exc:
        raise UploadError(f"cannot read the archive: {exc.strerror or exc}") from None
    with archive:
        planned = _plan(archive, limits, report)
        destination.mkdir(parents=True, exist_ok=False)
        try:
            _write(archive, planned, destination, limits, report)
        except BaseException:
            shutil.rmtree(destination, ignore_errors=True)
            raise
    return report

"""Safe extraction of an uploaded zip of images, and of a downloaded zip or tar archive.

Every member of a zip is checked before a byte is written: no absolute paths, no `..`, no
links or special files, no encryption, at most `max_files` members and `max_bytes` declared in
all. While writing, the bytes actually produced are counted too, since a header can lie.
Members that are not images (nor a CSV of labels) are skipped and named. Files are only ever
created inside the destination folder, which is new; on any failure it is removed again, so a
failed upload leaves nothing behind.

A tar (plain, gzip, bzip2 or xz: `extract_tar`, for `url` datasets) has no table of contents,
so it is read as a stream under the same rules, checked member by member as it comes: the
first hostile member stops it and removes everything written. Every member counts against the
limits, the ones skipped too (they are decompressed all the same), and so does every byte the
decompressor produces, headers included, so neither a gzip of zeros nor a long run of
oversized headers can cost more than the limit.

Limits: `TRAINDECK_UPLOAD_MAX_FILES` (default 5,000 members) and `TRAINDECK_UPLOAD_MAX_MB`
(default 500 MB uncompressed), read through `common.settings`.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO

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
# A tar's long-name and pax headers are read whole into memory by tarfile: keep them small.
MAX_TAR_HEADER_BYTES = 1 << 20
# Besides the members' bytes, a tar stream holds a 512-byte header (and up to 511 bytes of
# padding) per member, a pax or long-name header now and then, and its end blocks.
TAR_BYTES_PER_MEMBER = 2 * 512
TAR_SLACK_BYTES = MAX_TAR_HEADER_BYTES + 64 * 512
_CORRUPT = (zipfile.BadZipFile, tarfile.TarError, zlib.error, lzma.LZMAError, EOFError)


class UploadError(DatasetError):
    """An archive was refused; the message names the members at fault."""


@dataclass(frozen=True)
class UploadLimits:
    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_MB * 1_000_000
    # The settings a message names for raising each limit.
    files_setting: str = MAX_FILES_ENV
    bytes_setting: str = MAX_MB_ENV

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
            f"(an admin can raise it with {limits.files_setting})"
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
            f"{_size(limits.max_bytes)} (an admin can raise it with {limits.bytes_setting})"
        )
    _name_skipped(not_images, report)
    return planned


def _name_skipped(not_images: list[str], report: ExtractReport) -> None:
    if not not_images:
        return
    shown = ", ".join(not_images[:MAX_PROBLEMS_SHOWN])
    more = len(not_images) - MAX_PROBLEMS_SHOWN
    report.skipped.append(
        f"skipped {len(not_images)} "
        + ("member that is not an image" if len(not_images) == 1 else "members that are not images")
        + f": {shown}"
        + (f" and {more} more" if more > 0 else "")
    )


def _too_large(limits: UploadLimits) -> UploadError:
    return UploadError(
        f"the archive unpacks to more than {_size(limits.max_bytes)} "
        f"(an admin can raise the limit with {limits.bytes_setting})"
    )


def _copy_member(
    source: IO[bytes],
    name: str,
    declared: int,
    target: Path,
    limits: UploadLimits,
    report: ExtractReport,
) -> None:
    written = 0
    with source, open(target, "xb") as sink:
        while chunk := source.read(CHUNK_BYTES):
            written += len(chunk)
            if written > declared:
                raise UploadError(
                    f"member {name!r} unpacks to more than the {declared:,} bytes its header "
                    "declares"
                )
            if report.bytes_written + written > limits.max_bytes:
                raise _too_large(limits)
            sink.write(chunk)
    report.bytes_written += written
    report.files_written += 1


def _write_member(
    name: str,
    parts: tuple[str, ...],
    declared: int,
    open_source: Callable[[], IO[bytes]],
    destination: Path,
    limits: UploadLimits,
    report: ExtractReport,
) -> None:
    """Write one member, of `declared` bytes, as `destination/parts…` (a new file)."""
    target = destination.joinpath(*parts)
    if not target.parent.resolve().is_relative_to(destination):
        raise UploadError(f"member {name!r} points outside the dataset folder")
    clash = UploadError(f"member {name!r} clashes with a file or folder of the same name")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise clash from None
    try:
        _copy_member(open_source(), name, declared, target, limits, report)
    except FileExistsError:
        if target.is_dir():
            raise clash from None
        raise UploadError(f"member {name!r} appears twice in the archive") from None
    except (NotADirectoryError, IsADirectoryError):
        raise clash from None
    except (*_CORRUPT, gzip.BadGzipFile) as exc:
        raise UploadError(f"member {name!r} is corrupt: {exc}") from None
    except NotImplementedError as exc:
        raise UploadError(f"member {name!r} cannot be unpacked: {exc}") from None
    except OSError as exc:
        raise UploadError(f"cannot write member {name!r}: {exc.strerror or exc}") from None


def _write(
    archive: zipfile.ZipFile,
    planned: list[tuple[zipfile.ZipInfo, tuple[str, ...]]],
    destination: Path,
    limits: UploadLimits,
    report: ExtractReport,
) -> None:
    for info, parts in planned:
        _write_member(
            info.filename,
            parts,
            info.file_size,
            lambda info=info: archive.open(info),
            destination,
            limits,
            report,
        )


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


class _CountedStream:
    """The decompressed bytes of a tar, refused past `limit` bytes in all."""

    def __init__(self, source: IO[bytes], limit: int, limits: UploadLimits) -> None:
        self._source = source
        self._limit = limit
        self._limits = limits
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        left = self._limit + 1 - self.count
        chunk = self._source.read(left if size is None or size < 0 else min(size, left))
        self.count += len(chunk)
        if self.count > self._limit:
            raise _too_large(self._limits)
        return chunk


def _decompressed(raw: IO[bytes]) -> IO[bytes]:
    """The tar stream inside `raw`: gzip, bzip2 and xz by their magic bytes, else as it is."""
    magic = raw.read(6)
    raw.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(raw, mode="rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw, mode="rb")
    return raw


class _BoundedTarInfo(tarfile.TarInfo):
    """A tar header whose long-name or pax extension, which tarfile reads into memory whole,
    must be small."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        extended = (
            tarfile.GNUTYPE_LONGNAME,
            tarfile.GNUTYPE_LONGLINK,
            tarfile.XHDTYPE,
            tarfile.XGLTYPE,
            tarfile.SOLARIS_XHDTYPE,
        )
        if self.type in extended and self.size > MAX_TAR_HEADER_BYTES:
            raise UploadError(
                f"the archive was refused: an extended header of {_size(self.size)} "
                f"(at most {_size(MAX_TAR_HEADER_BYTES)})"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def _tar_kind(member: tarfile.TarInfo) -> str:
    """'dir', 'file', or the kind of member that is refused."""
    if member.isdir():
        return "dir"
    if member.issym():
        return "a symbolic link"
    if member.islnk():
        return "a hard link"
    if member.issparse():
        return "a sparse file"
    if member.isfile():
        return "file"
    return "a special file"


def _extract_tar_members(
    archive: tarfile.TarFile, destination: Path, limits: UploadLimits, report: ExtractReport
) -> list[str]:
    """Write the image members of a tar opened as a stream; returns the non-images skipped."""
    not_images: list[str] = []
    members = 0
    declared = 0
    for member in archive:
        members += 1
        if members > limits.max_files:
            raise UploadError(
                f"the archive has more than {limits.max_files:,} members (an admin can raise "
                f"the limit with {limits.files_setting})"
            )
        declared += max(member.size, 0)
        if declared > limits.max_bytes:
            raise _too_large(limits)
        parts = member_parts(member.name)
        kind = _tar_kind(member)
        if kind == "dir" or not parts:
            continue
        if kind != "file":
            raise UploadError(f"the archive was refused: member {member.name!r} is {kind}")
        if any(is_hidden(part) for part in parts):
            continue
        suffix = PurePosixPath(parts[-1]).suffix.lower()
        if not is_image_name(parts[-1]) and suffix not in KEPT_SUFFIXES:
            not_images.append(member.name)
            continue

        def open_member(member: tarfile.TarInfo = member) -> IO[bytes]:
            source = archive.extractfile(member)
            if source is None:
                raise UploadError(f"member {member.name!r} cannot be unpacked")
            return source

        _write_member(member.name, parts, member.size, open_member, destination, limits, report)
    return not_images


def _opened(source: Path | BinaryIO) -> AbstractContextManager[IO[bytes]]:
    """`source` to read in a `with`: a path opened (and closed after), a file left open."""
    return open(source, "rb") if isinstance(source, Path) else nullcontext(source)


def extract_tar(
    source: Path | BinaryIO, destination: Path, limits: UploadLimits | None = None
) -> ExtractReport:
    """Unpack the tar `source` (plain, gzip, bzip2 or xz) into the new folder `destination`
    by the rules of a zip upload (see the module docstring). On failure `destination` is
    removed and an UploadError says why."""
    limits = limits or UploadLimits.from_env()
    destination = destination.resolve()
    report = ExtractReport()
    try:
        opened = _opened(source)
    except OSError as exc:
        raise UploadError(f"cannot read the archive: {exc.strerror or exc}") from None
    budget = limits.max_bytes + limits.max_files * TAR_BYTES_PER_MEMBER + TAR_SLACK_BYTES
    destination.mkdir(parents=True, exist_ok=False)
    try:
        with opened as raw:
            stream = _CountedStream(_decompressed(raw), budget, limits)
            with tarfile.open(
                fileobj=stream,
                mode="r|",
                tarinfo=_BoundedTarInfo,  # type: ignore[arg-type]
            ) as archive:
                not_images = _extract_tar_members(archive, destination, limits, report)
    except UploadError:
        shutil.rmtree(destination, ignore_errors=True)
        raise
    except (*_CORRUPT, OSError) as exc:
        shutil.rmtree(destination, ignore_errors=True)
        detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise UploadError(f"the archive is not a readable tar archive ({detail})") from None
    except BaseException:
        shutil.rmtree(destination, ignore_errors=True)
        raise
    _name_skipped(not_images, report)
    return report

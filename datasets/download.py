"""Downloading the archive of a `url` dataset and unpacking it, within limits, leaving nothing
behind when it fails.

- Only the URLs `datasets.urls` allows. The host is resolved once per request, every address
  it resolves to is checked, and the connection goes to one of those addresses (the Host
  header and the TLS certificate check still use the name), so a name cannot pass the check
  and then resolve elsewhere. Every redirect (at most `MAX_REDIRECTS`) is checked the same way.
  Proxy variables are not used.
- A reply other than 200 is an error naming its status and the URL (its password masked);
  its body is never read, so no page of any server reaches a job's error.
- At most `TRAINDECK_URL_MAX_MB` downloaded: a larger Content-Length is refused before a byte
  is read, and the bytes are counted as they arrive. The archive (a zip, or a tar: plain,
  gzip, bzip2 or xz) is unpacked by the rules of an upload (`datasets.uploads`): no links,
  devices, absolute or `..` paths, at most `TRAINDECK_URL_MAX_FILES` members and
  `TRAINDECK_URL_MAX_UNPACKED_MB`, counted while unpacking.
- The download and the unpacking happen in hidden folders beside the target, which appears in
  one rename once whole; on any failure every file written is removed.
"""

from __future__ import annotations

import base64
import contextlib
import http
import http.client
import shutil
import socket
import ssl
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urljoin

from common.settings import settings
from datasets.labelling import DatasetError
from datasets.uploads import ExtractReport, UploadError, UploadLimits, extract_tar, extract_zip
from datasets.urls import AllowList, UrlRefused, resolve_checked, shown_url, split_url

MAX_MB_ENV = "TRAINDECK_URL_MAX_MB"
MAX_UNPACKED_MB_ENV = "TRAINDECK_URL_MAX_UNPACKED_MB"
MAX_FILES_ENV = "TRAINDECK_URL_MAX_FILES"
TIMEOUT_S = 60.0
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
CHUNK_BYTES = 1 << 20
USER_AGENT = "traindeck"
PART_PREFIX = ".download-"
STAGING_PREFIX = ".staging-"


class FetchError(DatasetError):
    """A `url` dataset could not be downloaded or unpacked on this machine."""


@dataclass(frozen=True)
class FetchLimits:
    """How much one `url` dataset may download and unpack."""

    max_download_bytes: int
    unpack: UploadLimits

    @classmethod
    def from_env(cls) -> FetchLimits:
        current = settings()
        return cls(
            max_download_bytes=current.url_max_mb * 1_000_000,
            unpack=UploadLimits(
                max_files=current.url_max_files,
                max_bytes=current.url_max_unpacked_mb * 1_000_000,
                files_setting=MAX_FILES_ENV,
                bytes_setting=MAX_UNPACKED_MB_ENV,
            ),
        )


def _megabytes(byte_count: int) -> str:
    return f"{byte_count / 1e6:,.0f} MB" if byte_count >= 1_000_000 else f"{byte_count:,} bytes"


def offline_message(what: str, url: str, reason: object) -> str:
    return (
        f"could not download {what} from {shown_url(url)} ({reason}). Is this worker offline? "
        "Download the archive on a machine that is online, copy it here, and register the "
        f"unpacked folder with `python -m db dataset add NAME --folder PATH` "
        "(or upload it as a zip in the dashboard)"
    )


def _connect(addresses: list[str], port: int, timeout: float) -> socket.socket:
    """A TCP connection to the first of the checked `addresses` that answers."""
    last: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout=timeout)
        except OSError as exc:
            last = exc
    raise last or ConnectionError("no address to connect to")


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to `host`, connecting only to the addresses checked for it."""

    def __init__(self, host: str, port: int, addresses: list[str], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses

    def connect(self) -> None:
        self.sock = _connect(self._addresses, self.port, self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to `host` (certificate and SNI for the name), connecting only to the addresses
    checked for it."""

    def __init__(self, host: str, port: int, addresses: list[str], timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._addresses = addresses

    def connect(self) -> None:
        sock = _connect(self._addresses, self.port, self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)


def _status(code: int) -> str:
    """'403 Forbidden': the standard phrase, never the server's own words."""
    try:
        return f"{code} {http.HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


def _request(
    url: str, allow: AllowList, timeout: float, credentials: str | None
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    parts, host, port = split_url(url)
    addresses = resolve_checked(url, allow)
    connection_type = (
        _PinnedHTTPSConnection if parts.scheme.lower() == "https" else _PinnedHTTPConnection
    )
    connection = connection_type(host, port, addresses, timeout)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if credentials:
        headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    try:
        connection.request("GET", path, headers=headers)
        return connection, connection.getresponse()
    except BaseException:
        connection.close()
        raise


def _credentials(url: str) -> str | None:
    parts, _, _ = split_url(url)
    if parts.username is None:
        return None
    return f"{unquote(parts.username)}:{unquote(parts.password or '')}"


def _same_origin(first: str, second: str) -> bool:
    one, two = split_url(first), split_url(second)
    return (one[0].scheme.lower(), one[1], one[2]) == (two[0].scheme.lower(), two[1], two[2])


def download(
    url: str,
    target: Path,
    what: str,
    max_bytes: int,
    allow: AllowList | None = None,
    timeout: float = TIMEOUT_S,
) -> int:
    """Write the body of `url` (after checked redirects) to the new file `target`; return its
    size. A FetchError (UrlRefused included) says what went wrong; `target` is then removed."""
    allow = allow if allow is not None else AllowList.from_settings()
    credentials = _credentials(url)
    current = url
    try:
        for _ in range(MAX_REDIRECTS + 1):
            try:
                connection, response = _request(current, allow, timeout, credentials)
            except UrlRefused as exc:
                prefix = "" if current == url else f"{shown_url(url)} redirected to "
                raise FetchError(f"{what} cannot be downloaded: {prefix}{exc}") from None
            with contextlib.closing(connection):
                if response.status in REDIRECTS:
                    location = response.getheader("Location")
                    if not location:
                        raise FetchError(
                            f"could not download {what}: {shown_url(current)} answered "
                            f"{_status(response.status)} without a Location"
                        )
                    following = urljoin(current, location.strip())
                    if not _same_origin(current, following):
                        credentials = None  # a password is for the host it was written for
                    current = following
                    continue
                if response.status != http.HTTPStatus.OK:
                    raise FetchError(
                        f"could not download {what} from {shown_url(current)}: the server "
                        f"answered {_status(response.status)}"
                    )
                return _save(response, target, what, current, max_bytes)
        raise FetchError(
            f"could not download {what} from {shown_url(url)}: more than {MAX_REDIRECTS} redirects"
        )
    except FetchError:
        target.unlink(missing_ok=True)
        raise
    except http.client.HTTPException as exc:
        # Its message can quote what the server sent (a status line of 64 KB): never shown.
        target.unlink(missing_ok=True)
        reason = f"the reply is not valid HTTP: {type(exc).__name__}"
        raise FetchError(offline_message(what, current, reason)) from None
    except OSError as exc:
        target.unlink(missing_ok=True)
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise FetchError(offline_message(what, current, reason)) from None
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def _too_large(what: str, url: str, max_bytes: int, size: str) -> FetchError:
    return FetchError(
        f"{what} at {shown_url(url)} is {size}; the limit is {_megabytes(max_bytes)} "
        f"(an admin can raise it with {MAX_MB_ENV})"
    )


def _save(
    response: http.client.HTTPResponse, target: Path, what: str, url: str, max_bytes: int
) -> int:
    declared = response.getheader("Content-Length")
    if declared and declared.strip().isdigit() and int(declared) > max_bytes:
        raise _too_large(what, url, max_bytes, _megabytes(int(declared)))
    written = 0
    with _new_file(what, target) as sink:
        # A network error while reading passes through (the caller words it); a full disk
        # is said as such.
        while chunk := response.read(CHUNK_BYTES):
            written += len(chunk)
            if written > max_bytes:
                raise _too_large(what, url, max_bytes, f"more than {_megabytes(max_bytes)}")
            try:
                sink.write(chunk)
            except OSError as exc:
                raise _cannot_write(what, target, exc) from None
    return written


def _new_file(what: str, target: Path) -> BinaryIO:
    try:
        return open(target, "xb")
    except OSError as exc:
        raise _cannot_write(what, target, exc) from None


def _cannot_write(what: str, target: Path, exc: OSError) -> FetchError:
    return FetchError(
        f"cannot write the download of {what} in {target.parent}: {exc.strerror or exc}"
    )


def unpack(archive: Path, destination: Path, limits: UploadLimits) -> ExtractReport:
    """Unpack the zip or tar `archive` into the new folder `destination` (removed on failure)."""
    if zipfile.is_zipfile(archive):
        return extract_zip(archive, destination, limits)
    return extract_tar(archive, destination, limits)


def _remove(*paths: Path) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def fetch_archive(
    url: str,
    destination: Path,
    what: str,
    limits: FetchLimits | None = None,
    allow: AllowList | None = None,
) -> ExtractReport:
    """Download the archive at `url` and unpack it as the new folder `destination`.

    The archive and the half-unpacked files live in hidden siblings of `destination` and are
    removed whatever happens; `destination` appears only once complete. If another process
    completed it first, that copy is kept. On failure nothing is left but `destination`'s
    parent, which is removed too when it is empty."""
    limits = limits or FetchLimits.from_env()
    parent = destination.parent
    parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:8]
    part = parent / f"{PART_PREFIX}{token}"
    staging = parent / f"{STAGING_PREFIX}{token}"
    try:
        download(url, part, what, limits.max_download_bytes, allow)
        try:
            report = unpack(part, staging, limits.unpack)
        except UploadError as exc:
            raise FetchError(
                f"the archive of {what} ({shown_url(url)}) cannot be unpacked safely: {exc}"
            ) from None
        part.unlink()
        try:
            staging.rename(destination)
        except OSError:
            if not destination.is_dir():
                raise
            _remove(staging)  # another worker on this machine unpacked it first
        return report
    except BaseException:
        _remove(part, staging)
        with contextlib.suppress(OSError):
            parent.rmdir()  # only when empty: a folder this fetch created
        raise

"""A Python client for traindeck's HTTP API (/api/v1 on the dashboard's server), for scripts
and notebooks on any machine that reaches the dashboard. It needs the standard library and
pandas only.

    from traindeck.client import Client
    deck = Client("http://localhost:8501", token="td_…")   # or TRAINDECK_URL, TRAINDECK_TOKEN
    job_id = deck.submit(arch="resnet18", epochs=3, tags=["baseline"])
    deck.wait(job_id)
    deck.metrics(job_id, names=["epoch/accuracy"], raw=True)

Every refusal is an `ApiError` carrying the API's message (the CLI's words) and, for a wrong
input, the fields at fault.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

FINISHED = ("succeeded", "failed", "cancelled")
CHUNK_BYTES = 1 << 20


class ApiError(Exception):
    """The API refused a request (`status` 4xx/5xx) or could not be reached (`status` 0)."""

    def __init__(self, status: int, message: str, fields: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.fields = fields or {}


def _query(params: dict[str, Any]) -> str:
    pairs = []
    for name, value in params.items():
        if value is None or value == () or value == []:
            continue
        values = value if isinstance(value, list | tuple) else [value]
        pairs += [(name, str(item).lower() if isinstance(item, bool) else item) for item in values]
    return "?" + urllib.parse.urlencode(pairs) if pairs else ""


class Client:
    """One dashboard's API, reached at `url` with `token`."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 60):
        url = (url or os.environ.get("TRAINDECK_URL") or "").rstrip("/")
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"url must be the dashboard's http(s):// address, not {url!r}")
        token = token or os.environ.get("TRAINDECK_TOKEN")
        if not token:
            raise ValueError("a token is needed: make one on the dashboard's Settings page")
        self.url = url
        self._token = token
        self.timeout = timeout

    def __repr__(self) -> str:  # never the token
        return f"Client({self.url!r})"

    # --- HTTP -----------------------------------------------------------------------------

    def _open(self, method: str, path: str, body: Any = None):
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.url + "/api/v1" + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self._token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise self._refusal(exc) from None
        except urllib.error.URLError as exc:
            raise ApiError(0, f"cannot reach {self.url}: {exc.reason}") from None

    @staticmethod
    def _refusal(exc: urllib.error.HTTPError) -> ApiError:
        try:
            body = json.loads(exc.read())
            return ApiError(exc.code, str(body["error"]), body.get("fields"))
        except (ValueError, KeyError, TypeError):
            return ApiError(exc.code, f"HTTP {exc.code} {exc.reason}")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        with self._open(method, path, body) as response:
            return json.loads(response.read())

    # --- jobs -----------------------------------------------------------------------------

    def submit(self, spec: dict[str, Any] | None = None, **fields: Any) -> int:
        """Queue a job from a spec (any spec field, `tags` and `note` included; keywords
        override `spec`). Returns its id."""
        return self._call("POST", "/jobs", {**(spec or {}), **fields})["id"]

    def submit_sweep(self, definition: dict[str, Any]) -> int:
        """Start a sweep from its definition (what `traindeck sweep submit FILE` reads, as a
        dict). Returns its id; its trials are jobs tagged `sweep-ID`."""
        return self._call("POST", "/sweeps", definition)["id"]

    def sweeps(self) -> list[dict[str, Any]]:
        """Every sweep, newest first, as `traindeck sweep list --json` prints them."""
        return self._call("GET", "/sweeps")

    def sweep(self, sweep_id: int) -> dict[str, Any]:
        """One sweep with its trials (params, status, objective) and the best, as `traindeck
        sweep show ID --json` prints it."""
        return self._call("GET", f"/sweeps/{int(sweep_id)}")

    def jobs(
        self,
        status: str | Iterable[str] | None = None,
        tag: str | Iterable[str] | None = None,
        dataset: str | None = None,
        arch: str | None = None,
        q: str | None = None,
        order: str = "newest",
        limit: int | None = 50,
    ) -> list[dict[str, Any]]:
        """Jobs as `traindeck jobs --json` lists them, filtered on the server; `limit=None`
        reads every page."""
        params = {"status": _items(status), "tag": _items(tag), "dataset": dataset,
                  "arch": arch, "q": q, "order": order}  # fmt: skip
        found: list[dict[str, Any]] = []
        after = None
        while limit is None or len(found) < limit:
            size = 500 if limit is None else min(500, limit - len(found))
            page = self._call("GET", "/jobs" + _query({**params, "limit": size, "after": after}))
            found += page["jobs"]
            after = page["next_after"]
            if after is None:
                break
        return found

    def job(self, job_id: int) -> dict[str, Any]:
        """One job as `traindeck show ID --json` prints it."""
        return self._call("GET", f"/jobs/{int(job_id)}")

    def label(self, job_id: int, tags: Iterable[str] | None = None, note: str | None = None):
        """Change a job's tags and/or note; returns the job."""
        changes: dict[str, Any] = {}
        if tags is not None:
            changes["tags"] = list(tags)
        if note is not None:
            changes["note"] = note
        return self._call("PATCH", f"/jobs/{int(job_id)}", changes)

    def cancel(self, job_id: int) -> str:
        """'cancelled' (it was queued) or 'cancelling' (it stops at its next batch)."""
        return self._call("POST", f"/jobs/{int(job_id)}/cancel")["status"]

    def retry(self, job_id: int) -> int:
        """Queue a finished job again as a new job; returns the new id."""
        return self._call("POST", f"/jobs/{int(job_id)}/retry")["id"]

    def wait(self, job_id: int, timeout: float | None = None, poll_s: float = 5.0) -> dict:
        """The job once it has finished (succeeded, failed or cancelled), asking every
        `poll_s` seconds; TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in FINISHED:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job['status']} after {timeout} s")
            time.sleep(poll_s)

    # --- metrics and files ----------------------------------------------------------------

    def metrics(
        self,
        job_id: int,
        names: str | Iterable[str] | None = None,
        raw: bool = False,
        buckets: int | None = None,
        since: int | None = None,
    ) -> pd.DataFrame:
        """A job's metric series as one DataFrame: raw (`raw=True`, or `since`) a row per point
        (name, step, value); else min/max buckets (name, first_step, last_step, min, max, mean,
        count). `frame.attrs["cursor"]` passed as `since` reads only the points written after."""
        params = {"name": _items(names), "raw": raw, "buckets": buckets, "since": since}
        read = self._call("GET", f"/jobs/{int(job_id)}/metrics" + _query(params))
        frames = [
            pd.DataFrame({"name": name, **columns}) for name, columns in read["series"].items()
        ]
        columns = ["name", "step", "value"] if read["raw"] else [
            "name", "first_step", "last_step", "min", "max", "mean", "count"]  # fmt: skip
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
        frame.attrs["cursor"] = read["cursor"]
        frame.attrs["complete"] = read["complete"]
        return frame

    def artifacts(self, job_id: int) -> list[dict[str, Any]]:
        """The job's files: kind, file_name, bytes, sha256, url."""
        return self._call("GET", f"/jobs/{int(job_id)}/artifacts")["artifacts"]

    def download(self, job_id: int, kind: str = "export", to: str | os.PathLike = ".") -> Path:
        """Download one of the job's files into the folder `to` (made if missing), checking its
        SHA-256; returns its path. A file whose bytes do not match is not kept (ApiError)."""
        folder = Path(to)
        folder.mkdir(parents=True, exist_ok=True)
        path = f"/jobs/{int(job_id)}/artifacts/{urllib.parse.quote(kind, safe='')}"
        with self._open("GET", path) as response:
            name = Path(_file_name(response.headers.get("Content-Disposition", ""), kind)).name
            expected = _digest(response.headers.get("Repr-Digest", ""))
            digest = hashlib.sha256()
            with tempfile.NamedTemporaryFile(dir=folder, delete=False) as partial:
                while chunk := response.read(CHUNK_BYTES):
                    digest.update(chunk)
                    partial.write(chunk)
        if expected is not None and digest.digest() != expected:
            os.unlink(partial.name)
            raise ApiError(0, f"{name}: the bytes received do not match the file's SHA-256")
        target = folder / name
        os.replace(partial.name, target)
        return target


def _items(value: str | Iterable[str] | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _file_name(disposition: str, fallback: str) -> str:
    _, _, rest = disposition.partition('filename="')
    return rest.split('"', 1)[0] or fallback


def _digest(header: str) -> bytes | None:
    """The SHA-256 in a `Repr-Digest: sha-256=:BASE64:` header, else None."""
    _, _, rest = header.partition("sha-256=:")
    return base64.b64decode(rest.split(":", 1)[0]) if rest else None

"""Which multi-host TPU pod slice this machine is a host of, and which host it is.

Every host of a multi-host slice runs a worker (the same startup script on each), and together
they run one job at a time (`worker.slice_supervisor`, `db.gang`). A worker learns its place as
libtpu and torch_xla do (`torch_xla._internal.tpu`):

- from `TPU_WORKER_HOSTNAMES` (the slice's hosts, comma-separated, in host order) and
  `TPU_WORKER_ID` (this host's number) where they are set; the tests set them to make N worker
  processes on one machine pose as the hosts of one slice;
- else, on a TPU VM, from its metadata server: `worker-network-endpoints` (one
  `name:uid:address` per host), `agent-worker-number` (this host) and `tpu-env` (whose NODE_ID
  is the TPU's name).

The slice's name is TRAINDECK_SLICE where set, else the TPU's name, else host 0's name: every
host of a slice finds the same one. One host (or no TPU at all) is no slice: None; but a worker
given TRAINDECK_SLICE that can find its place neither way refuses to start, rather than take
single-host jobs on a slice's host.

The startup script (`cloud.bootstrap`) hands the worker TRAINDECK_SLICE, but no host number:
the number found here comes from what the job process's libtpu reads, so the two agree, and
a number without the hosts' addresses could not run a gang's job anyway.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from common.settings import SettingsError

log = logging.getLogger(__name__)

# google-auth's variable for the metadata server's address; a test points it at a local fake.
METADATA_HOST_VARIABLE = "GCE_METADATA_HOST"
METADATA_HOST = "metadata.google.internal"
METADATA_TIMEOUT_S = 2.0
# libtpu's lock: left behind by a killed process, it makes the next one find the TPU "in use".
LIBTPU_LOCKFILE = Path("/tmp/libtpu_lockfile")
_NODE_ID = re.compile(r"^NODE_ID:\s*['\"]?([^'\"\n]*)['\"]?\s*$", re.MULTILINE)

# One metadata attribute of this VM by its key, or None when there is none (or no server).
Metadata = Callable[[str], "str | None"]


class SliceError(SettingsError):
    """The slice this host belongs to cannot be told from the environment or the metadata;
    one line naming the variable and what it accepts."""


@dataclass(frozen=True)
class SliceHost:
    """This machine's place in its slice: the slice's name, this host's number, the hosts."""

    name: str
    host: int
    hosts: int

    def __str__(self) -> str:
        return f"host {self.host} of the {self.hosts} hosts of slice {self.name}"


def metadata_attribute(key: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """An attribute of this VM from the metadata server, or None when it is not there."""
    host = environ.get(METADATA_HOST_VARIABLE) or METADATA_HOST
    url = f"http://{host}/computeMetadata/v1/instance/attributes/{key}"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=METADATA_TIMEOUT_S) as response:
            return response.read().decode("utf-8", errors="replace").strip()
    except (OSError, urllib.error.HTTPError, ValueError):
        return None


def find_slice(
    environ: Mapping[str, str],
    name: str | None,
    metadata: Metadata | None,
) -> SliceHost | None:
    """This host's place in its slice, from `environ` or else `metadata` (None: not a TPU VM,
    no metadata to ask); `name` is TRAINDECK_SLICE. None when the machine is a single host."""
    listed = environ.get("TPU_WORKER_HOSTNAMES", "").strip()
    if listed:
        hostnames = [entry.strip() for entry in listed.split(",") if entry.strip()]
        if len(hostnames) < 2:
            return None
        host = _host_number(environ.get("TPU_WORKER_ID"), len(hostnames), "TPU_WORKER_ID")
        return SliceHost(name or hostnames[0], host, len(hostnames))
    endpoints = metadata("worker-network-endpoints") if metadata is not None else None
    if not endpoints:
        if name:  # the startup script of a slice's host set it: a single host it is not
            raise SliceError(
                f"TRAINDECK_SLICE={name!r} is set, but this host's place in the slice is "
                "unknown: the TPU metadata server does not answer; set TPU_WORKER_ID and "
                "TPU_WORKER_HOSTNAMES"
            )
        return None
    hosts = [entry for entry in endpoints.split(",") if entry.strip()]
    if len(hosts) < 2:
        return None
    host = _host_number(
        metadata("agent-worker-number"), len(hosts), "the metadata's agent-worker-number"
    )
    node = _NODE_ID.search(metadata("tpu-env") or "")
    tpu_name = node.group(1).strip() if node else ""
    return SliceHost(name or tpu_name or hosts[0].split(":")[-1], host, len(hosts))


def _host_number(text: str | None, hosts: int, source: str) -> int:
    accepts = f"this host's number, 0 to {hosts - 1} (the slice has {hosts} hosts)"
    if text is None or not text.strip():
        raise SliceError(f"{source} is not set: {accepts}")
    try:
        number = int(text.strip())
    except ValueError:
        raise SliceError(f"{source}={text!r} is not valid: {accepts}") from None
    if not 0 <= number < hosts:
        raise SliceError(f"{source}={text!r} is not valid: {accepts}")
    return number


def this_host() -> SliceHost | None:
    """This worker's place in its slice (environment, else the metadata server on a TPU VM),
    or None on a single host."""
    from common.settings import settings
    from worker.devices import tpu_present

    metadata = metadata_attribute if tpu_present() else None
    return find_slice(os.environ, settings().slice_name, metadata)


def clear_libtpu_lockfile(path: Path = LIBTPU_LOCKFILE) -> bool:
    """Remove libtpu's lock file left by a killed job process; whether there was one. Called
    only while no job process of this worker runs (the one before it has ended)."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("cannot remove the stale libtpu lock file %s: %s", path, exc)
        return False
    return True

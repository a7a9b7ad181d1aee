"""Cloud TPU VMs through `google.cloud.tpu_v2`: list, create, start, stop and delete nodes,
follow the long-running operations those start, find credentials, and word every failure
for a person. No Streamlit here: the TPU VMs page and the watcher (`python -m
cloud.watch`) both build on it.

Configuration (environment):
- `TRAINDECK_TPU_API_ENDPOINT`: the API's address, `https://tpu.googleapis.com` by default; an
  `http://host:port` address is a local fake or emulator.
- `TRAINDECK_TPU_CREDENTIALS`: a service-account key file (JSON). Unset: Application Default
  Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, `gcloud auth application-default login`, or
  the metadata server of a Google Cloud VM). `anonymous` is accepted for a local endpoint only.
- `TRAINDECK_TPU_PROJECT` (else `GOOGLE_CLOUD_PROJECT`, else the credentials' project) and
  `TRAINDECK_TPU_ZONE`: what the page starts with.

A plain TPU VM (`create_node`) is a single host: a node's accelerator type is looked up in the
zone through the API (`AcceleratorType.accelerator_configs[].topology`), and a type whose slice
spans several TPU VM hosts is refused before anything is created. A multi-host slice is
requested as a queued resource instead (`cloud.slices`), with a worker on every host:
experimental, since it was never run on a real slice.

Preemption: a node in one of `LOST_STATES` no longer runs its worker, so
`recover_jobs_of_lost_nodes` puts the running jobs of its worker (or, on a slice, of every
host's worker) back in the queue at once (they resume from their checkpoints elsewhere) with a
job event saying why.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import google.auth
import requests
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.oauth2 import service_account
from google.rpc import code_pb2

from common.errors import first_line
from common.settings import settings
from db import queue
from db.engine import Engine

GOOGLE_TPU_API_ENDPOINT = "https://tpu.googleapis.com"
ENDPOINT_ENV = "TRAINDECK_TPU_API_ENDPOINT"
CREDENTIALS_ENV = "TRAINDECK_TPU_CREDENTIALS"
ANONYMOUS = "anonymous"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

# The client library sets no timeout of its own: a silent endpoint would hang the page.
REQUEST_TIMEOUT_S = 30.0
WORKER_ID_PREFIX = "tpu-"
# On a multi-host slice every host's worker is started as tpu-<node name>; host 0 keeps that
# id and host N > 0 names itself tpu-<node name>-host<N> (the gang worker's rule, issue 25).
SLICE_HOST_SEPARATOR = "-host"
TRAINDECK_LABEL = ("managed-by", "traindeck")
MAX_STARTUP_SCRIPT_BYTES = 256 * 1024  # the Compute Engine limit of one metadata value

# States in which the node's VM is gone: whatever its worker was running must move elsewhere.
LOST_STATES = ("PREEMPTED", "TERMINATED", "STOPPED")
LOST_STATE_WORDS = {
    "PREEMPTED": "was preempted (Google Cloud took the spot capacity back)",
    "TERMINATED": "was terminated (maintenance, or the end of its spot lifetime)",
    "STOPPED": "was stopped",
}

NODE_NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
ACCELERATOR_TYPE_PATTERN = re.compile(r"^v\d+[a-z]*-\d+$")
PROJECT_PATTERN = re.compile(r"^[a-z][-a-z0-9:.]{4,62}[a-z0-9]$")
ZONE_PATTERN = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")
RESOURCE_NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

# What PyTorch/XLA's documentation runs on each TPU generation.
RUNTIME_VERSION_FOR = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}
COMMON_ACCELERATOR_TYPES = ("v2-8", "v3-8", "v4-8", "v5litepod-8", "v5p-8", "v6e-8")

# How many chips one TPU VM holds, by generation (`AcceleratorConfig.Type`). Cloud TPU docs,
# "Supported configurations" of each version (cloud.google.com/tpu/docs/v4, v5p, v5e, v6e, and
# system-architecture-tpu-vm): a v2, v3, v4 or v5p host has 4 chips (v4-8 is 2x2x1, one host;
# v5p 2x2x2 is 8 chips on 2 hosts). A v5e or v6e VM holds up to 8 chips (v5litepod-8 and v6e-8
# are 2x4 on one VM), but a larger slice is built of 4-chip VMs (v6e table: 4x4 = 16 chips on
# 4 VMs, ct6e-standard-4t), and every one of those VMs runs the startup script.
SINGLE_HOST_MAX_CHIPS = {
    tpu_v2.AcceleratorConfig.Type.V2: 4,
    tpu_v2.AcceleratorConfig.Type.V3: 4,
    tpu_v2.AcceleratorConfig.Type.V4: 4,
    tpu_v2.AcceleratorConfig.Type.V5P: 4,
    tpu_v2.AcceleratorConfig.Type.V5LITE_POD: 8,
    tpu_v2.AcceleratorConfig.Type.V6E: 8,
}
CHIPS_PER_HOST_OF_A_SLICE = 4

HOW_TO_SET_CREDENTIALS = (
    "To manage TPU VMs here, give the dashboard Google Cloud credentials with the role "
    "TPU Admin (`roles/tpu.admin`), in one of these ways, then press *Check again*:\n"
    "- run `gcloud auth application-default login` on the machine of the dashboard "
    "(Application Default Credentials);\n"
    "- set `TRAINDECK_TPU_CREDENTIALS` (or `GOOGLE_APPLICATION_CREDENTIALS`) to the path of "
    "a service-account key file (JSON) before starting the dashboard;\n"
    "- or run the dashboard on a Google Cloud VM whose service account has that role.\n\n"
    "Everything else in traindeck works without them."
)


class TpuError(Exception):
    """Something went wrong with the Cloud TPU API, worded for a person."""


class CredentialsMissing(TpuError):
    """No usable credentials: the message says what was tried and how to set them."""


class NodeRequestError(TpuError):
    """A node to create is described wrongly; the message lists every problem."""


class AcceleratorTypeRefused(NodeRequestError):
    """The zone does not offer the accelerator type, or traindeck cannot run on it (yet)."""


# --- where the API is, and who we are -------------------------------------------------------


def api_endpoint() -> str:
    """`TRAINDECK_TPU_API_ENDPOINT` (checked by the settings), or Google's endpoint."""
    return settings().tpu_api_endpoint or GOOGLE_TPU_API_ENDPOINT


def is_google_endpoint(endpoint: str) -> bool:
    host = urlsplit(endpoint).hostname or ""
    return host == "googleapis.com" or host.endswith(".googleapis.com")


@dataclass(frozen=True)
class FoundCredentials:
    credentials: Credentials
    project: str | None
    source: str


def load_credentials(endpoint: str) -> FoundCredentials:
    """The credentials to call `endpoint` with, or `CredentialsMissing` saying why not."""
    raw = settings().tpu_credentials or ""
    if raw.lower() == ANONYMOUS:
        if is_google_endpoint(endpoint):
            raise CredentialsMissing(
                f"{CREDENTIALS_ENV}=anonymous works only with a local API endpoint "
                f"({ENDPOINT_ENV}), not with {endpoint}.\n\n{HOW_TO_SET_CREDENTIALS}"
            )
        return FoundCredentials(AnonymousCredentials(), None, f"anonymous, for {endpoint}")
    if raw:
        return _service_account_file(Path(raw).expanduser())
    try:
        credentials, project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except auth_exceptions.DefaultCredentialsError as exc:
        raise CredentialsMissing(
            f"No Google Cloud credentials were found ({first_line(exc)}).\n\n"
            f"{HOW_TO_SET_CREDENTIALS}"
        ) from None
    return FoundCredentials(credentials, project, "Application Default Credentials")


def _service_account_file(path: Path) -> FoundCredentials:
    problem = f"{CREDENTIALS_ENV} names {path}, which"
    if not path.is_file():
        raise CredentialsMissing(f"{problem} is not a file.\n\n{HOW_TO_SET_CREDENTIALS}")
    try:
        credentials = service_account.Credentials.from_service_account_file(
            str(path), scopes=[CLOUD_PLATFORM_SCOPE]
        )
    except (ValueError, KeyError, OSError) as exc:
        raise CredentialsMissing(
            f"{problem} is not a usable service-account key file: {first_line(exc)}.\n\n"
            f"{HOW_TO_SET_CREDENTIALS}"
        ) from None
    source = f"service account {credentials.service_account_email} (key file {path})"
    return FoundCredentials(credentials, credentials.project_id, source)


def default_project(found: FoundCredentials | None = None) -> str:
    # GOOGLE_CLOUD_PROJECT is Google's own variable, read as google-auth reads it.
    chosen = settings().tpu_project or os.environ.get("GOOGLE_CLOUD_PROJECT", "").strip()
    return chosen or (found.project if found else None) or ""


def default_zone() -> str:
    return settings().tpu_zone or ""


def make_client(endpoint: str, credentials: Credentials) -> tpu_v2.TpuClient:
    """The real `TpuClient` on the REST transport, pointed at `endpoint`."""
    options = None if endpoint == GOOGLE_TPU_API_ENDPOINT else ClientOptions(api_endpoint=endpoint)
    return tpu_v2.TpuClient(credentials=credentials, transport="rest", client_options=options)


# --- what the page shows --------------------------------------------------------------------


def worker_id_for_node(node_name: str) -> str:
    """The traindeck worker that the bootstrap script starts on the node `node_name`."""
    return f"{WORKER_ID_PREFIX}{node_name}"


def worker_id_for_host(node_name: str, host: int) -> str:
    """The worker on host `host` of the multi-host slice `node_name`: host 0's is the node's
    own worker id, host N's ends in -host<N>."""
    if host == 0:
        return worker_id_for_node(node_name)
    return f"{worker_id_for_node(node_name)}{SLICE_HOST_SEPARATOR}{host}"


def is_worker_of_node(worker_id: str, node_name: str) -> bool:
    """Whether `worker_id` runs on the node `node_name`: its only worker, or one of its hosts'."""
    own = worker_id_for_node(node_name)
    if worker_id == own:
        return True
    host = worker_id.removeprefix(own + SLICE_HOST_SEPARATOR)
    return host != worker_id and host.isdigit()


@dataclass(frozen=True)
class NodeInfo:
    """One TPU VM, in the words the page uses."""

    name: str
    resource_name: str
    accelerator_type: str
    runtime_version: str
    state: str
    health: str
    health_description: str
    internal_ips: tuple[str, ...]
    external_ips: tuple[str, ...]
    spot: bool
    preemptible: bool
    network: str
    subnetwork: str
    external_ip_enabled: bool
    labels: dict[str, str]
    startup_script: str | None
    description: str
    created_at: datetime | None
    # The queued resource that created this node (its short name), or "".
    queued_resource: str = ""

    @property
    def worker_id(self) -> str:
        return worker_id_for_node(self.name)

    @property
    def is_lost(self) -> bool:
        return self.state in LOST_STATES

    @property
    def is_traindeck(self) -> bool:
        return self.labels.get(TRAINDECK_LABEL[0]) == TRAINDECK_LABEL[1]

    @property
    def pricing(self) -> str:
        if self.spot:
            return "spot"
        return "preemptible" if self.preemptible else "on-demand"


def node_info(node: tpu_v2.Node) -> NodeInfo:
    endpoints = list(node.network_endpoints)
    created = node.create_time
    accelerator = node.accelerator_type
    if not accelerator and node.accelerator_config.topology:
        config = node.accelerator_config
        accelerator = f"{config.type_.name.lower()} {config.topology}"
    return NodeInfo(
        name=node.name.rsplit("/", 1)[-1],
        resource_name=node.name,
        accelerator_type=accelerator or "—",
        runtime_version=node.runtime_version,
        state=tpu_v2.Node.State(node.state).name,
        health=tpu_v2.Node.Health(node.health).name,
        health_description=node.health_description,
        internal_ips=tuple(e.ip_address for e in endpoints if e.ip_address),
        external_ips=tuple(
            e.access_config.external_ip for e in endpoints if e.access_config.external_ip
        ),
        spot=node.scheduling_config.spot,
        preemptible=node.scheduling_config.preemptible,
        network=node.network_config.network,
        subnetwork=node.network_config.subnetwork,
        external_ip_enabled=node.network_config.enable_external_ips,
        labels=dict(node.labels),
        startup_script=dict(node.metadata).get("startup-script"),
        description=node.description,
        created_at=datetime.fromtimestamp(created.timestamp(), UTC) if created else None,
        queued_resource=node.queued_resource.rsplit("/", 1)[-1],
    )


@dataclass(frozen=True)
class NodeRequest:
    """What a person asks for when creating a TPU VM."""

    name: str
    accelerator_type: str
    runtime_version: str
    startup_script: str
    spot: bool = True
    network: str = "default"
    subnetwork: str = ""
    external_ip: bool = True
    description: str = "traindeck worker"
    labels: dict[str, str] = field(default_factory=lambda: dict([TRAINDECK_LABEL]))

    def problems(self) -> list[str]:
        found = []
        if not NODE_NAME_PATTERN.match(self.name):
            found.append(
                f"The name {self.name!r} is not a valid TPU VM name: 1 to 63 lowercase "
                "letters, digits and hyphens, starting with a letter and not ending with a "
                "hyphen."
            )
        if not ACCELERATOR_TYPE_PATTERN.match(self.accelerator_type):
            found.append(
                f"The accelerator type {self.accelerator_type!r} is not one like v3-8, v4-8 "
                "or v5litepod-8."
            )
        if not self.runtime_version.strip() or any(c.isspace() for c in self.runtime_version):
            found.append(
                f"The runtime version {self.runtime_version!r} is empty or contains spaces "
                "(e.g. tpu-ubuntu2204-base)."
            )
        for what, value in (("network", self.network), ("subnetwork", self.subnetwork)):
            if value and not _is_network_name(value):
                found.append(
                    f"The {what} {value!r} is neither a name like 'default' nor a path like "
                    f"projects/PROJECT/global/networks/NAME."
                )
        if not self.startup_script.strip():
            found.append("The startup script is empty: the VM would not start a worker.")
        elif len(self.startup_script.encode()) > MAX_STARTUP_SCRIPT_BYTES:
            found.append(
                f"The startup script is {len(self.startup_script.encode()):,} bytes; a "
                f"metadata value holds at most {MAX_STARTUP_SCRIPT_BYTES:,}."
            )
        return found

    def to_node(self) -> tpu_v2.Node:
        network = tpu_v2.NetworkConfig(
            network=self.network or "default",
            subnetwork=self.subnetwork,
            enable_external_ips=self.external_ip,
        )
        return tpu_v2.Node(
            accelerator_type=self.accelerator_type,
            runtime_version=self.runtime_version.strip(),
            description=self.description,
            network_config=network,
            scheduling_config=tpu_v2.SchedulingConfig(spot=self.spot),
            metadata={"startup-script": self.startup_script},
            labels=self.labels,
        )


def _is_network_name(value: str) -> bool:
    if RESOURCE_NAME_PATTERN.match(value):
        return True
    parts = value.split("/")
    return (
        len(parts) in (5, 6)
        and parts[0] == "projects"
        and parts[-2] in ("networks", "subnetworks")
        and all(parts)
    )


def request_from_node(node: NodeInfo) -> NodeRequest:
    """The request that creates `node` again (after a preemption), startup script included."""
    return NodeRequest(
        name=node.name,
        accelerator_type=node.accelerator_type,
        runtime_version=node.runtime_version,
        startup_script=node.startup_script or "",
        spot=node.spot or node.preemptible,
        network=node.network.rsplit("/", 1)[-1] if node.network else "default",
        subnetwork=node.subnetwork,
        external_ip=node.external_ip_enabled,
        description=node.description or "traindeck worker",
        labels=node.labels or dict([TRAINDECK_LABEL]),
    )


@dataclass(frozen=True)
class AcceleratorShape:
    """An accelerator type as the zone offers it: its topology, chips and TPU VM hosts."""

    type: str
    topology: str
    chips: int
    hosts: int

    @property
    def single_host(self) -> bool:
        return self.hosts == 1


def accelerator_shape(item: tpu_v2.AcceleratorType) -> AcceleratorShape | None:
    """The chips and hosts of `item`, from its topology ("2x2x4": 16 chips); None when the API
    gives no topology to count them from."""
    shapes = []
    for config in item.accelerator_configs:
        dimensions = config.topology.lower().split("x")
        if not all(d.isdigit() and int(d) > 0 for d in dimensions):
            continue
        chips = 1
        for dimension in dimensions:
            chips *= int(dimension)
        largest_single_host = SINGLE_HOST_MAX_CHIPS.get(config.type_, CHIPS_PER_HOST_OF_A_SLICE)
        hosts = 1 if chips <= largest_single_host else -(-chips // CHIPS_PER_HOST_OF_A_SLICE)
        shapes.append(AcceleratorShape(item.type_, config.topology, chips, hosts))
    # Several configs of one type have the same chips; the most hosts is the cautious answer.
    return max(shapes, key=lambda shape: shape.hosts, default=None)


def accelerator_type_refusal(
    accelerator_type: str, zone: str, offered: dict[str, AcceleratorShape | None]
) -> str | None:
    """Why traindeck will not create a node of `accelerator_type` in `zone`, whose offered
    types are `offered` (None: it may)."""
    single_host = [name for name, shape in offered.items() if shape and shape.single_host]
    if accelerator_type not in offered:
        choices = ", ".join(sorted(single_host, key=accelerator_order)) or "none"
        return (
            f"The accelerator type {accelerator_type} is not offered in {zone}; single-host "
            f"types offered there: {choices}."
        )
    shape = offered[accelerator_type]
    if shape is None:
        return (
            f"The Cloud TPU API gives no topology for {accelerator_type} in {zone}, so its "
            "number of hosts is unknown; traindeck creates single-host types only for now."
        )
    if shape.single_host:
        return None
    generation = accelerator_type.rsplit("-", 1)[0]
    same_generation = [name for name in single_host if name.rsplit("-", 1)[0] == generation]
    suggestion = max(same_generation or single_host, key=accelerator_order, default=None)
    pick = f"pick a single-host type such as {suggestion}"
    if suggestion is None:
        pick = f"{zone} offers no single-host type"
    return (
        f"{accelerator_type} is a multi-host slice ({shape.hosts} hosts, {shape.chips} chips "
        f"in a {shape.topology} topology); traindeck runs one job on one TPU VM host for now; "
        f"{pick}. {SLICE_AS_QUEUED_RESOURCE}"
    )


EXPERIMENTAL_SLICE = "experimental: not verified on a real slice"
SLICE_AS_QUEUED_RESOURCE = (
    f"A multi-host slice can be requested as a queued resource instead ({EXPERIMENTAL_SLICE})."
)


def suggested_runtime_version(accelerator_type: str) -> str:
    generation = accelerator_type.split("-", 1)[0]
    return RUNTIME_VERSION_FOR.get(generation, "tpu-ubuntu2204-base")


@dataclass(frozen=True)
class OperationStatus:
    """Where a long-running operation stands."""

    name: str
    verb: str
    target: str
    done: bool
    detail: str
    error: str | None
    started_at: datetime | None
    ended_at: datetime | None

    @property
    def target_name(self) -> str:
        return self.target.rsplit("/", 1)[-1]

    @property
    def succeeded(self) -> bool:
        return self.done and self.error is None

    def elapsed_s(self, now: datetime | None = None) -> float | None:
        if self.started_at is None:
            return None
        end = self.ended_at or now or datetime.now(UTC)
        return max(0.0, (end - self.started_at).total_seconds())


def operation_status(operation: operations_pb2.Operation) -> OperationStatus:
    metadata = tpu_v2.OperationMetadata()
    if operation.HasField("metadata") and operation.metadata.type_url.endswith("OperationMetadata"):
        metadata = tpu_v2.OperationMetadata.deserialize(operation.metadata.value)
    error = None
    if operation.HasField("error") and operation.error.code:
        error = describe_operation_error(
            metadata.verb, metadata.target, operation.error.code, operation.error.message
        )
    created, ended = metadata.create_time, metadata.end_time
    return OperationStatus(
        name=operation.name,
        verb=metadata.verb or "operation",
        target=metadata.target,
        done=operation.done,
        detail=metadata.status_detail,
        error=error,
        started_at=datetime.fromtimestamp(created.timestamp(), UTC) if created else None,
        ended_at=datetime.fromtimestamp(ended.timestamp(), UTC) if ended else None,
    )


def describe_operation_error(verb: str, target: str, code: int, message: str) -> str:
    what = f"{verb or 'The operation'} {target.rsplit('/', 1)[-1]}".strip()
    name = code_pb2.Code.Name(code) if code in code_pb2.Code.values() else str(code)
    text = f"{what} failed: {message} ({name})"
    if code == code_pb2.RESOURCE_EXHAUSTED:
        text += (
            ". The zone has no free capacity of this type, or the project's quota is used up: "
            "try again later, another zone, or ask for more quota (IAM & Admin → Quotas)."
        )
    return text


# --- errors, worded for a person ------------------------------------------------------------


def describe_api_error(exc: Exception, doing: str, endpoint: str, project: str = "") -> str:
    """A readable message for a failure of the API call described by `doing`."""
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        # The REST transport prefixes the API's message with "POST https://…: ".
        message = _REQUEST_PREFIX.sub("", exc.message or str(exc))
        status = f"HTTP {exc.code}" if exc.code else "error"
        if isinstance(exc, api_exceptions.TooManyRequests) or "quota" in message.lower():
            return (
                f"Quota exceeded while {doing}: {message} ({status}). Ask for more quota "
                "(Google Cloud console → IAM & Admin → Quotas), or choose another zone or "
                "accelerator type."
            )
        if isinstance(exc, api_exceptions.Forbidden):
            where = f" in project {project}" if project else ""
            return (
                f"Permission denied while {doing}: {message} ({status}). The credentials "
                f"need the role TPU Admin (roles/tpu.admin){where}, and the Cloud TPU API "
                "must be enabled there."
            )
        if isinstance(exc, api_exceptions.Unauthorized):
            return (
                f"The Cloud TPU API did not accept the credentials while {doing}: {message} "
                f"({status}). {HOW_TO_SET_CREDENTIALS}"
            )
        if isinstance(exc, api_exceptions.NotFound):
            return (
                f"Not found while {doing}: {message} ({status}). Check the project, the zone "
                "and the node's name; the node may already be gone."
            )
        if isinstance(exc, api_exceptions.Conflict):
            return f"Conflict while {doing}: {message} ({status})."
        if isinstance(exc, api_exceptions.BadRequest):
            return f"The Cloud TPU API refused {doing}: {message} ({status})."
        return f"The Cloud TPU API failed while {doing}: {message} ({status})."
    if isinstance(exc, auth_exceptions.GoogleAuthError):
        return (
            f"The credentials could not get an access token while {doing}: "
            f"{first_line(exc)}. {HOW_TO_SET_CREDENTIALS}"
        )
    if isinstance(exc, requests.exceptions.Timeout):
        return f"The Cloud TPU API at {endpoint} did not answer within {REQUEST_TIMEOUT_S:g} s."
    if isinstance(exc, requests.exceptions.RequestException):
        return f"Cannot reach the Cloud TPU API at {endpoint} while {doing}: {_reason(exc)}"
    return f"Unexpected failure while {doing}: {first_line(exc)}"


_REQUEST_PREFIX = re.compile(r"^(GET|POST|PUT|PATCH|DELETE) \S+: ")
API_FAILURES = (
    api_exceptions.GoogleAPICallError,
    auth_exceptions.GoogleAuthError,
    requests.exceptions.RequestException,
)


def _reason(exc: requests.exceptions.RequestException) -> str:
    text = first_line(exc)
    match = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    return match.group(1) if match else text


# --- the API --------------------------------------------------------------------------------


class TpuVms:
    """The TPU VMs of one project and zone. Every failure is raised as `TpuError`."""

    def __init__(self, client: tpu_v2.TpuClient, project: str, zone: str, endpoint: str):
        project, zone = project.strip(), zone.strip()
        problems = []
        if not PROJECT_PATTERN.match(project):
            problems.append(f"{project!r} is not a Google Cloud project id (e.g. my-project-123)")
        if not ZONE_PATTERN.match(zone):
            problems.append(f"{zone!r} is not a zone (e.g. us-central2-b)")
        if problems:
            raise TpuError("; ".join(problems) + ".")
        self.client = client
        self.project = project
        self.zone = zone
        self.endpoint = endpoint

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    def node_path(self, name: str) -> str:
        return f"{self.parent}/nodes/{name}"

    @contextlib.contextmanager
    def _calling(self, doing: str) -> Iterator[None]:
        try:
            yield
        except API_FAILURES as exc:
            raise TpuError(describe_api_error(exc, doing, self.endpoint, self.project)) from exc

    def list_nodes(self) -> list[NodeInfo]:
        with self._calling(f"listing the TPU VMs of {self.project} in {self.zone}"):
            pages = self.client.list_nodes(parent=self.parent, timeout=REQUEST_TIMEOUT_S)
            return sorted((node_info(node) for node in pages), key=lambda node: node.name)

    def get_node(self, name: str) -> NodeInfo:
        with self._calling(f"reading TPU VM {name}"):
            return node_info(
                self.client.get_node(name=self.node_path(name), timeout=REQUEST_TIMEOUT_S)
            )

    def list_accelerator_types(self) -> list[str]:
        with self._calling(f"listing the accelerator types of {self.zone}"):
            pages = self.client.list_accelerator_types(
                parent=self.parent, timeout=REQUEST_TIMEOUT_S
            )
            return sorted({item.type_ for item in pages if item.type_}, key=accelerator_order)

    def accelerator_shapes(self) -> dict[str, AcceleratorShape | None]:
        """Every accelerator type the zone offers, with its chips and hosts when the API gives
        its topology."""
        with self._calling(f"listing the accelerator types of {self.zone}"):
            pages = self.client.list_accelerator_types(
                parent=self.parent, timeout=REQUEST_TIMEOUT_S
            )
            found = {item.type_: accelerator_shape(item) for item in pages if item.type_}
        return {name: found[name] for name in sorted(found, key=accelerator_order)}

    def check_request(self, request: NodeRequest) -> None:
        """Raise `NodeRequestError` naming every problem of `request`, then
        `AcceleratorTypeRefused` if the zone does not offer its accelerator type or that type
        spans several hosts. Calls the API once (the zone's accelerator types)."""
        problems = request.problems()
        if problems:
            raise NodeRequestError("\n".join(problems))
        refusal = accelerator_type_refusal(
            request.accelerator_type, self.zone, self.accelerator_shapes()
        )
        if refusal:
            raise AcceleratorTypeRefused(refusal)

    def list_runtime_versions(self) -> list[str]:
        with self._calling(f"listing the runtime versions of {self.zone}"):
            pages = self.client.list_runtime_versions(parent=self.parent, timeout=REQUEST_TIMEOUT_S)
            return sorted({item.version for item in pages if item.version})

    def create_node(self, request: NodeRequest) -> OperationStatus:
        """Create the node of `request`, once `check_request` finds nothing against it."""
        self.check_request(request)
        with self._calling(f"creating TPU VM {request.name}"):
            operation = self.client.create_node(
                parent=self.parent,
                node=request.to_node(),
                node_id=request.name,
                timeout=REQUEST_TIMEOUT_S,
            )
            return operation_status(operation.operation)

    def start_node(self, name: str) -> OperationStatus:
        with self._calling(f"starting TPU VM {name}"):
            operation = self.client.start_node(
                request={"name": self.node_path(name)}, timeout=REQUEST_TIMEOUT_S
            )
            return operation_status(operation.operation)

    def stop_node(self, name: str) -> OperationStatus:
        with self._calling(f"stopping TPU VM {name}"):
            operation = self.client.stop_node(
                request={"name": self.node_path(name)}, timeout=REQUEST_TIMEOUT_S
            )
            return operation_status(operation.operation)

    def delete_node(self, name: str) -> OperationStatus:
        with self._calling(f"deleting TPU VM {name}"):
            operation = self.client.delete_node(
                name=self.node_path(name), timeout=REQUEST_TIMEOUT_S
            )
            return operation_status(operation.operation)

    def operation(self, name: str) -> OperationStatus:
        with self._calling("checking an operation's progress"):
            raw = self.client.get_operation(request={"name": name}, timeout=REQUEST_TIMEOUT_S)
            return operation_status(raw)

    def wait(
        self,
        name: str,
        *,
        poll_s: float = 5.0,
        timeout_s: float = 1800.0,
        on_progress: Callable[[OperationStatus], None] | None = None,
    ) -> OperationStatus:
        """Poll the operation `name` until it is done; `on_progress` sees every state."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.operation(name)
            if on_progress is not None:
                on_progress(status)
            if status.done:
                return status
            if time.monotonic() >= deadline:
                raise TpuError(
                    f"{status.verb} {status.target_name} is still running after "
                    f"{timeout_s:g} s; its progress stays visible on the TPU VMs page."
                )
            time.sleep(poll_s)


def accelerator_order(accelerator_type: str) -> tuple[Any, ...]:
    generation, _, cores = accelerator_type.rpartition("-")
    digits = re.match(r"v(\d+)", generation)
    return (
        int(digits.group(1)) if digits else 0,
        generation,
        int(cores) if cores.isdigit() else 0,
    )


# --- preemption -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Recovery:
    """Jobs taken back from the worker of a node that is gone."""

    node: str
    state: str
    worker_id: str
    outcomes: list[tuple[int, str]]
    # What happened, when it is not a TPU VM's state ("Queued resource big was suspended").
    what: str = ""

    def summary(self) -> str:
        parts = [f"job {job_id} → {status}" for job_id, status in self.outcomes]
        what = self.what or (
            f"TPU VM {self.node} {LOST_STATE_WORDS.get(self.state, self.state.lower())}"
        )
        return f"{what}: " + ", ".join(parts)


def lost_node_reason(node_name: str, state: str) -> str:
    """Why the jobs of a lost node's worker were taken back, as the job's log says it."""
    return f"its TPU VM {node_name} {LOST_STATE_WORDS.get(state, f'is {state}')}"


def deleted_node_reason(node_name: str) -> str:
    return f"its TPU VM {node_name} is being deleted"


def busy_workers(engine: Engine) -> set[str]:
    """The workers that run a job now (a read: the page asks every few seconds, and a write
    would take SQLite's lock)."""
    return {job.worker_id for job in queue.list_jobs(engine, ["running"]) if job.worker_id}


def workers_of_node(node_name: str, workers: Iterable[str]) -> list[str]:
    """Those of `workers` that run on the node `node_name` (every host's, on a slice)."""
    return sorted(worker for worker in workers if is_worker_of_node(worker, node_name))


def requeue_jobs_of_node(
    engine: Engine, node_name: str, state: str, reason: str, what: str = ""
) -> list[Recovery]:
    """Requeue the running jobs of the node `node_name`'s worker, or of every host's worker on
    a slice (so that a slice's job goes back as a whole), with `reason` in each job's log."""
    recoveries = []
    for worker_id in workers_of_node(node_name, busy_workers(engine)):
        outcomes = queue.requeue_jobs_of_worker(engine, worker_id, reason)
        if outcomes:
            recoveries.append(Recovery(node_name, state, worker_id, outcomes, what=what))
    return recoveries


def recover_jobs_of_lost_nodes(engine: Engine, nodes: Iterable[NodeInfo]) -> list[Recovery]:
    """Requeue the running jobs of every node whose VM is gone (PREEMPTED, TERMINATED,
    STOPPED): of its worker, or of every host's worker on a slice. Harmless to call again and
    again: a worker's jobs are requeued only once."""
    recoveries = []
    for node in nodes:
        if node.is_lost:
            reason = lost_node_reason(node.name, node.state)
            recoveries += requeue_jobs_of_node(engine, node.name, node.state, reason)
    return recoveries

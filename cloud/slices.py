"""TPU slices requested as Cloud TPU queued resources: create, list, watch and delete them, and
requeue the jobs of a slice that was suspended, failed or is being deleted.

A queued resource is a request for TPU capacity that waits in Google's queue until the zone
has it, then creates its node: https://cloud.google.com/tpu/docs/queued-resources. Its state
(`QUEUED_STATE_WORDS`) goes WAITING_FOR_RESOURCES (which replaced ACCEPTED), PROVISIONING,
ACTIVE; a spot slice whose capacity Google takes back goes SUSPENDING then SUSPENDED, and its
node is deleted. traindeck asks for one node a request, named like the request, on the spot
tier or on demand (no tier).

The client is `google.cloud.tpu_v2`'s, the one `cloud.tpu` uses: the v2 API has queued
resources with the same states as `tpu_v2alpha1`, and google-cloud-tpu ships `tpu_v2alpha1`
with gRPC transports only, where `tpu_v2`'s REST transport is what `cloud.tpu` (and the local
fake of the API in the tests) speaks. v2 has no best-effort tier; spot and on-demand are what
the page offers.

A multi-host type (v4-32, v5litepod-16, …) is created only this way, with a startup script
that starts a worker on every host of the slice (`cloud.bootstrap`). Training across hosts
is experimental: the orchestration was checked against a fake of the Cloud TPU API, never on
a real slice (`EXPERIMENTAL_SLICE`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from google.cloud import tpu_v2
from google.rpc import code_pb2

from cloud.tpu import (
    API_FAILURES,
    REQUEST_TIMEOUT_S,
    AcceleratorShape,
    AcceleratorTypeRefused,
    NodeRequest,
    NodeRequestError,
    OperationStatus,
    Recovery,
    TpuError,
    TpuVms,
    accelerator_order,
    describe_api_error,
    operation_status,
    requeue_jobs_of_node,
)
from db.engine import Engine

QUEUED_STATE_WORDS = {
    "STATE_UNSPECIFIED": "state unknown",
    "CREATING": "being created",
    "ACCEPTED": "accepted, waiting for resources",
    "WAITING_FOR_RESOURCES": "waiting for resources",
    "PROVISIONING": "provisioning its TPU VMs",
    "ACTIVE": "active",
    "SUSPENDING": "suspending (its TPU VMs are being deleted)",
    "SUSPENDED": "suspended (its TPU VMs were deleted)",
    "FAILED": "failed",
    "DELETING": "being deleted",
}
# States in which the slice's node is gone or going: the jobs of its workers move elsewhere.
LOST_QUEUED_STATES = ("SUSPENDING", "SUSPENDED", "FAILED", "DELETING")
# States in which the request still waits for capacity: no node, no worker yet.
WAITING_QUEUED_STATES = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING")
INITIATOR_WORDS = {"SERVICE": "by Google Cloud", "USER": "by a user"}
# The step of the slice's startup script (cloud.bootstrap) that tells each host its number.
SLICE_SCRIPT_MARK = "learn_host_index"


@dataclass(frozen=True)
class QueuedResourceInfo:
    """One queued resource, in the words the page uses."""

    name: str
    resource_name: str
    state: str
    initiator: str
    error: str
    tier: str
    node_names: tuple[str, ...]
    accelerator_type: str
    runtime_version: str
    created_at: datetime | None

    @property
    def state_words(self) -> str:
        words = QUEUED_STATE_WORDS.get(self.state, self.state.lower())
        by = INITIATOR_WORDS.get(self.initiator)
        if by and self.state in ("SUSPENDING", "SUSPENDED"):
            words = f"{words}, {by}"
        if self.state == "FAILED" and self.error:
            words = f"{words}: {self.error}"
        return words

    @property
    def is_lost(self) -> bool:
        return self.state in LOST_QUEUED_STATES

    @property
    def is_waiting(self) -> bool:
        return self.state in WAITING_QUEUED_STATES


def queued_resource_info(queued: tpu_v2.QueuedResource) -> QueuedResourceInfo:
    raw = tpu_v2.QueuedResource.pb(queued)
    tier = {"spot": "spot", "guaranteed": "guaranteed"}.get(raw.WhichOneof("tier") or "", "")
    specs = list(queued.tpu.node_spec)
    first = specs[0].node if specs else tpu_v2.Node()
    state = queued.state
    error = ""
    if state.failed_data.error.message or state.failed_data.error.code:
        status = state.failed_data.error
        code = status.code
        name = code_pb2.Code.Name(code) if code in code_pb2.Code.values() else str(code)
        error = f"{status.message} ({name})" if status.message else name
    created = queued.create_time
    return QueuedResourceInfo(
        name=queued.name.rsplit("/", 1)[-1],
        resource_name=queued.name,
        state=tpu_v2.QueuedResourceState.State(state.state).name,
        initiator=tpu_v2.QueuedResourceState.StateInitiator(state.state_initiator).name,
        error=error,
        tier=tier or "on-demand",
        node_names=tuple(spec.node_id for spec in specs if spec.node_id),
        accelerator_type=first.accelerator_type or "—",
        runtime_version=first.runtime_version,
        created_at=datetime.fromtimestamp(created.timestamp(), UTC) if created else None,
    )


@dataclass(frozen=True)
class SliceRequest:
    """A TPU VM (one host) or a multi-host slice to request as a queued resource: the node to
    create once the zone has the capacity, named like the request. `node.spot` chooses the
    tier: spot, else on demand."""

    node: NodeRequest

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def tier(self) -> str:
        return "spot" if self.node.spot else "on-demand"

    def to_queued_resource(self, parent: str) -> tpu_v2.QueuedResource:
        node = self.node.to_node()
        # The tier is the queued resource's; the node asks for no scheduling of its own.
        tpu_v2.Node.pb(node).ClearField("scheduling_config")
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=self.name, node=node)
        queued = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
        if self.node.spot:
            queued.spot = tpu_v2.QueuedResource.Spot()
        return queued


def queued_type_refusal(
    accelerator_type: str, zone: str, offered: dict[str, AcceleratorShape | None]
) -> str | None:
    """Why a queued resource of `accelerator_type` cannot be requested in `zone`, whose offered
    types are `offered` (None: it can). A multi-host type can."""
    if accelerator_type not in offered:
        choices = ", ".join(sorted(offered, key=accelerator_order)) or "none"
        return (
            f"The accelerator type {accelerator_type} is not offered in {zone}; types offered "
            f"there: {choices}."
        )
    if offered[accelerator_type] is None:
        return (
            f"The Cloud TPU API gives no topology for {accelerator_type} in {zone}, so its "
            "number of hosts is unknown, and with it how many workers its startup script must "
            "start."
        )
    return None


def slice_request_refusal(
    request: SliceRequest, zone: str, offered: dict[str, AcceleratorShape | None]
) -> str | None:
    """Why `request` cannot be made in `zone` (None: it can): its type, or a multi-host slice
    whose startup script would not start a worker on every host."""
    accelerator_type = request.node.accelerator_type
    refusal = queued_type_refusal(accelerator_type, zone, offered)
    if refusal:
        return refusal
    shape = offered[accelerator_type]
    script = request.node.startup_script
    if shape is not None and not shape.single_host and SLICE_SCRIPT_MARK not in script:
        return (
            f"{accelerator_type} is a slice of {shape.hosts} hosts, and its startup script "
            "must start a worker on every host: this one is not the script written for a "
            f"slice (it has no {SLICE_SCRIPT_MARK} step)."
        )
    return None


class QueuedResources:
    """The queued resources of the project and zone of `vms`. Every failure is a `TpuError`."""

    def __init__(self, vms: TpuVms):
        self.vms = vms

    @property
    def parent(self) -> str:
        return self.vms.parent

    def path(self, name: str) -> str:
        return f"{self.parent}/queuedResources/{name}"

    @contextlib.contextmanager
    def _calling(self, doing: str) -> Iterator[None]:
        try:
            yield
        except API_FAILURES as exc:
            raise TpuError(
                describe_api_error(exc, doing, self.vms.endpoint, self.vms.project)
            ) from exc

    def list(self) -> list[QueuedResourceInfo]:
        where = f"{self.vms.project} in {self.vms.zone}"
        with self._calling(f"listing the queued resources of {where}"):
            pages = self.vms.client.list_queued_resources(
                parent=self.parent, timeout=REQUEST_TIMEOUT_S
            )
            return sorted((queued_resource_info(q) for q in pages), key=lambda q: q.name)

    def get(self, name: str) -> QueuedResourceInfo:
        with self._calling(f"reading queued resource {name}"):
            return queued_resource_info(
                self.vms.client.get_queued_resource(name=self.path(name), timeout=REQUEST_TIMEOUT_S)
            )

    def check(self, request: SliceRequest) -> AcceleratorShape:
        """Raise `NodeRequestError` naming every problem of `request`, then
        `AcceleratorTypeRefused` if the zone cannot take it; else its shape. Calls the API once
        (the zone's accelerator types)."""
        problems = request.node.problems()
        if problems:
            raise NodeRequestError("\n".join(problems))
        offered = self.vms.accelerator_shapes()
        refusal = slice_request_refusal(request, self.vms.zone, offered)
        if refusal:
            raise AcceleratorTypeRefused(refusal)
        shape = offered[request.node.accelerator_type]
        assert shape is not None  # slice_request_refusal refuses an unknown topology
        return shape

    def create(self, request: SliceRequest) -> OperationStatus:
        """Request `request` once `check` finds nothing against it; the operation ends when
        the request is queued, not when its node exists (`get` says where it stands)."""
        self.check(request)
        with self._calling(f"requesting queued resource {request.name}"):
            operation = self.vms.client.create_queued_resource(
                parent=self.parent,
                queued_resource=request.to_queued_resource(self.parent),
                queued_resource_id=request.name,
                timeout=REQUEST_TIMEOUT_S,
            )
            return operation_status(operation.operation)

    def delete(self, name: str) -> OperationStatus:
        """Delete the queued resource `name` and its node (`force`: a node that still runs is
        deleted first, as the API does)."""
        with self._calling(f"deleting queued resource {name} and its TPU VMs"):
            operation = self.vms.client.delete_queued_resource(
                request=tpu_v2.DeleteQueuedResourceRequest(name=self.path(name), force=True),
                timeout=REQUEST_TIMEOUT_S,
            )
            return operation_status(operation.operation)


# --- a slice that is gone -------------------------------------------------------------------


def lost_slice_words(queued: QueuedResourceInfo) -> str:
    """What happened to `queued`, after its name ("was suspended by Google Cloud")."""
    by = INITIATOR_WORDS.get(queued.initiator)
    by = f" {by}" if by else ""
    if queued.state == "SUSPENDING":
        return f"is being suspended{by} (its TPU VMs are being deleted)"
    if queued.state == "SUSPENDED":
        return f"was suspended{by} (its TPU VMs were deleted)"
    if queued.state == "FAILED":
        return f"failed: {queued.error}" if queued.error else "failed"
    if queued.state == "DELETING":
        return "is being deleted"
    return f"is {queued.state}"


def lost_slice_reason(queued: QueuedResourceInfo) -> str:
    """Why the jobs of a lost slice's workers were taken back, as the job's log says it."""
    return f"its queued resource {queued.name} {lost_slice_words(queued)}"


def recover_jobs_of_lost_slices(
    engine: Engine, queued_resources: Iterable[QueuedResourceInfo]
) -> list[Recovery]:
    """Requeue the running jobs of every worker on the node of a queued resource that is
    SUSPENDING, SUSPENDED, FAILED or DELETING: on a slice, the workers of all its hosts, so
    the job goes back as a whole. Harmless to call again and again."""
    recoveries = []
    for queued in queued_resources:
        if not queued.is_lost:
            continue
        what = f"Queued resource {queued.name} {lost_slice_words(queued)}"
        for node_name in queued.node_names:
            recoveries += requeue_jobs_of_node(
                engine, node_name, queued.state, lost_slice_reason(queued), what
            )
    return recoveries


def requeue_jobs_of_deleted_slice(engine: Engine, queued: QueuedResourceInfo) -> list[Recovery]:
    """Requeue the running jobs of every worker on the node of `queued`, which is being
    deleted from the page: on a slice, every host's."""
    what = f"Queued resource {queued.name} is being deleted"
    reason = f"its queued resource {queued.name} is being deleted"
    recoveries = []
    for node_name in queued.node_names:
        recoveries += requeue_jobs_of_node(engine, node_name, "DELETING", reason, what)
    return recoveries

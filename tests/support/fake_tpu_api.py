"""A local fake of the Cloud TPU v2 REST API, for tests: an `http.server` on 127.0.0.1.

It answers what `google.cloud.tpu_v2.TpuClient` (REST transport) sends for nodes, long-running
operations, accelerator types and runtime versions, with the JSON shapes of the API reference
(https://cloud.google.com/tpu/docs/reference/rest/v2): a node is `projects/P/locations/Z/nodes/N`,
a create, delete, start or stop answers an `Operation` whose `metadata` is an
`OperationMetadata`, and a later GET of the operation finishes it, changing the node's state.
Errors have Google's shape: `{"error": {"code", "message", "status", "details"}}`.

Accelerator types come with their `acceleratorConfigs` (the chip generation and the topology,
as the real API lists them: v4-8 is `{"type": "V4", "topology": "2x2x1"}`); `ACCELERATOR_TYPES`
holds single-host and multi-host types of every generation, and a test may give its own.

Queued resources (`projects/P/locations/Z/queuedResources/Q`, the v2 REST shapes of
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources): create
answers an operation, after which the request waits (WAITING_FOR_RESOURCES) until a test
`provision`s it (PROVISIONING, then ACTIVE with its node READY and naming its queued resource);
`suspend` deletes its node and leaves it SUSPENDED, `fail_queued` leaves it FAILED with an error;
delete without `force` is refused while its node exists (as the API says: only a request whose
nodes are gone, or that is ACCEPTED, WAITING_FOR_RESOURCES, FAILED or SUSPENDED), and with
`force` deletes the node and then the queued resource.

Tests steer it: `add_node` (nodes that exist already), `set_state` (e.g. PREEMPTED),
`fail_next` (the next request of one kind answers an HTTP error), `fail_next_operation` (the
next operation finishes with an error, like a zone out of capacity), `polls_until_done`,
`set_queued_state`, `provision`, `suspend`, `fail_queued`.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
QUEUED_RESOURCE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
METADATA_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"

_LOCATION = r"projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
_NODE = _LOCATION + r"/nodes/(?P<node>[^/:]+)"
_QUEUED = _LOCATION + r"/queuedResources/(?P<queued_resource>[^/:]+)"
ROUTES = (
    ("GET", re.compile(rf"^/v2/{_LOCATION}/queuedResources$"), "queued_list"),
    ("POST", re.compile(rf"^/v2/{_LOCATION}/queuedResources$"), "queued_create"),
    ("GET", re.compile(rf"^/v2/{_QUEUED}$"), "queued_get"),
    ("DELETE", re.compile(rf"^/v2/{_QUEUED}$"), "queued_delete"),
    ("GET", re.compile(rf"^/v2/{_LOCATION}/nodes$"), "list"),
    ("POST", re.compile(rf"^/v2/{_LOCATION}/nodes$"), "create"),
    ("GET", re.compile(rf"^/v2/{_NODE}$"), "get"),
    ("DELETE", re.compile(rf"^/v2/{_NODE}$"), "delete"),
    ("POST", re.compile(rf"^/v2/{_NODE}:start$"), "start"),
    ("POST", re.compile(rf"^/v2/{_NODE}:stop$"), "stop"),
    ("GET", re.compile(rf"^/v2/{_LOCATION}/operations/(?P<operation>[^/:]+)$"), "operation"),
    ("GET", re.compile(rf"^/v2/{_LOCATION}/acceleratorTypes$"), "accelerator_types"),
    (
        "GET",
        re.compile(rf"^/v2/{_LOCATION}/acceleratorTypes/(?P<accelerator_type>[^/:]+)$"),
        "accelerator_type",
    ),
    ("GET", re.compile(rf"^/v2/{_LOCATION}/runtimeVersions$"), "runtime_versions"),
)
# What an operation turns its node into while it runs, and once it is done.
TRANSITIONS = {
    "create": ("CREATING", "READY"),
    "delete": ("DELETING", None),
    "start": ("STARTING", "READY"),
    "stop": ("STOPPING", "STOPPED"),
}
STATES_ALLOWED = {"start": {"STOPPED"}, "stop": {"READY"}}
# What a queued resource's create and delete operations turn it into, and once they are done.
QUEUED_TRANSITIONS = {
    "create": ("CREATING", "WAITING_FOR_RESOURCES"),
    "delete": ("DELETING", None),
}
# The states in which a queued resource may be deleted without `force` (DeleteQueuedResource).
QUEUED_DELETABLE = {"ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED", "SUSPENDED"}
QUEUED_STATE_DATA = {
    "CREATING": "creatingData",
    "ACCEPTED": "acceptedData",
    "WAITING_FOR_RESOURCES": None,
    "PROVISIONING": "provisioningData",
    "FAILED": "failedData",
    "DELETING": "deletingData",
    "ACTIVE": "activeData",
    "SUSPENDING": "suspendingData",
    "SUSPENDED": "suspendedData",
}
NODE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# Accelerator type → (AcceleratorConfig.Type, topology), from the Cloud TPU docs' tables of
# supported configurations. Single host: v2-8, v3-8, v4-8, v5litepod-1/-4/-8, v5p-8, v6e-8.
ACCELERATOR_TYPES: dict[str, tuple[str, str]] = {
    "v2-8": ("V2", "2x2"),
    "v2-32": ("V2", "4x4"),
    "v3-8": ("V3", "2x2"),
    "v3-32": ("V3", "4x4"),
    "v4-8": ("V4", "2x2x1"),
    "v4-16": ("V4", "2x2x2"),
    "v4-32": ("V4", "2x2x4"),
    "v5litepod-1": ("V5LITE_POD", "1x1"),
    "v5litepod-4": ("V5LITE_POD", "2x2"),
    "v5litepod-8": ("V5LITE_POD", "2x4"),
    "v5litepod-16": ("V5LITE_POD", "4x4"),
    "v5litepod-32": ("V5LITE_POD", "4x8"),
    "v5p-8": ("V5P", "2x2x1"),
    "v5p-16": ("V5P", "2x2x2"),
    "v6e-8": ("V6E", "2x4"),
    "v6e-16": ("V6E", "4x4"),
}
HTTP_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def _timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    def __init__(self, http_status: int, message: str, status: str | None = None):
        super().__init__(message)
        self.http_status = http_status
        self.message = message
        self.status = status or HTTP_STATUS_NAMES.get(http_status, "UNKNOWN")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.http_status,
                "message": self.message,
                "status": self.status,
                "details": [
                    {
                        "@type": ERROR_INFO_TYPE,
                        "reason": self.status,
                        "domain": "tpu.googleapis.com",
                        "metadata": {"service": "tpu.googleapis.com"},
                    }
                ],
            }
        }


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    body: dict[str, Any] | None
    headers: dict[str, str]


@dataclass
class _Operation:
    name: str
    verb: str
    node_name: str
    polls_left: int
    created: str
    kind: str = "node"  # or "queued_resource": what `node_name` names
    failure: dict[str, Any] | None = None
    done: bool = False
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    end_time: str | None = None

    def to_json(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "@type": METADATA_TYPE,
            "createTime": self.created,
            "target": self.node_name,
            "verb": self.verb,
            "cancelRequested": False,
            "apiVersion": "v2",
        }
        if self.end_time:
            metadata["endTime"] = self.end_time
        body: dict[str, Any] = {"name": self.name, "metadata": metadata, "done": self.done}
        if self.error is not None:
            body["error"] = self.error
        elif self.response is not None:
            body["response"] = self.response
        return body


@dataclass
class FakeTpuApi:
    """The fake's state and its HTTP server. Use as a context manager, or `start`/`stop`."""

    polls_until_done: int = 1
    page_size: int = 50
    accelerator_types: dict[str, tuple[str, str]] = field(
        default_factory=lambda: dict(ACCELERATOR_TYPES)
    )
    runtime_versions: list[str] = field(
        default_factory=lambda: ["tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite", "tpu-vm-base"]
    )
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    queued_resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._operations: dict[str, _Operation] = {}
        self._errors: dict[str, list[ApiError]] = {}
        self._operation_failures: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- the server ---------------------------------------------------------------------------

    def start(self) -> FakeTpuApi:
        handler = type("Handler", (_Handler,), {"api": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeTpuApi:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        assert self._server is not None, "the fake is not started"
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    # --- what tests use -----------------------------------------------------------------------

    def add_node(self, project: str, zone: str, name: str, **fields: Any) -> dict[str, Any]:
        """A node that exists already (READY unless `state` says otherwise)."""
        body = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base", **fields}
        state = body.pop("state", "READY")
        with self._lock:
            node = self._new_node(f"projects/{project}/locations/{zone}/nodes/{name}", body)
            node["state"] = state
            self.nodes[node["name"]] = node
            return node

    def node(self, name: str) -> dict[str, Any]:
        """The node whose full or short name is `name`."""
        with self._lock:
            for full_name, node in self.nodes.items():
                if full_name == name or full_name.rsplit("/", 1)[-1] == name:
                    return node
        raise KeyError(name)

    def set_state(self, name: str, state: str) -> None:
        with self._lock:
            self.node(name)["state"] = state

    def add_queued_resource(
        self,
        project: str,
        zone: str,
        name: str,
        accelerator_type: str = "v4-8",
        state: str = "WAITING_FOR_RESOURCES",
        spot: bool = True,
        startup_script: str = "#!/bin/bash\n",
    ) -> dict[str, Any]:
        """A queued resource that exists already, for one node named like it (no node: call
        `provision` for that)."""
        location = f"projects/{project}/locations/{zone}"
        node = {
            "acceleratorType": accelerator_type,
            "runtimeVersion": "tpu-ubuntu2204-base",
            "metadata": {"startup-script": startup_script},
            "labels": {"managed-by": "traindeck"},
        }
        queued: dict[str, Any] = {
            "name": f"{location}/queuedResources/{name}",
            "createTime": _timestamp(),
            "tpu": {"nodeSpec": [{"parent": location, "nodeId": name, "node": node}]},
            "state": _queued_state(state),
        }
        if spot:
            queued["spot"] = {}
        with self._lock:
            self.queued_resources[queued["name"]] = queued
        return queued

    def queued_resource(self, name: str) -> dict[str, Any]:
        """The queued resource whose full or short name is `name`."""
        with self._lock:
            for full_name, queued in self.queued_resources.items():
                if full_name == name or full_name.rsplit("/", 1)[-1] == name:
                    return queued
        raise KeyError(name)

    def set_queued_state(
        self,
        name: str,
        state: str,
        initiator: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        """Put the queued resource `name` in `state` (its node, if any, stays as it is)."""
        with self._lock:
            queued = self.queued_resource(name)
            queued["state"] = _queued_state(state, initiator, error)

    def provision(self, name: str) -> dict[str, Any]:
        """The queued resource `name` gets its capacity: its node is created READY, naming its
        queued resource, and the queued resource is ACTIVE. Returns the node."""
        with self._lock:
            queued = self.queued_resource(name)
            (spec,) = queued["tpu"]["nodeSpec"]
            body = dict(spec["node"])
            if "spot" in queued:
                body["schedulingConfig"] = {**body.get("schedulingConfig", {}), "spot": True}
            node = self._new_node(f"{spec['parent']}/nodes/{spec['nodeId']}", body)
            node["state"] = "READY"
            node["queuedResource"] = queued["name"]
            self.nodes[node["name"]] = node
            queued["state"] = _queued_state("ACTIVE")
            return node

    def suspend(self, name: str, initiator: str = "SERVICE") -> None:
        """The queued resource `name` loses its capacity (a spot slice taken back): its node is
        deleted and it is SUSPENDED, by the service unless `initiator` says USER."""
        with self._lock:
            queued = self.queued_resource(name)
            self._drop_nodes_of(queued["name"])
            queued["state"] = _queued_state("SUSPENDED", initiator)

    def fail_queued(self, name: str, code: int, message: str) -> None:
        """The queued resource `name` fails with the `google.rpc.Status` (code, message)."""
        with self._lock:
            queued = self.queued_resource(name)
            self._drop_nodes_of(queued["name"])
            queued["state"] = _queued_state("FAILED", error={"code": code, "message": message})

    def fail_next(
        self, kind: str, http_status: int, message: str, status: str | None = None
    ) -> None:
        """The next request of `kind` (list, get, create, delete, start, stop, operation,
        accelerator_types, accelerator_type, runtime_versions, queued_list, queued_create,
        queued_get, queued_delete) answers this error."""
        with self._lock:
            self._errors.setdefault(kind, []).append(ApiError(http_status, message, status))

    def fail_next_operation(self, code: int, message: str) -> None:
        """The next operation started finishes with this `google.rpc.Status`."""
        with self._lock:
            self._operation_failures.append({"code": code, "message": message})

    def requests_of(self, method: str, path_suffix: str = "") -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.endswith(path_suffix)]

    # --- the API ------------------------------------------------------------------------------

    def handle(self, kind: str, params: dict[str, str], request: RecordedRequest) -> Any:
        with self._lock:
            self.requests.append(request)
            queued = self._errors.get(kind)
            if queued:
                raise queued.pop(0)
            location = f"projects/{params['project']}/locations/{params['zone']}"
            if kind.startswith("queued_"):
                return self._queued(kind, location, params, request)
            if kind == "list":
                return self._list(location, request.query)
            if kind == "create":
                return self._create(location, request.query, request.body or {})
            if kind == "operation":
                return self._poll(f"{location}/operations/{params['operation']}")
            if kind == "accelerator_types":
                return {
                    "acceleratorTypes": [
                        self._accelerator_type(location, name) for name in self.accelerator_types
                    ]
                }
            if kind == "accelerator_type":
                name = params["accelerator_type"]
                if name not in self.accelerator_types:
                    raise ApiError(
                        404, f"Resource '{location}/acceleratorTypes/{name}' was not found"
                    )
                return self._accelerator_type(location, name)
            if kind == "runtime_versions":
                return {
                    "runtimeVersions": [
                        {"name": f"{location}/runtimeVersions/{v}", "version": v}
                        for v in self.runtime_versions
                    ]
                }
            node_name = f"{location}/nodes/{params['node']}"
            node = self.nodes.get(node_name)
            if node is None:
                raise ApiError(404, f"Resource '{node_name}' was not found")
            if kind == "get":
                return node
            allowed = STATES_ALLOWED.get(kind)
            if allowed is not None and node["state"] not in allowed:
                raise ApiError(
                    400,
                    f"Cannot {kind} node {params['node']} in state {node['state']}",
                    "FAILED_PRECONDITION",
                )
            return self._start_operation(location, kind, node)

    def _queued(
        self, kind: str, location: str, params: dict[str, str], request: RecordedRequest
    ) -> dict[str, Any]:
        if kind == "queued_list":
            found = [q for n, q in sorted(self.queued_resources.items()) if n.startswith(location)]
            start = int(request.query.get("pageToken", ["0"])[0] or 0)
            size = int(request.query.get("pageSize", [str(self.page_size)])[0] or self.page_size)
            body: dict[str, Any] = {"queuedResources": found[start : start + size]}
            if start + size < len(found):
                body["nextPageToken"] = str(start + size)
            return body
        if kind == "queued_create":
            return self._create_queued(location, request.query, request.body or {})
        name = f"{location}/queuedResources/{params['queued_resource']}"
        queued = self.queued_resources.get(name)
        if queued is None:
            raise ApiError(404, f"Resource '{name}' was not found")
        if kind == "queued_get":
            return queued
        force = request.query.get("force", ["false"])[0].lower() == "true"
        state = queued["state"]["state"]
        if not force and state not in QUEUED_DELETABLE and self._nodes_of(name):
            raise ApiError(
                400,
                f"Cannot delete queued resource {params['queued_resource']} in state {state} "
                "while its nodes exist; set force to delete them too",
                "FAILED_PRECONDITION",
            )
        for node in self._nodes_of(name):
            node["state"] = "DELETING"
        return self._start_operation(location, "delete", queued, kind="queued_resource")

    def _create_queued(
        self, location: str, query: dict[str, list[str]], body: dict[str, Any]
    ) -> dict[str, Any]:
        queued_id = query.get("queuedResourceId", [""])[0]
        if not NODE_NAME.match(queued_id):
            raise ApiError(400, f"Invalid value for field 'queuedResourceId': {queued_id!r}")
        if "spot" in body and "guaranteed" in body:
            raise ApiError(400, "Only one tier may be set: spot or guaranteed")
        specs = body.get("tpu", {}).get("nodeSpec", [])
        if len(specs) != 1:
            raise ApiError(400, f"The fake takes one node spec, not {len(specs)}")
        (spec,) = specs
        if spec.get("parent") != location:
            raise ApiError(400, f"Invalid node spec parent {spec.get('parent')!r}")
        if not NODE_NAME.match(spec.get("nodeId", "")):
            raise ApiError(400, f"Invalid value for field 'nodeId': {spec.get('nodeId')!r}")
        node = spec.get("node", {})
        accelerator_type = node.get("acceleratorType")
        if not accelerator_type or accelerator_type not in self.accelerator_types:
            raise ApiError(400, f"Accelerator type '{accelerator_type}' is not available in zone")
        if not node.get("runtimeVersion"):
            raise ApiError(400, "Missing runtime version")
        name = f"{location}/queuedResources/{queued_id}"
        if name in self.queued_resources:
            raise ApiError(409, f"Resource '{name}' already exists")
        if f"{location}/nodes/{spec['nodeId']}" in self.nodes:
            raise ApiError(409, f"Resource '{location}/nodes/{spec['nodeId']}' already exists")
        queued = {
            key: value
            for key, value in body.items()
            if key in ("tpu", "spot", "guaranteed", "queueingPolicy", "reservationName")
        }
        queued.update({"name": name, "createTime": _timestamp()})
        self.queued_resources[name] = queued
        return self._start_operation(location, "create", queued, kind="queued_resource")

    def _nodes_of(self, queued_name: str) -> list[dict[str, Any]]:
        return [n for n in self.nodes.values() if n.get("queuedResource") == queued_name]

    def _drop_nodes_of(self, queued_name: str) -> None:
        for node in self._nodes_of(queued_name):
            self.nodes.pop(node["name"], None)

    def _accelerator_type(self, location: str, name: str) -> dict[str, Any]:
        generation, topology = self.accelerator_types[name]
        return {
            "name": f"{location}/acceleratorTypes/{name}",
            "type": name,
            "acceleratorConfigs": [{"type": generation, "topology": topology}],
        }

    def _list(self, location: str, query: dict[str, list[str]]) -> dict[str, Any]:
        nodes = [node for name, node in sorted(self.nodes.items()) if name.startswith(location)]
        start = int(query.get("pageToken", ["0"])[0] or 0)
        size = int(query.get("pageSize", [str(self.page_size)])[0] or self.page_size)
        page = nodes[start : start + size]
        body: dict[str, Any] = {"nodes": page}
        if start + size < len(nodes):
            body["nextPageToken"] = str(start + size)
        return body

    def _create(
        self, location: str, query: dict[str, list[str]], body: dict[str, Any]
    ) -> dict[str, Any]:
        node_id = query.get("nodeId", [""])[0]
        if not NODE_NAME.match(node_id):
            raise ApiError(400, f"Invalid value for field 'nodeId': {node_id!r}")
        if not body.get("acceleratorType") and not body.get("acceleratorConfig"):
            raise ApiError(400, "Missing accelerator type")
        if not body.get("runtimeVersion"):
            raise ApiError(400, "Missing runtime version")
        accelerator_type = body.get("acceleratorType")
        if accelerator_type and accelerator_type not in self.accelerator_types:
            raise ApiError(400, f"Accelerator type '{accelerator_type}' is not available in zone")
        name = f"{location}/nodes/{node_id}"
        if name in self.nodes:
            raise ApiError(409, f"Resource '{name}' already exists")
        node = self._new_node(name, body)
        self.nodes[name] = node
        return self._start_operation(location, "create", node)

    def _new_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        number = next(self._ids)
        node = {
            key: value
            for key, value in body.items()
            if key not in ("name", "state", "health", "createTime", "networkEndpoints", "id")
        }
        network = node.setdefault("networkConfig", {"network": "default"})
        endpoint: dict[str, Any] = {"ipAddress": f"10.130.0.{number + 1}", "port": 8470}
        if network.get("enableExternalIps"):
            endpoint["accessConfig"] = {"externalIp": f"34.100.0.{number + 1}"}
        node.update(
            {
                "name": name,
                "state": "CREATING",
                "health": "HEALTHY",
                "createTime": _timestamp(),
                "networkEndpoints": [endpoint],
                "cidrBlock": "10.130.0.0/20",
                "id": str(7_000_000_000_000 + number),
                "apiVersion": "V2",
            }
        )
        return node

    def _start_operation(
        self, location: str, verb: str, target: dict[str, Any], kind: str = "node"
    ) -> dict[str, Any]:
        name = f"{location}/operations/operation-{next(self._ids)}-fake"
        if kind == "node":
            target["state"] = TRANSITIONS[verb][0]
        else:
            target["state"] = _queued_state(QUEUED_TRANSITIONS[verb][0])
        failure = self._operation_failures.pop(0) if self._operation_failures else None
        operation = _Operation(
            name=name,
            verb=verb,
            node_name=target["name"],
            polls_left=self.polls_until_done,
            created=_timestamp(),
            kind=kind,
            failure=failure,
        )
        self._operations[name] = operation
        return operation.to_json()

    def _poll(self, name: str) -> dict[str, Any]:
        operation = self._operations.get(name)
        if operation is None:
            raise ApiError(404, f"Operation '{name}' was not found")
        if not operation.done:
            operation.polls_left -= 1
            if operation.polls_left <= 0:
                self._finish(operation)
        return operation.to_json()

    def _finish(self, operation: _Operation) -> None:
        operation.done = True
        operation.end_time = _timestamp()
        if operation.kind == "queued_resource":
            self._finish_queued(operation)
            return
        node = self.nodes.get(operation.node_name)
        if operation.failure is not None:
            operation.error = operation.failure
            if operation.verb == "create":
                self.nodes.pop(operation.node_name, None)
            elif node is not None:
                node["state"] = "READY" if operation.verb != "start" else "STOPPED"
            return
        _, final_state = TRANSITIONS[operation.verb]
        if final_state is None:
            self.nodes.pop(operation.node_name, None)
            operation.response = {"@type": EMPTY_TYPE}
        elif node is not None:
            node["state"] = final_state
            operation.response = {"@type": NODE_TYPE, **node}

    def _finish_queued(self, operation: _Operation) -> None:
        queued = self.queued_resources.get(operation.node_name)
        if operation.failure is not None:
            operation.error = operation.failure
            if operation.verb == "create":
                self.queued_resources.pop(operation.node_name, None)
            elif queued is not None:
                nodes = self._nodes_of(queued["name"])
                for node in nodes:
                    node["state"] = "READY"
                queued["state"] = _queued_state("ACTIVE" if nodes else "FAILED")
            return
        _, final_state = QUEUED_TRANSITIONS[operation.verb]
        if final_state is None:
            self._drop_nodes_of(operation.node_name)
            self.queued_resources.pop(operation.node_name, None)
            operation.response = {"@type": EMPTY_TYPE}
        elif queued is not None:
            queued["state"] = _queued_state(final_state)
            operation.response = {"@type": QUEUED_RESOURCE_TYPE, **queued}


def _queued_state(
    state: str, initiator: str | None = None, error: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A `QueuedResourceState` as JSON: the state, its data, and who brought it about."""
    body: dict[str, Any] = {"state": state}
    data = QUEUED_STATE_DATA.get(state)
    if data is not None:
        body[data] = {"error": error} if error is not None else {}
    if initiator is not None:
        body["stateInitiator"] = initiator
    return body


class _Handler(BaseHTTPRequestHandler):
    api: FakeTpuApi
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read `api.requests` instead."""

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            self._reply(HTTPStatus.BAD_REQUEST, ApiError(400, "Invalid JSON payload").body())
            return
        request = RecordedRequest(
            method=method,
            path=parts.path,
            query=parse_qs(parts.query),
            body=body,
            headers=dict(self.headers.items()),
        )
        for route_method, pattern, kind in ROUTES:
            match = pattern.match(parts.path)
            if match and route_method == method:
                try:
                    reply = self.api.handle(kind, match.groupdict(), request)
                except ApiError as exc:
                    self._reply(exc.http_status, exc.body())
                else:
                    self._reply(HTTPStatus.OK, reply)
                return
        message = f"The requested URL {parts.path} was not found on this server."
        self._reply(HTTPStatus.NOT_FOUND, ApiError(404, message).body())

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

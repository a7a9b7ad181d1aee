"""The TPU VMs page: the Cloud TPU VMs of a project and zone, with the traindeck worker on each;
create one (its startup script makes it a worker), start, stop, delete or recreate one; and the
zone's queued resources, with where each stands (waiting for resources, active, suspended…).

A TPU VM is created directly or requested as a queued resource. A multi-host slice (the zone's
API says how many hosts a type has) only as a queued resource, with a startup script that
starts a worker on every host, and marked "experimental: not verified on a real slice".
Deleting a queued resource's TPU VM deletes the queued resource. Destructive actions ask for a
confirmation. Each long-running operation started here is followed until it ends. On every
refresh of the lists (every few seconds while the page is open) the running jobs of a node that
was preempted, terminated or stopped, or of a queued resource that was suspended or failed, go
back to the queue at once (a slice's job as a whole); `python -m cloud.watch` does the same
when nobody has the page open.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import streamlit as st

from cloud.bootstrap import (
    DEFAULT_DATA_DIR,
    DEFAULT_SOURCE_REF,
    BootstrapSettings,
    build_startup_script,
)
from cloud.slices import (
    QueuedResourceInfo,
    QueuedResources,
    SliceRequest,
    queued_type_refusal,
    recover_jobs_of_lost_slices,
    requeue_jobs_of_deleted_slice,
)
from cloud.tpu import (
    CLOUD_PLATFORM_SCOPE,
    COMMON_ACCELERATOR_TYPES,
    EXPERIMENTAL_SLICE,
    AcceleratorShape,
    CredentialsMissing,
    FoundCredentials,
    NodeInfo,
    NodeRequest,
    NodeRequestError,
    OperationStatus,
    Recovery,
    TpuError,
    TpuVms,
    accelerator_type_refusal,
    api_endpoint,
    default_project,
    default_zone,
    deleted_node_reason,
    load_credentials,
    make_client,
    recover_jobs_of_lost_nodes,
    request_from_node,
    requeue_jobs_of_node,
    suggested_runtime_version,
)
from common import config, store
from common.errors import mask_passwords
from common.settings import settings
from dashboard.format import plain
from dashboard.state import get_engine
from db.engine import DatabaseError, Engine, printable_url
from db.workers import list_workers

NODES_REFRESH_S = 15
# What the VM's service account needs on the bucket: objects are listed, created, read and
# deleted (roles/storage.objectAdmin), with an access scope that allows writing data.
STORAGE_ROLE = "roles/storage.objectAdmin"
STORAGE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
OPERATIONS_REFRESH_S = 3
WORKER_DATABASE_URL_ENV = "TRAINDECK_WORKER_DATABASE_URL"
# How long each operation usually takes, to draw its progress bar against.
USUAL_SECONDS = {"create": 180, "delete": 90, "start": 90, "stop": 90}
MAX_FAILED_CHECKS = 5

OPERATIONS_KEY = "tpu_operations"
RECOVERIES_KEY = "tpu_recoveries"
CONFIRM_KEY = "tpu_confirm"
CONFIRM_WORDS = {
    "stop": "Stop",
    "delete": "Delete",
    "recreate": "Delete and create again",
}
QUEUED_CONFIRM_KEY = "tpu_confirm_queued"


# --- credentials and client -----------------------------------------------------------------


def _credentials_environment() -> tuple[str, ...]:
    """The settings credentials come from: a change of any of them means a new look-up."""
    google = ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG")  # read by google-auth
    return (settings().tpu_credentials or "", *(os.environ.get(name, "") for name in google))


@st.cache_resource(ttl=600, show_spinner="Looking for Google Cloud credentials…")
def _credentials(endpoint: str, environment: tuple[str, ...]) -> FoundCredentials | TpuError:
    # Cached with the outcome: the look-up may wait seconds for a metadata server.
    try:
        return load_credentials(endpoint)
    except CredentialsMissing as exc:
        return exc


@st.cache_resource(show_spinner=False, max_entries=4)
def _client(endpoint: str, source: str, credentials_id: int, _found: FoundCredentials) -> Any:
    return make_client(endpoint, _found.credentials)


@st.cache_data(ttl=3600, show_spinner=False)
def _zone_offer(_vms: TpuVms, endpoint: str, project: str, zone: str) -> tuple[dict, list]:
    """Accelerator types (with their hosts) and runtime versions offered in the zone (a failure
    is not cached)."""
    return _vms.accelerator_shapes(), _vms.list_runtime_versions()


def _zone_choices(
    vms: TpuVms,
) -> tuple[dict[str, AcceleratorShape | None], list[str], str | None]:
    try:
        shapes, versions = _zone_offer(vms, vms.endpoint, vms.project, vms.zone)
    except TpuError as exc:
        return {}, [], str(exc)
    return shapes, versions, None


def _type_label(shapes: dict[str, AcceleratorShape | None]) -> Callable[[str], str]:
    def label(accelerator_type: str) -> str:
        shape = shapes.get(accelerator_type)
        if shape is not None and not shape.single_host:
            hosts = f"{shape.hosts} hosts, a queued resource"
            return f"{accelerator_type} ({hosts}: {EXPERIMENTAL_SLICE})"
        return accelerator_type

    return label


# --- small helpers --------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    value = int(value)
    return f"{value // 60} min {value % 60:02d} s" if value >= 60 else f"{value} s"


def _remember_operation(status: OperationStatus, then: NodeRequest | None = None) -> None:
    st.session_state.setdefault(OPERATIONS_KEY, []).append(
        {
            "name": status.name,
            "verb": status.verb,
            "target": status.target_name,
            "started_at": status.started_at or datetime.now(UTC),
            "ended_at": status.ended_at,
            "done": status.done,
            "detail": status.detail,
            "error": status.error,
            "then": asdict(then) if then is not None else None,
        }
    )


def _remember_recoveries(recoveries: list[Recovery]) -> None:
    if recoveries:
        st.session_state.setdefault(RECOVERIES_KEY, []).extend(r.summary() for r in recoveries)


def _requeue_jobs_of_deleted_node(engine: Engine, node: NodeInfo) -> None:
    """Requeue the running jobs of the node's worker (every host's, on a slice)."""
    reason = deleted_node_reason(node.name)
    try:
        _remember_recoveries(requeue_jobs_of_node(engine, node.name, "DELETING", reason))
    except DatabaseError as exc:
        st.error(plain(f"The jobs of the workers of {node.name} could not be requeued: {exc}"))


def _requeue_jobs_of_deleted_slice(engine: Engine, queued: QueuedResourceInfo) -> None:
    try:
        _remember_recoveries(requeue_jobs_of_deleted_slice(engine, queued))
    except DatabaseError as exc:
        st.error(plain(f"The jobs of the workers of {queued.name} could not be requeued: {exc}"))


# --- long-running operations ----------------------------------------------------------------


def _refresh_operations(vms: TpuVms) -> bool:
    """Poll every unfinished operation; starts the create of a recreate. True if one ended."""
    ended = False
    for entry in list(st.session_state.get(OPERATIONS_KEY, [])):
        if entry["done"]:
            continue
        try:
            status = vms.operation(entry["name"])
        except TpuError as exc:
            entry["failed_checks"] = entry.get("failed_checks", 0) + 1
            entry["detail"] = f"progress unknown: {exc}"
            if entry["failed_checks"] >= MAX_FAILED_CHECKS:
                entry.update(done=True, ended_at=datetime.now(UTC))
                entry["error"] = (
                    f"{entry['verb']} {entry['target']}: its progress could not be read "
                    f"{MAX_FAILED_CHECKS} times in a row ({exc}); the node list shows its state."
                )
                ended = True
            continue
        entry.update(detail=status.detail, done=status.done, error=status.error)
        if not status.done:
            continue
        ended = True
        entry["ended_at"] = status.ended_at or datetime.now(UTC)
        if entry["then"] is not None and status.succeeded:
            request = NodeRequest(**entry["then"])
            try:
                _remember_operation(vms.create_node(request))
            except TpuError as exc:
                entry["error"] = f"{request.name} was deleted but not created again: {exc}"
    return ended


def _show_operation(entry: dict[str, Any]) -> None:
    what = f"{entry['verb']} {entry['target']}"
    end = entry["ended_at"] or datetime.now(UTC)
    elapsed = (end - entry["started_at"]).total_seconds()
    if entry["error"]:
        st.error(entry["error"], icon=":material/error:")
    elif entry["done"]:
        follow_up = " — now creating it again" if entry["then"] else ""
        st.success(f"{what}: done in {_seconds(elapsed)}{follow_up}", icon=":material/check:")
    else:
        usual = USUAL_SECONDS.get(entry["verb"], 120)
        detail = f" — {entry['detail']}" if entry["detail"] else ""
        st.progress(
            min(elapsed / usual, 0.95),
            text=f"{what}: running for {_seconds(elapsed)} (usually about "
            f"{_seconds(usual)}){detail}",
        )


def operations_section(vms: TpuVms) -> None:
    entries = st.session_state.get(OPERATIONS_KEY, [])
    if not entries:
        return
    running = any(not entry["done"] for entry in entries)

    @st.fragment(run_every=OPERATIONS_REFRESH_S if running else None)
    def show() -> None:
        st.subheader("Operations")
        if _refresh_operations(vms):
            st.rerun()  # the node list and the polling rhythm change with it
        for entry in st.session_state.get(OPERATIONS_KEY, []):
            _show_operation(entry)
        if any(entry["done"] for entry in entries) and st.button(
            "Clear finished operations", key="tpu_clear_operations"
        ):
            st.session_state[OPERATIONS_KEY] = [e for e in entries if not e["done"]]
            st.rerun()

    show()


# --- the node list --------------------------------------------------------------------------


def _worker_columns(node: NodeInfo, workers: dict[str, Any]) -> dict[str, Any]:
    worker = workers.get(node.worker_id)
    if worker is None:
        return {"Worker": "—", "Worker state": "not registered", "Job": None}
    age = (datetime.now(UTC) - worker.heartbeat_at).total_seconds()
    return {
        "Worker": worker.id,
        "Worker state": f"{worker.state}, seen {_seconds(age)} ago",
        "Job": worker.current_job_id,
    }


def _node_rows(nodes: list[NodeInfo], workers: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "Name": node.name,
            "Accelerator": node.accelerator_type,
            "Runtime": node.runtime_version,
            "State": node.state,
            "Health": node.health,
            "Internal IP": ", ".join(node.internal_ips) or "—",
            "External IP": ", ".join(node.external_ips) or "—",
            "Pricing": node.pricing,
            "Queued resource": node.queued_resource or "—",
            **_worker_columns(node, workers),
            "traindeck": node.is_traindeck,
        }
        for node in nodes
    ]


def _confirm(vms: TpuVms, engine: Engine, node: NodeInfo) -> None:
    pending = st.session_state.get(CONFIRM_KEY)
    if not pending or pending["node"] != node.name:
        return
    action = pending["action"]
    consequences = {
        "stop": "The VM shuts down; a job running on it goes back to the queue.",
        "delete": "The VM and its disk are gone for good; a job running on it goes back "
        "to the queue and resumes from its checkpoint on another worker.",
        "recreate": "The VM is deleted, then created again with the same settings and "
        "startup script; a job running on it goes back to the queue.",
    }[action]
    if action == "delete" and node.queued_resource:
        consequences = (
            f"It was created by the queued resource {plain(node.queued_resource)}, which is "
            f"deleted with it. {consequences}"
        )
    st.warning(f"**{CONFIRM_WORDS[action]} TPU VM {plain(node.name)}?** {consequences}")
    yes, no = st.columns(2)
    if no.button("Cancel", key="tpu_confirm_no"):
        del st.session_state[CONFIRM_KEY]
        st.rerun()
    if not yes.button(
        f"Yes, {CONFIRM_WORDS[action].lower()} {node.name}", key="tpu_confirm_yes", type="primary"
    ):
        return
    del st.session_state[CONFIRM_KEY]
    try:
        if action == "stop":
            _remember_operation(vms.stop_node(node.name))
        elif action == "delete" and node.queued_resource:
            # A queued resource's node goes with its queued resource (force: node first).
            _remember_operation(QueuedResources(vms).delete(node.queued_resource))
            _requeue_jobs_of_deleted_node(engine, node)
        elif action == "delete":
            _remember_operation(vms.delete_node(node.name))
            _requeue_jobs_of_deleted_node(engine, node)
        else:
            request = request_from_node(node)
            try:
                vms.check_request(request)  # before the delete: a refused node stays as it is
            except NodeRequestError as exc:
                message = " ".join(str(exc).splitlines())
                st.error(plain(f"{node.name} cannot be created again as it is: {message}"))
                return
            _remember_operation(vms.delete_node(node.name), then=request)
            _requeue_jobs_of_deleted_node(engine, node)
    except TpuError as exc:
        st.error(str(exc))
        return
    st.rerun()


def _node_actions(vms: TpuVms, engine: Engine, nodes: list[NodeInfo]) -> None:
    by_name = {node.name: node for node in nodes}
    name = st.selectbox("Node", list(by_name), key="tpu_selected_node")
    node = by_name[name]
    start, stop, delete, recreate = st.columns(4)
    if start.button("Start", key="tpu_start", disabled=node.state != "STOPPED"):
        try:
            _remember_operation(vms.start_node(node.name))
        except TpuError as exc:
            st.error(str(exc))
        else:
            st.rerun()
    if stop.button("Stop…", key="tpu_stop", disabled=node.state != "READY"):
        st.session_state[CONFIRM_KEY] = {"action": "stop", "node": node.name}
    if delete.button("Delete…", key="tpu_delete", disabled=node.state == "DELETING"):
        st.session_state[CONFIRM_KEY] = {"action": "delete", "node": node.name}
    if recreate.button(
        "Recreate…",
        key="tpu_recreate",
        disabled=not node.is_lost or bool(node.queued_resource),
        help="Delete this preempted or terminated node and create it again, same settings "
        "(not a queued resource's node: delete its queued resource and request it again).",
    ):
        st.session_state[CONFIRM_KEY] = {"action": "recreate", "node": node.name}
    _confirm(vms, engine, node)
    if node.health_description:
        st.caption(f"Health: {node.health_description}")
    with st.expander(f"Startup script of {node.name}"):
        if node.startup_script:
            st.code(mask_passwords(node.startup_script), language="bash")
        else:
            st.caption("This node has no startup script, so it starts no traindeck worker.")


def nodes_section(vms: TpuVms, engine: Engine) -> None:
    @st.fragment(run_every=NODES_REFRESH_S)
    def show() -> None:
        st.subheader(f"Nodes in {vms.project} / {vms.zone}")
        try:
            nodes = vms.list_nodes()
        except TpuError as exc:
            st.error(str(exc))
            return
        try:
            _remember_recoveries(recover_jobs_of_lost_nodes(engine, nodes))
            workers = {worker.id: worker for worker in list_workers(engine)}
        except DatabaseError as exc:
            st.error(f"The database could not be read or updated: {exc}")
            workers = {}
        recoveries = st.session_state.get(RECOVERIES_KEY, [])
        for summary in recoveries:
            st.warning(summary, icon=":material/restart_alt:")
        if recoveries and st.button("Dismiss", key="tpu_dismiss_recoveries"):
            st.session_state[RECOVERIES_KEY] = []
            st.rerun()
        if not nodes:
            st.info("No TPU VMs here yet. Create one below.")
            return
        st.dataframe(_node_rows(nodes, workers), hide_index=True)
        for node in nodes:
            if node.is_lost:
                st.warning(
                    f"{node.name} is {node.state}: its jobs went back to the queue. Delete it, "
                    "or recreate it with the same settings.",
                    icon=":material/warning:",
                )
        _node_actions(vms, engine, nodes)

    show()


# --- queued resources -----------------------------------------------------------------------


def _queued_rows(
    found: list[QueuedResourceInfo], shapes: dict[str, AcceleratorShape | None]
) -> list[dict[str, Any]]:
    rows = []
    for queued in found:
        shape = shapes.get(queued.accelerator_type)
        multi_host = shape is not None and not shape.single_host
        rows.append(
            {
                "Name": queued.name,
                "Accelerator": queued.accelerator_type,
                "Hosts": shape.hosts if shape is not None else None,
                "Tier": queued.tier,
                "State": queued.state_words,
                "TPU VM": ", ".join(queued.node_names) or "—",
                "Created": queued.created_at,
                "Note": EXPERIMENTAL_SLICE if multi_host else "",
            }
        )
    return rows


def _queued_notes(found: list[QueuedResourceInfo]) -> None:
    for queued in found:
        if queued.is_lost:
            st.warning(
                plain(
                    f"Queued resource {queued.name} is {queued.state_words}: the jobs of its "
                    "workers went back to the queue. Delete it, and request it again."
                ),
                icon=":material/warning:",
            )
        elif queued.is_waiting:
            st.info(
                plain(
                    f"Queued resource {queued.name} is {queued.state_words}: its TPU VM is "
                    "created once the zone has the capacity, which may take hours when demand "
                    "is high."
                ),
                icon=":material/hourglass_top:",
            )


def _confirm_queued(
    queued_resources: QueuedResources, engine: Engine, queued: QueuedResourceInfo
) -> None:
    pending = st.session_state.get(QUEUED_CONFIRM_KEY)
    if pending != queued.name:
        return
    st.warning(
        f"**Delete queued resource {plain(queued.name)}?** The request leaves Google's queue; "
        "its TPU VMs, if any, are deleted with their disks, and a job running on them goes back "
        "to the queue and resumes from its checkpoint on another worker."
    )
    yes, no = st.columns(2)
    if no.button("Cancel", key="tpu_queued_confirm_no"):
        del st.session_state[QUEUED_CONFIRM_KEY]
        st.rerun()
    if not yes.button(f"Yes, delete {queued.name}", key="tpu_queued_confirm_yes", type="primary"):
        return
    del st.session_state[QUEUED_CONFIRM_KEY]
    try:
        _remember_operation(queued_resources.delete(queued.name))
    except TpuError as exc:
        st.error(plain(exc))
        return
    _requeue_jobs_of_deleted_slice(engine, queued)
    st.rerun()


def queued_section(vms: TpuVms, engine: Engine) -> None:
    @st.fragment(run_every=NODES_REFRESH_S)
    def show() -> None:
        st.subheader(f"Queued resources in {vms.project} / {vms.zone}")
        queued_resources = QueuedResources(vms)
        try:
            found = queued_resources.list()
        except TpuError as exc:
            st.error(plain(exc))
            return
        try:
            _remember_recoveries(recover_jobs_of_lost_slices(engine, found))
        except DatabaseError as exc:
            st.error(plain(f"The database could not be read or updated: {exc}"))
        if not found:
            st.caption(
                "None. A multi-host slice is requested as a queued resource below; so is a "
                "TPU VM with *Request as a queued resource* ticked."
            )
            return
        shapes, _, _ = _zone_choices(vms)
        st.dataframe(_queued_rows(found, shapes), hide_index=True)
        _queued_notes(found)
        by_name = {queued.name: queued for queued in found}
        name = st.selectbox("Queued resource", list(by_name), key="tpu_selected_queued")
        queued = by_name[name]
        if st.button(
            "Delete queued resource…",
            key="tpu_queued_delete",
            disabled=queued.state == "DELETING",
            help="Deletes the request and its TPU VMs.",
        ):
            st.session_state[QUEUED_CONFIRM_KEY] = queued.name
        _confirm_queued(queued_resources, engine, queued)

    show()


# --- creating a node ------------------------------------------------------------------------


def _bootstrap_settings(name: str, hosts: int) -> BootstrapSettings:
    st.markdown("**The traindeck worker on the VM**")
    source, ref = st.columns([3, 1])
    source_url = source.text_input(
        "traindeck source (git URL or .tar.gz URL)",
        value=settings().source_url or "",
        key="tpu_new_source",
        help="Where the VM downloads traindeck from; it must reach it.",
    )
    source_ref = ref.text_input("Git branch or tag", value=DEFAULT_SOURCE_REF, key="tpu_new_ref")
    # Shown with its password masked; left as shown, the real one is used.
    worker_url = settings().worker_database_url
    configured = worker_url.get_secret_value() if worker_url else config.database_url()
    database_url = st.text_input(
        "Database URL for the workers",
        value=printable_url(configured),
        key="tpu_new_database_url",
        help="The shared Postgres server, as the VM reaches it. Its password is shown as ***: "
        f"left so, the one in {WORKER_DATABASE_URL_ENV} (or DATABASE_URL) is used.",
    )
    if database_url.strip() == printable_url(configured):
        database_url = configured
    data_dir = st.text_input("Data folder on the VM", value=DEFAULT_DATA_DIR, key="tpu_new_data")
    return BootstrapSettings(
        node_name=name.strip(),
        database_url=database_url.strip(),
        source_url=source_url.strip(),
        source_ref=source_ref.strip(),
        data_dir=data_dir.strip(),
        store_url=_shared_store(),
        slice_hosts=hosts,
    )


def _shared_store() -> str:
    """The bucket this dashboard uses, which the VM's worker must share; empty when the store
    is this machine's folder (BootstrapSettings.problems then says why no VM can be created)."""
    try:
        return store.store_url() if store.is_shared() else ""
    except (store.StoreError, ValueError):  # a malformed TRAINDECK_STORE
        return os.environ.get(store.STORE_ENV, "")


def _storage_access(store_url: str) -> None:
    """What the VM's service account needs to use the bucket."""
    bucket = store_url.removeprefix("gs://").split("/", 1)[0]
    st.caption(
        plain(
            f"The worker gets {store.STORE_ENV}={store_url}: datasets, checkpoints, exports "
            f"and model cards go through the bucket {bucket}. The VM runs as the project's "
            f"default Compute Engine service account (this page names none), which needs the "
            f"IAM role {STORAGE_ROLE} on {bucket}; if the VM's access scopes are restricted, "
            f"they must include {STORAGE_SCOPE} (or {CLOUD_PLATFORM_SCOPE})."
        )
    )


@dataclasses.dataclass(frozen=True)
class _Choice:
    """What the person chose in the create form."""

    machine: dict[str, Any]
    refusal: str | None  # why traindeck refuses the accelerator type; None: it does not
    queued: bool  # requested as a queued resource
    hosts: int  # the TPU VM hosts of the type (1 when unknown)


def _slice_notice(shape: AcceleratorShape) -> str:
    return (
        f"{shape.type} is a multi-host slice ({shape.hosts} hosts, {shape.chips} chips in a "
        f"{shape.topology} topology): it is requested as a queued resource, and its startup "
        f"script starts a worker on every host. Experimental: not verified on a real slice. "
        "The orchestration was tested here against a local fake of the Cloud TPU API only; "
        "one job trained across the hosts of a real slice has never been seen."
    )


def _machine_inputs(vms: TpuVms) -> _Choice:
    """What the person chose, and why traindeck refuses the accelerator type (None if not)."""
    shapes, versions, problem = _zone_choices(vms)
    if problem:
        st.caption(f"The zone's accelerator types and runtime versions are unknown: {problem}")
    types = list(shapes) or list(COMMON_ACCELERATOR_TYPES)
    name_column, type_column, runtime_column = st.columns(3)
    name = name_column.text_input("Name", key="tpu_new_name", placeholder="traindeck-v4-1")
    accelerator_type = type_column.selectbox(
        "Accelerator type",
        types,
        index=types.index("v4-8") if "v4-8" in types else 0,
        format_func=_type_label(shapes),
        key="tpu_new_type",
        help="A multi-host slice is requested as a queued resource, with a worker on every "
        f"host ({EXPERIMENTAL_SLICE}).",
    )
    shape = shapes.get(accelerator_type)
    multi_host = shape is not None and not shape.single_host
    suggested = suggested_runtime_version(accelerator_type)
    if versions:
        runtime_version = runtime_column.selectbox(
            "Runtime version",
            versions,
            index=versions.index(suggested) if suggested in versions else 0,
            key=f"tpu_new_runtime_{accelerator_type}",
        )
    else:
        runtime_version = runtime_column.text_input(
            "Runtime version", value=suggested, key=f"tpu_new_runtime_{accelerator_type}"
        )
    spot_column, queued_column, ip_column = st.columns(3)
    spot = spot_column.checkbox(
        "Spot",
        value=True,
        key="tpu_new_spot",
        help="Far cheaper, but Google may preempt it (or suspend a spot queued resource) at "
        "any time: its job then goes back to the queue and resumes from its checkpoint on "
        "another worker. Unticked: on demand.",
    )
    queued_help = (
        "The request waits in Google's queue until the zone has the capacity, then creates "
        "the TPU VM; the list of queued resources shows where it stands."
    )
    if multi_host:
        queued = queued_column.checkbox(
            "Request as a queued resource",
            value=True,
            disabled=True,
            key="tpu_new_queued_slice",
            help=f"{queued_help} A multi-host slice is requested only this way.",
        )
    else:
        queued = queued_column.checkbox(
            "Request as a queued resource", value=False, key="tpu_new_queued", help=queued_help
        )
    if not shapes:
        refusal = None
    elif queued or multi_host:
        refusal = queued_type_refusal(accelerator_type, vms.zone, shapes)
    else:
        refusal = accelerator_type_refusal(accelerator_type, vms.zone, shapes)
    if refusal:
        st.error(plain(refusal), icon=":material/block:")
    elif multi_host:
        st.warning(plain(_slice_notice(shape)), icon=":material/science:")
    external_ip = ip_column.checkbox(
        "External IP",
        value=True,
        key="tpu_new_external_ip",
        help="The VM downloads packages and traindeck: it needs an external IP unless the "
        "network has Cloud NAT.",
    )
    network_column, subnetwork_column = st.columns(2)
    network = network_column.text_input("Network", value="default", key="tpu_new_network")
    subnetwork = subnetwork_column.text_input("Subnetwork (optional)", key="tpu_new_subnetwork")
    machine = {
        "name": name.strip(),
        "accelerator_type": accelerator_type,
        "runtime_version": runtime_version.strip(),
        "spot": spot,
        "external_ip": external_ip,
        "network": network.strip(),
        "subnetwork": subnetwork.strip(),
    }
    hosts = shape.hosts if shape is not None else 1
    return _Choice(machine, refusal, queued or multi_host, hosts)


def _unmask(edited: str, preview: str, generated: str) -> str:
    """The edited script with each line that the preview masked (the database URL's) as the
    generated script has it."""
    for shown, real in zip(preview.splitlines(), generated.splitlines(), strict=True):
        if shown != real:
            edited = edited.replace(shown, real)
    return edited


def create_section(vms: TpuVms) -> None:
    @st.fragment
    def show() -> None:
        st.subheader("Create a TPU VM or request a slice")
        choice = _machine_inputs(vms)
        bootstrap = _bootstrap_settings(choice.machine["name"], choice.hosts)
        problems = bootstrap.problems()
        script = ""
        if problems:
            st.info(
                "The startup script is written once these are settled:\n\n- "
                + "\n- ".join(plain(problem) for problem in problems)
            )
        else:
            # Shown with the database password masked; the node gets it in full.
            generated = build_startup_script(bootstrap)
            masked = dataclasses.replace(
                bootstrap, database_url=printable_url(bootstrap.database_url)
            )
            preview = build_startup_script(masked)
            digest = hashlib.sha256(preview.encode()).hexdigest()[:12]
            edited = st.text_area(
                "Startup script (you may edit it)",
                value=preview,
                height=360,
                key=f"tpu_new_script_{digest}",
                help="Changing a setting above writes a new script and drops your edits.",
            )
            script = _unmask(edited, preview, generated)
            _storage_access(bootstrap.store_url)
            st.caption(
                "The database password is shown as ***; the node gets it in full. The script, "
                "database URL included, is stored in the node's metadata: anyone who may view "
                "the node can read it."
            )
        disabled = bool(problems or choice.refusal)
        label = "Request" if choice.queued else "Create"
        if st.button(label, key="tpu_create", type="primary", disabled=disabled):
            request = NodeRequest(startup_script=script, **choice.machine)
            try:
                # Checks the accelerator type again, in the zone's current offer.
                if choice.queued:
                    _remember_operation(QueuedResources(vms).create(SliceRequest(request)))
                else:
                    _remember_operation(vms.create_node(request))
            except TpuError as exc:
                st.error(plain(exc))
                return
            st.rerun()

    show()


# --- the page -------------------------------------------------------------------------------


def main() -> None:
    st.title("TPU VMs")
    try:
        endpoint = api_endpoint()
    except TpuError as exc:
        st.error(str(exc))
        st.stop()
    found = _credentials(endpoint, _credentials_environment())
    if isinstance(found, TpuError):
        st.warning(str(found), icon=":material/key:")
        if st.button("Check again", key="tpu_check_credentials"):
            _credentials.clear()
            st.rerun()
        st.stop()

    project_column, zone_column = st.columns(2)
    project = project_column.text_input(
        "Project", value=default_project(found), key="tpu_project", placeholder="my-project-123"
    )
    zone = zone_column.text_input(
        "Zone", value=default_zone(), key="tpu_zone", placeholder="us-central2-b"
    )
    st.caption(f"Credentials: {found.source} · API: {endpoint}")
    if not project.strip() or not zone.strip():
        st.info("Enter the Google Cloud project and the zone of your TPU VMs.")
        st.stop()
    try:
        client = _client(endpoint, found.source, id(found.credentials), found)
        vms = TpuVms(client, project, zone, endpoint)
    except TpuError as exc:
        st.error(str(exc))
        st.stop()

    engine = get_engine()
    operations_section(vms)
    queued_section(vms, engine)
    nodes_section(vms, engine)
    create_section(vms)


main()

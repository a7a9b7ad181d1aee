"""The TPU client wrapper, through the real `google.cloud.tpu_v2.TpuClient` (REST transport,
anonymous credentials) against the local fake of the Cloud TPU v2 API."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.api_core import exceptions as api_exceptions

from cloud import tpu as tpu_cloud
from cloud.tpu import (
    AcceleratorShape,
    AcceleratorTypeRefused,
    CredentialsMissing,
    NodeRequest,
    NodeRequestError,
    TpuError,
    TpuVms,
    load_credentials,
    make_client,
)
from common.settings import SettingsError
from tests.support.fake_tpu_api import FakeTpuApi
from tests.support.tpu import PROJECT, ZONE

SCRIPT = "#!/bin/bash\necho 'start the worker'\n"


def _request(**changes) -> NodeRequest:
    fields = {
        "name": "trainer-1",
        "accelerator_type": "v4-8",
        "runtime_version": "tpu-ubuntu2204-base",
        "startup_script": SCRIPT,
        **changes,
    }
    return NodeRequest(**fields)


def test_list_reads_every_page_and_every_column(fake_api: FakeTpuApi, vms: TpuVms):
    fake_api.page_size = 2
    fake_api.add_node(
        PROJECT,
        ZONE,
        "spot-a",
        schedulingConfig={"spot": True},
        networkConfig={"network": "default", "enableExternalIps": True},
        labels={"managed-by": "traindeck"},
        metadata={"startup-script": SCRIPT},
    )
    fake_api.add_node(PROJECT, ZONE, "old-b", schedulingConfig={"preemptible": True})
    fake_api.add_node(PROJECT, ZONE, "plain-c", acceleratorType="v5litepod-8", state="STOPPED")
    fake_api.add_node(PROJECT, "europe-west4-a", "elsewhere")

    nodes = vms.list_nodes()

    assert [node.name for node in nodes] == ["old-b", "plain-c", "spot-a"]
    assert len(fake_api.requests_of("GET", "/nodes")) == 2, "two pages"
    spot = nodes[2]
    assert spot.resource_name == f"projects/{PROJECT}/locations/{ZONE}/nodes/spot-a"
    assert (spot.accelerator_type, spot.runtime_version) == ("v4-8", "tpu-ubuntu2204-base")
    assert (spot.state, spot.health, spot.pricing) == ("READY", "HEALTHY", "spot")
    assert spot.internal_ips[0].startswith("10.130.0.") and spot.external_ips
    assert spot.is_traindeck and spot.startup_script == SCRIPT
    assert spot.worker_id == "tpu-spot-a"
    assert spot.created_at is not None
    assert nodes[0].pricing == "preemptible" and not nodes[0].external_ips
    assert nodes[1].state == "STOPPED" and nodes[1].accelerator_type == "v5litepod-8"


def test_create_sends_the_startup_script_and_follows_the_operation(
    fake_api: FakeTpuApi, vms: TpuVms
):
    fake_api.polls_until_done = 2
    started = vms.create_node(_request(spot=True, subnetwork="tpu-subnet"))

    assert (started.verb, started.target_name, started.done) == ("create", "trainer-1", False)
    (sent,) = fake_api.requests_of("POST", "/nodes")
    assert sent.query["nodeId"] == ["trainer-1"]
    assert sent.headers.get("Authorization") is None, "anonymous: no token is sent"
    body = sent.body
    assert body["metadata"] == {"startup-script": SCRIPT}
    assert body["schedulingConfig"] == {"spot": True}
    assert (body["acceleratorType"], body["runtimeVersion"]) == ("v4-8", "tpu-ubuntu2204-base")
    assert body["networkConfig"]["subnetwork"] == "tpu-subnet"
    assert body["labels"] == {"managed-by": "traindeck"}
    assert vms.get_node("trainer-1").state == "CREATING"

    seen = []
    finished = vms.wait(started.name, poll_s=0.01, on_progress=seen.append)

    assert [status.done for status in seen] == [False, True]
    assert finished.succeeded and finished.error is None
    assert finished.elapsed_s() is not None and finished.elapsed_s() >= 0
    node = vms.get_node("trainer-1")
    assert node.state == "READY" and node.startup_script == SCRIPT and node.spot


def test_stop_start_and_delete(fake_api: FakeTpuApi, vms: TpuVms):
    fake_api.add_node(PROJECT, ZONE, "worker-1")

    assert vms.wait(vms.stop_node("worker-1").name, poll_s=0.01).succeeded
    assert vms.get_node("worker-1").state == "STOPPED"
    assert vms.wait(vms.start_node("worker-1").name, poll_s=0.01).succeeded
    assert vms.get_node("worker-1").state == "READY"
    deleting = vms.delete_node("worker-1")
    assert vms.get_node("worker-1").state == "DELETING"
    assert vms.wait(deleting.name, poll_s=0.01).succeeded
    assert vms.list_nodes() == []
    assert len(fake_api.requests_of("DELETE")) == 1


def test_quota_error_becomes_a_readable_message(fake_api: FakeTpuApi, vms: TpuVms):
    fake_api.fail_next(
        "create",
        403,
        "Quota 'TPUV4PodPerProjectPerZoneForTPUAPI' exceeded. Limit: 0.0 in zone us-central2-b.",
    )

    with pytest.raises(TpuError) as caught:
        vms.create_node(_request())

    message = str(caught.value)
    assert message.startswith("Quota exceeded while creating TPU VM trainer-1: Quota ")
    assert "HTTP 403" in message and "IAM & Admin" in message
    assert "Traceback" not in message
    assert fake_api.nodes == {}


def test_permission_denied_and_not_found_and_too_many_requests(fake_api: FakeTpuApi, vms: TpuVms):
    fake_api.fail_next("list", 403, "Permission 'tpu.nodes.list' denied on resource.")
    with pytest.raises(TpuError, match=r"Permission denied while listing .*\(roles/tpu\.admin\)"):
        vms.list_nodes()

    with pytest.raises(TpuError, match=r"^Not found while reading TPU VM ghost: .*HTTP 404"):
        vms.get_node("ghost")

    fake_api.add_node(PROJECT, ZONE, "busy")
    fake_api.fail_next("delete", 429, "Rate of requests too high", "RESOURCE_EXHAUSTED")
    with pytest.raises(TpuError, match=r"^Quota exceeded while deleting TPU VM busy"):
        vms.delete_node("busy")

    with pytest.raises(TpuError, match=r"refused starting TPU VM busy: Cannot start .* READY"):
        vms.start_node("busy")


def test_an_operation_that_fails_says_why(fake_api: FakeTpuApi, vms: TpuVms):
    fake_api.fail_next_operation(8, "There is no more capacity in the zone us-central2-b")

    started = vms.create_node(_request())
    finished = vms.wait(started.name, poll_s=0.01)

    assert finished.done and not finished.succeeded
    assert finished.error.startswith("create trainer-1 failed: There is no more capacity")
    assert "RESOURCE_EXHAUSTED" in finished.error and "another zone" in finished.error
    assert fake_api.nodes == {}


def test_a_bad_request_is_refused_before_any_call(fake_api: FakeTpuApi, vms: TpuVms):
    bad = _request(
        name="Trainer_1",
        accelerator_type="tpu-big",
        runtime_version="tpu ubuntu",
        network="my net",
        startup_script=" ",
    )

    with pytest.raises(NodeRequestError) as caught:
        vms.create_node(bad)

    problems = str(caught.value).splitlines()
    assert len(problems) == 5
    assert "'Trainer_1' is not a valid TPU VM name" in problems[0]
    assert "'tpu-big' is not one like v3-8" in problems[1]
    assert fake_api.requests == []
    assert (
        _request(startup_script="x" * (300 * 1024))
        .problems()[0]
        .startswith("The startup script is 307,200 bytes")
    )


def test_a_bad_project_or_zone_is_named(vms: TpuVms):
    with pytest.raises(TpuError, match=r"'My Project' is not a Google Cloud project id.*'mars'"):
        TpuVms(vms.client, "My Project", "mars", vms.endpoint)


def test_an_unreachable_endpoint_is_named():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{closed_port}"
    client = make_client(endpoint, load_credentials(endpoint).credentials)

    with pytest.raises(TpuError) as caught:
        TpuVms(client, PROJECT, ZONE, endpoint).list_nodes()

    assert str(caught.value).startswith(f"Cannot reach the Cloud TPU API at {endpoint} while")
    assert "refused" in str(caught.value)


def test_endpoint_setting(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRAINDECK_TPU_API_ENDPOINT")
    assert tpu_cloud.api_endpoint() == "https://tpu.googleapis.com"
    monkeypatch.setenv("TRAINDECK_TPU_API_ENDPOINT", "http://127.0.0.1:8080/")
    assert tpu_cloud.api_endpoint() == "http://127.0.0.1:8080"
    monkeypatch.setenv("TRAINDECK_TPU_API_ENDPOINT", "tpu.example.com")
    assert tpu_cloud.api_endpoint() == "https://tpu.example.com"
    monkeypatch.setenv("TRAINDECK_TPU_API_ENDPOINT", "ftp://somewhere/v2")
    refusal = (
        "TRAINDECK_TPU_API_ENDPOINT='ftp://somewhere/v2' is not valid: an address like "
        "https://tpu.googleapis.com or http://127.0.0.1:8080"
    )
    with pytest.raises(SettingsError) as caught:
        tpu_cloud.api_endpoint()
    assert str(caught.value) == refusal


def test_anonymous_credentials_never_go_to_google():
    with pytest.raises(CredentialsMissing, match="works only with a local API endpoint"):
        load_credentials("https://tpu.googleapis.com")


def test_without_credentials_the_message_says_how_to_set_them(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRAINDECK_TPU_CREDENTIALS")

    with pytest.raises(CredentialsMissing) as caught:
        load_credentials("https://tpu.googleapis.com")

    message = str(caught.value)
    assert message.startswith("No Google Cloud credentials were found")
    assert "gcloud auth application-default login" in message
    assert "TRAINDECK_TPU_CREDENTIALS" in message and "roles/tpu.admin" in message


def test_service_account_key_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRAINDECK_TPU_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(CredentialsMissing, match=r"missing\.json, which is not a file"):
        load_credentials("https://tpu.googleapis.com")

    broken = tmp_path / "broken.json"
    broken.write_text('{"type": "service_account", "client_email": "x"}')
    monkeypatch.setenv("TRAINDECK_TPU_CREDENTIALS", str(broken))
    with pytest.raises(CredentialsMissing, match="is not a usable service-account key file"):
        load_credentials("https://tpu.googleapis.com")

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    good = tmp_path / "key.json"
    good.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "keyed-project",
                "private_key_id": "abc123",
                "private_key": pem,
                "client_email": "dashboard@keyed-project.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        )
    )
    monkeypatch.setenv("TRAINDECK_TPU_CREDENTIALS", str(good))
    monkeypatch.delenv("TRAINDECK_TPU_PROJECT")

    found = load_credentials("https://tpu.googleapis.com")

    assert found.project == "keyed-project"
    assert "dashboard@keyed-project.iam.gserviceaccount.com" in found.source
    assert tpu_cloud.default_project(found) == "keyed-project"


def test_recreate_request_keeps_the_settings(fake_api: FakeTpuApi, vms: TpuVms):
    fake_api.add_node(
        PROJECT,
        ZONE,
        "spot-a",
        state="PREEMPTED",
        acceleratorType="v5litepod-8",
        runtimeVersion="v2-alpha-tpuv5-lite",
        schedulingConfig={"spot": True},
        networkConfig={"network": "projects/p/global/networks/tpu-net", "subnetwork": "s1"},
        labels={"managed-by": "traindeck", "team": "vision"},
        metadata={"startup-script": SCRIPT},
    )

    request = tpu_cloud.request_from_node(vms.get_node("spot-a"))

    assert request.problems() == []
    assert (request.accelerator_type, request.runtime_version) == (
        "v5litepod-8",
        "v2-alpha-tpuv5-lite",
    )
    assert (request.spot, request.network, request.subnetwork) == (True, "tpu-net", "s1")
    assert request.startup_script == SCRIPT and request.labels["team"] == "vision"


def test_suggested_runtime_versions():
    assert tpu_cloud.suggested_runtime_version("v4-8") == "tpu-ubuntu2204-base"
    assert tpu_cloud.suggested_runtime_version("v5litepod-8") == "v2-alpha-tpuv5-lite"
    assert tpu_cloud.suggested_runtime_version("v6e-8") == "v2-alpha-tpuv6e"


def test_zone_choices_come_from_the_api(vms: TpuVms):
    assert vms.list_accelerator_types() == [
        "v2-8",
        "v2-32",
        "v3-8",
        "v3-32",
        "v4-8",
        "v4-16",
        "v4-32",
        "v5litepod-1",
        "v5litepod-4",
        "v5litepod-8",
        "v5litepod-16",
        "v5litepod-32",
        "v5p-8",
        "v5p-16",
        "v6e-8",
        "v6e-16",
    ]
    assert "tpu-ubuntu2204-base" in vms.list_runtime_versions()


# --- single hosts only, for now (issue 25) --------------------------------------------------


def test_hosts_are_counted_from_the_apis_topology(vms: TpuVms):
    shapes = vms.accelerator_shapes()

    counted = {name: (shape.topology, shape.chips, shape.hosts) for name, shape in shapes.items()}
    assert counted["v2-8"] == ("2x2", 4, 1)
    assert counted["v2-32"] == ("4x4", 16, 4)
    assert counted["v3-8"] == ("2x2", 4, 1)
    assert counted["v4-8"] == ("2x2x1", 4, 1)
    assert counted["v4-16"] == ("2x2x2", 8, 2)
    assert counted["v4-32"] == ("2x2x4", 16, 4)
    assert counted["v5litepod-1"] == ("1x1", 1, 1)
    assert counted["v5litepod-8"] == ("2x4", 8, 1), "a v5e VM holds up to 8 chips"
    assert counted["v5litepod-16"] == ("4x4", 16, 4), "a v5e slice is made of 4-chip VMs"
    assert counted["v5litepod-32"] == ("4x8", 32, 8)
    assert counted["v5p-8"] == ("2x2x1", 4, 1)
    assert counted["v5p-16"] == ("2x2x2", 8, 2)
    assert counted["v6e-8"] == ("2x4", 8, 1)
    assert counted["v6e-16"] == ("4x4", 16, 4)
    single = [name for name, shape in shapes.items() if shape.single_host]
    assert single == [
        "v2-8",
        "v3-8",
        "v4-8",
        "v5litepod-1",
        "v5litepod-4",
        "v5litepod-8",
        "v5p-8",
        "v6e-8",
    ]


def test_the_topology_counts_not_the_name(fake_api: FakeTpuApi, vms: TpuVms):
    fake_api.accelerator_types = {
        "v4-8": ("V4", "2x2x2"),  # the API, not the name, says how big the slice is
        "v7-8": ("TYPE_UNSPECIFIED", "2x2x1"),  # a generation unknown here: 4 chips a host
        "v7-16": ("TYPE_UNSPECIFIED", "2x2x2"),
    }

    shapes = vms.accelerator_shapes()

    assert shapes["v4-8"] == AcceleratorShape("v4-8", "2x2x2", 8, 2)
    assert shapes["v7-8"].hosts == 1 and shapes["v7-16"].hosts == 2
    with pytest.raises(AcceleratorTypeRefused, match=r"^v4-8 is a multi-host slice \(2 hosts"):
        vms.create_node(_request())
    assert fake_api.requests_of("POST") == []


def test_a_single_host_type_is_created(fake_api: FakeTpuApi, vms: TpuVms):
    started = vms.create_node(_request(accelerator_type="v4-8"))

    assert started.target_name == "trainer-1"
    listed, created = fake_api.requests
    assert (listed.method, listed.path.rsplit("/", 1)[-1]) == ("GET", "acceleratorTypes")
    assert created.method == "POST" and created.body["acceleratorType"] == "v4-8"


@pytest.mark.parametrize(
    ("accelerator_type", "hosts", "chips", "topology", "instead"),
    [
        ("v4-32", 4, 16, "2x2x4", "v4-8"),
        ("v4-16", 2, 8, "2x2x2", "v4-8"),
        ("v5litepod-16", 4, 16, "4x4", "v5litepod-8"),
        ("v6e-16", 4, 16, "4x4", "v6e-8"),
        ("v2-32", 4, 16, "4x4", "v2-8"),
    ],
)
def test_a_multi_host_type_is_refused_with_its_host_count(
    fake_api: FakeTpuApi, vms: TpuVms, accelerator_type, hosts, chips, topology, instead
):
    with pytest.raises(AcceleratorTypeRefused) as caught:
        vms.create_node(_request(accelerator_type=accelerator_type))

    assert str(caught.value) == (
        f"{accelerator_type} is a multi-host slice ({hosts} hosts, {chips} chips in a "
        f"{topology} topology); traindeck runs one job on one TPU VM host for now; pick a "
        f"single-host type such as {instead}. A multi-host slice can be requested as a queued "
        "resource instead (experimental: not verified on a real slice)."
    )
    assert fake_api.requests_of("POST") == [], "no create call"
    assert fake_api.nodes == {}


def test_a_type_the_zone_does_not_offer_is_refused(fake_api: FakeTpuApi, vms: TpuVms):
    # What us-central2-b offers: TPU v4 only.
    fake_api.accelerator_types = {
        name: shape for name, shape in fake_api.accelerator_types.items() if name[:3] == "v4-"
    }

    for unknown in ("v5litepod-8", "v9-8"):
        with pytest.raises(AcceleratorTypeRefused) as caught:
            vms.create_node(_request(accelerator_type=unknown))
        assert str(caught.value) == (
            f"The accelerator type {unknown} is not offered in {ZONE}; single-host types "
            "offered there: v4-8."
        )

    fake_api.accelerator_types = {"v4-32": ("V4", "2x2x4")}
    with pytest.raises(AcceleratorTypeRefused, match=f"; {ZONE} offers no single-host type. "):
        vms.create_node(_request(accelerator_type="v4-32"))
    assert fake_api.requests_of("POST") == []


def test_a_type_without_a_topology_is_refused(fake_api: FakeTpuApi, vms: TpuVms):
    fake_api.accelerator_types = {"v4-8": ("V4", "")}

    assert vms.accelerator_shapes() == {"v4-8": None}
    with pytest.raises(AcceleratorTypeRefused, match=r"gives no topology for v4-8 in us-"):
        vms.create_node(_request())
    assert fake_api.requests_of("POST") == []


def test_the_fake_answers_a_single_accelerator_type_as_the_api_does(vms: TpuVms):
    found = vms.client.get_accelerator_type(name=f"{vms.parent}/acceleratorTypes/v5litepod-16")

    assert found.type_ == "v5litepod-16"
    (config,) = found.accelerator_configs
    assert (config.type_.name, config.topology) == ("V5LITE_POD", "4x4")
    with pytest.raises(api_exceptions.NotFound):
        vms.client.get_accelerator_type(name=f"{vms.parent}/acceleratorTypes/v9-8")

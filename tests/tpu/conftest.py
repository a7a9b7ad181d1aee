"""Every TPU test talks to a local fake of the Cloud TPU v2 REST API, and can reach nothing else.

The autouse fixtures point `TRAINDECK_TPU_API_ENDPOINT` at the fake, take away every way
Application Default Credentials could find real credentials (the variable, the gcloud folder,
the metadata server, whose address is pointed at the fake too), and make resolving any host
name other than the loopback one an error, so no test can fall through to googleapis.com.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud.tpu import TpuVms, api_endpoint, load_credentials, make_client
from tests.support.fake_tpu_api import FakeTpuApi
from tests.support.tpu import LOOPBACK_HOSTS, PROJECT, STORE_URL, ZONE


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in LOOPBACK_HOSTS:
            raise OSError(f"TPU tests must not reach the network (asked to resolve {name!r})")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def fake_api() -> Iterator[FakeTpuApi]:
    with FakeTpuApi() as api:
        yield api


@pytest.fixture(autouse=True)
def _tpu_environment(fake_api: FakeTpuApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINDECK_TPU_API_ENDPOINT", fake_api.url)
    monkeypatch.setenv("TRAINDECK_TPU_CREDENTIALS", "anonymous")
    monkeypatch.setenv("TRAINDECK_TPU_PROJECT", PROJECT)
    monkeypatch.setenv("TRAINDECK_TPU_ZONE", ZONE)
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    gcloud = tmp_path / "gcloud-config"
    gcloud.mkdir()
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(gcloud))
    monkeypatch.setenv("GCE_METADATA_IP", fake_api.address)
    # The page creates workers only with a store other machines can read. Nothing here may
    # reach the bucket: a dashboard started as a process (which checks it at start-up) gets
    # an environment without it (test_tpu_browser.py).
    monkeypatch.setenv("TRAINDECK_STORE", STORE_URL)


@pytest.fixture
def vms(fake_api: FakeTpuApi) -> TpuVms:
    """The real TpuClient (REST, anonymous) on the fake, for the test project and zone."""
    endpoint = api_endpoint()
    assert endpoint == fake_api.url
    found = load_credentials(endpoint)
    return TpuVms(make_client(endpoint, found.credentials), PROJECT, ZONE, endpoint)

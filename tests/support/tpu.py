"""Constants of the fake Cloud TPU project the TPU tests use."""

from __future__ import annotations

PROJECT = "test-project"


ZONE = "us-central2-b"


LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


# The bucket the dashboard and the TPU VMs' workers share in the TPU tests (never reached).
STORE_URL = "gs://traindeck-shared/td"

"""What accelerator this machine has, found without importing torch_xla (the supervisor
must not: one process owns a TPU, and that is the job's child)."""

from __future__ import annotations

import glob
import os
import platform
import shutil
import subprocess
import urllib.request

METADATA_URL = (
    "http://metadata.google.internal/computeMetadata/v1/instance/attributes/accelerator-type"
)


def tpu_present() -> bool:
    """A TPU VM: PJRT_DEVICE=TPU, or TPU device files (/dev/accel* on v2-v4, vfio on v5+)."""
    if os.environ.get("PJRT_DEVICE", "").upper() == "TPU":
        return True
    return bool(glob.glob("/dev/accel*")) or bool(os.environ.get("TPU_ACCELERATOR_TYPE"))


def tpu_accelerator_type() -> str | None:
    """e.g. 'v4-8', from the environment or the VM's metadata server."""
    accelerator = os.environ.get("TPU_ACCELERATOR_TYPE")
    if accelerator:
        return accelerator
    request = urllib.request.Request(METADATA_URL, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=1) as response:
            return response.read().decode().strip() or None
    except OSError:
        return None


def cuda_devices() -> list[str]:
    """Names of the NVIDIA GPUs nvidia-smi reports (empty without a driver)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in output.splitlines() if line.strip()]


def resolve_device(requested: str) -> str:
    """'auto' → 'xla' on a TPU VM, else 'cuda' with a GPU, else 'cpu'. Others unchanged."""
    if requested != "auto":
        return requested
    if tpu_present():
        return "xla"
    if cuda_devices():
        return "cuda"
    return "cpu"


def describe_machine() -> str:
    """A line for the workers table: the accelerator this worker offers."""
    if tpu_present():
        accelerator = tpu_accelerator_type()
        return f"TPU {accelerator}" if accelerator else "TPU"
    gpus = cuda_devices()
    if gpus:
        counted = f"{len(gpus)}× " if len(gpus) > 1 else ""
        return f"CUDA {counted}{gpus[0]}"
    return f"CPU {os.cpu_count()} cores ({platform.machine()})"

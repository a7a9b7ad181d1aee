"""A running job's system metrics: a thread of the job's process samples the host, the TPU or
the GPU every TRAINDECK_SYSTEM_METRICS_INTERVAL seconds and hands the values to the job's
telemetry writer as `sys/…` metric points (db/telemetry.py lists the names).

It never touches the training's tensors: the host's figures come from psutil, a TPU's from
libtpu's runtime metrics service (gRPC, through the `tpu-info` package: `xm.get_memory_info`
refuses SPMD's virtual device), a GPU's from the CUDA caching allocator's counters and NVML.
None of them makes an XLA device compute or copy, so sampling adds no device sync (checked on
XLA's CPU backend by tests/worker/test_system_metrics.py).

A point's step is the whole seconds since the job was submitted, so the samples of every
attempt of a job line up on one time axis and never clash (a job resumed elsewhere continues
the axis); two samples of one process are at least one second apart (the interval is ≥ 1 s).
A source that fails says so once in the job's log, and the others go on.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from common import config
from db.telemetry import SYS, MetricPoint

log = logging.getLogger(__name__)

MIB = 2**20
GIB = 2**30
STOP_TIMEOUT_S = 5.0


class Writer(Protocol):
    def add_points(self, points: list[MetricPoint]) -> None: ...


class Source(Protocol):
    """One kind of figures: `read` returns (name without `sys/`, value) pairs."""

    def read(self) -> list[tuple[str, float]]: ...


# --- the host -------------------------------------------------------------------------------


class HostSource:
    """The host's CPU and disk reads, the job process's CPU and resident memory, and the CPU of
    its child processes (fastai's DataLoader workers). A process's CPU is in % of one core (a
    process busy on 4 cores shows 400), the host's in % of all its cores."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._process = psutil.Process()
        # psutil's CPU percentages count from the previous call: these calls start the count.
        psutil.cpu_percent(None)
        self._process.cpu_percent(None)
        self._children: dict[int, Any] = {}
        self._disk = self._disk_read_bytes()
        self._disk_at = time.monotonic()

    def read(self) -> list[tuple[str, float]]:
        values = [
            ("cpu_pct", self._psutil.cpu_percent(None)),
            ("process_cpu_pct", self._process.cpu_percent(None)),
            ("loader_cpu_pct", self._children_cpu_pct()),
            ("rss_mb", self._process.memory_info().rss / MIB),
        ]
        disk, now = self._disk_read_bytes(), time.monotonic()
        if disk is not None and self._disk is not None and now > self._disk_at:
            values.append(
                ("disk_read_mb_s", max(0, disk - self._disk) / MIB / (now - self._disk_at))
            )
        self._disk, self._disk_at = disk, now
        return values

    def _children_cpu_pct(self) -> float:
        """The CPU of the job process's descendants since the previous sample; one that
        appeared since then starts counting now (psutil counts from its first call)."""
        psutil = self._psutil
        total = 0.0
        alive: dict[int, Any] = {}
        for child in self._process.children(recursive=True):
            known = self._children.get(child.pid, child)
            try:
                percent = known.cpu_percent(None)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if child.pid in self._children:
                total += percent
            alive[child.pid] = known
        self._children = alive
        return total

    def _disk_read_bytes(self) -> int | None:
        try:
            counters = self._psutil.disk_io_counters()
        except (OSError, RuntimeError):
            return None
        return None if counters is None else int(counters.read_bytes)


# --- TPU ------------------------------------------------------------------------------------


def xla_runtime_started() -> bool:
    """Whether this process has started torch_xla's runtime (libtpu serves its metrics from
    then on). Never imports torch_xla: the training does, when it opens the device."""
    torch_xla = sys.modules.get("torch_xla")
    if torch_xla is None:
        return False
    try:
        return bool(torch_xla._XLAC._xla_runtime_is_initialized())
    except AttributeError:
        return True  # another torch_xla: ask the service, which says whether it is there


class TpuSource:
    """Each TPU chip's TensorCore duty cycle and HBM used and total, from libtpu's runtime
    metrics service through tpu-info's client (`tpu_info.metrics.get_chip_usage`).

    tpu-info reports HBM per device (a TensorCore: two per chip on v2 and v3) and the duty
    cycle per chip; the names here are per chip: `tpuN/duty_cycle_pct`, `tpuN/hbm_used_gib`,
    `tpuN/hbm_total_gib`. Until the job's XLA runtime has started (`ready`) nothing is asked.
    When the service does not answer, the job's log says so once and no TPU point is stored;
    if it answers later, the log says that once too.
    """

    def __init__(
        self, address: str, chip: Any, ready: Callable[[], bool] = xla_runtime_started
    ) -> None:
        self.address = address
        self.chip = chip  # a tpu_info.device.TpuChip
        self._ready = ready
        self._unavailable_said = False
        self._answering = False

    @classmethod
    def on_this_machine(cls, address: str) -> TpuSource | None:
        """For the chips this machine has (tpu-info reads them from the PCI bus), or None."""
        from tpu_info import device

        try:
            chip, _count = device.get_local_chips()
        except (OSError, AssertionError, ValueError) as exc:
            log.info("system metrics: could not tell this machine's TPU chips (%s): no TPU "
                     "metrics are sampled", exc)  # fmt: skip
            return None
        if chip is None:
            log.info("system metrics: tpu-info finds no TPU chip on this machine's PCI bus: no "
                     "TPU metrics are sampled")  # fmt: skip
            return None
        return cls(address, chip)

    def read(self) -> list[tuple[str, float]]:
        if not self._ready():
            return []
        import grpc
        from tpu_info import metrics

        try:
            usages = metrics.get_chip_usage(self.chip, addr=self.address)
        except (grpc.RpcError, AssertionError) as exc:
            if not self._unavailable_said:
                self._unavailable_said = True
                self._answering = False
                log.warning(
                    "system metrics: libtpu's runtime metrics service at %s does not answer "
                    "(%s): no TPU duty cycle or HBM is stored while it does not",
                    self.address,
                    _rpc_problem(exc),
                )
            return []
        if not self._answering:
            self._answering = True
            if self._unavailable_said:
                log.info("system metrics: libtpu's runtime metrics service at %s answers now",
                         self.address)  # fmt: skip
        return chip_values(usages, self.chip.value.devices_per_chip)


def chip_values(usages: list[Any], devices_per_chip: int) -> list[tuple[str, float]]:
    """tpu-info's per-device `Usage` rows as per-chip values (a chip's devices' HBM added)."""
    chips: dict[int, dict[str, float]] = {}
    for usage in usages:
        chip = chips.setdefault(
            usage.device_id // devices_per_chip,
            {"duty_cycle_pct": float(usage.duty_cycle_pct), "hbm_used": 0.0, "hbm_total": 0.0},
        )
        chip["hbm_used"] += usage.memory_usage
        chip["hbm_total"] += usage.total_memory
    values = []
    for index, chip in sorted(chips.items()):
        values += [
            (f"tpu{index}/duty_cycle_pct", chip["duty_cycle_pct"]),
            (f"tpu{index}/hbm_used_gib", chip["hbm_used"] / GIB),
            (f"tpu{index}/hbm_total_gib", chip["hbm_total"] / GIB),
        ]
    return values


def _rpc_problem(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    if callable(code):
        details = exc.details() if callable(getattr(exc, "details", None)) else ""  # type: ignore[attr-defined]
        return f"{code().name}: {details}".rstrip(": ")
    return str(exc) or type(exc).__name__


# --- CUDA -----------------------------------------------------------------------------------


class CudaSource:
    """The job's GPU: memory allocated and reserved by PyTorch's caching allocator (counters
    kept on the host: no device sync) and the GPU's utilisation from NVML. Nothing is read
    before the training has initialised CUDA, so the sampler never creates a CUDA context."""

    def __init__(
        self,
        initialized: Callable[[], bool] | None = None,
        device: Callable[[], int] | None = None,
        allocated: Callable[[int], int] | None = None,
        reserved: Callable[[int], int] | None = None,
        utilization: Callable[[int], int] | None = None,
    ) -> None:
        import torch

        cuda = torch.cuda
        self._initialized = initialized or cuda.is_initialized
        self._device = device or cuda.current_device
        self._allocated = allocated or cuda.memory_allocated
        self._reserved = reserved or cuda.memory_reserved
        self._utilization = utilization or cuda.utilization
        self._nvml_said = False

    def read(self) -> list[tuple[str, float]]:
        if not self._initialized():
            return []
        index = self._device()
        values = [
            (f"cuda{index}/allocated_mb", self._allocated(index) / MIB),
            (f"cuda{index}/reserved_mb", self._reserved(index) / MIB),
        ]
        if not self._nvml_said:
            try:
                values.append((f"cuda{index}/util_pct", float(self._utilization(index))))
            except Exception as exc:  # NVML missing or refusing: said once, memory goes on
                self._nvml_said = True
                log.warning("system metrics: no GPU utilisation from NVML (%s)", exc)
        return values


# --- the sampler ----------------------------------------------------------------------------


class SystemSampler:
    """Every `interval_s` seconds, one point per value of every source, handed to `writer`.

    `wait(seconds)` waits between samples and returns True when the sampler is to stop (by
    default a wait on the stop event); `clock` gives the time (time.time). Tests inject both
    to drive the samples one by one.
    """

    def __init__(
        self,
        writer: Writer,
        origin: float,
        sources: list[Source],
        interval_s: float,
        *,
        clock: Callable[[], float] = time.time,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        self.writer = writer
        self.origin = origin
        self.sources = sources
        self.interval_s = interval_s
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self._last_step = -1
        self._failed: set[int] = set()
        self._thread: threading.Thread | None = None

    def start(self) -> SystemSampler:
        self._thread = threading.Thread(target=self.run, name="system-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self) -> None:
        while not self._wait(self.interval_s):
            self.sample()

    def sample(self) -> list[MetricPoint]:
        """Read every source once and hand the points to the writer; returns them."""
        values: list[tuple[str, float]] = []
        for number, source in enumerate(self.sources):
            try:
                values += source.read()
            except Exception as exc:  # one source's failure never stops the others
                if number not in self._failed:
                    self._failed.add(number)
                    log.warning("system metrics: reading %s failed: %s",
                                type(source).__name__, exc)  # fmt: skip
        now = self._clock()
        step = max(int(now - self.origin), self._last_step + 1)
        self._last_step = step
        points = [MetricPoint(SYS + name, step, float(value), None, now) for name, value in values]
        if points:
            self.writer.add_points(points)
        return points


def sources_for(device_kind: str) -> list[Source]:
    """What a job on `device_kind` ("xla", "cuda" or "cpu") samples on this machine."""
    from worker.devices import tpu_present

    sources: list[Source] = [HostSource()]
    if device_kind == "xla" and tpu_present():
        tpu = TpuSource.on_this_machine(config.tpu_metrics_address())
        if tpu is not None:
            sources.append(tpu)
    if device_kind == "cuda":
        sources.append(CudaSource())
    return sources


def start_for_job(writer: Writer, submitted_at: datetime, device_kind: str) -> SystemSampler | None:
    """The sampler of a job submitted at `submitted_at`, started; None when the setting is 0."""
    interval = config.system_metrics_interval_s()
    if interval <= 0:
        return None
    sampler = SystemSampler(writer, submitted_at.timestamp(), sources_for(device_kind), interval)
    return sampler.start()

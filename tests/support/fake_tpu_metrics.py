"""A local fake of libtpu's runtime metrics service, for tests: a real gRPC server on a loopback
port implementing `RuntimeMetricService` from tpu-info's own proto
(`tpu_info.proto.tpu_metric_service_pb2_grpc`), so the real `tpu_info.metrics` client talks to
it exactly as it talks to libtpu on a TPU VM (port 8431, gRPC local credentials).

It answers `GetRuntimeMetric` for the metrics tpu-info's usage table asks for, with libtpu's
shapes: `tpu.runtime.hbm.memory.total.bytes` and `tpu.runtime.hbm.memory.usage.bytes` one
gauge (as_int) per device, `tpu.runtime.tensorcore.dutycycle.percent` one gauge (as_double)
per chip, each labelled with its index in `attribute.value.int_attr`. Any other metric answers
NOT_FOUND, as libtpu does for a name it does not serve. Tests steer it through `chips` (each
chip's duty cycle and its devices' HBM) and read `requests` (the metric names asked for).

    with serve_tpu_metrics([FakeChip(87.5, [(4 * GIB, 32 * GIB)])]) as fake:
        tpu_info.metrics.get_chip_usage(TpuChip.V4, addr=fake.address)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from tpu_info.metrics import MetricName
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

GIB = 2**30


@dataclass
class FakeChip:
    duty_cycle_pct: float
    devices: list[tuple[int, int]]  # (HBM used, HBM total) in bytes, one per device of the chip


class FakeRuntimeMetricService(pb_grpc.RuntimeMetricServiceServicer):
    def __init__(self, chips: list[FakeChip]) -> None:
        self.chips = chips
        self.requests: list[str] = []
        self._lock = threading.Lock()

    def GetRuntimeMetric(self, request: pb.MetricRequest, context: grpc.ServicerContext):
        with self._lock:
            self.requests.append(request.metric_name)
            chips = list(self.chips)
        devices = [device for chip in chips for device in chip.devices]
        if request.metric_name == MetricName.TOTAL_MEMORY.value:
            gauges = [pb.Gauge(as_int=total) for _, total in devices]
        elif request.metric_name == MetricName.MEMORY_USAGE.value:
            gauges = [pb.Gauge(as_int=used) for used, _ in devices]
        elif request.metric_name == MetricName.DUTY_CYCLE_PCT.value:
            gauges = [pb.Gauge(as_double=chip.duty_cycle_pct) for chip in chips]
        else:
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name} not found")
        metrics = [
            pb.Metric(
                attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=index)),
                gauge=gauge,
            )
            for index, gauge in enumerate(gauges)
        ]
        return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name, metrics=metrics))


@dataclass
class FakeTpuMetrics:
    address: str
    service: FakeRuntimeMetricService

    @property
    def requests(self) -> list[str]:
        return self.service.requests


@contextmanager
def serve_tpu_metrics(chips: list[FakeChip], port: int = 0) -> Iterator[FakeTpuMetrics]:
    """The fake service on 127.0.0.1 at `port` (0: a free one), with gRPC's local credentials
    (what tpu-info's client uses), for the duration of the `with`."""
    service = FakeRuntimeMetricService(chips)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_RuntimeMetricServiceServicer_to_server(service, server)
    port = server.add_secure_port(f"127.0.0.1:{port}", grpc.local_server_credentials())
    server.start()
    try:
        yield FakeTpuMetrics(f"127.0.0.1:{port}", service)
    finally:
        server.stop(grace=None).wait()


def free_address() -> str:
    """A loopback address where nothing listens (for "no service answers")."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"

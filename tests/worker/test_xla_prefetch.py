"""The prefetch thread and the XLA training thread share nothing half-made (PJRT_DEVICE=CPU).

The training thread's `torch_xla.sync()` takes every live XLA tensor into its graph, from any
thread. A batch copied with `tensor.to(device)` is first an empty tensor (a pending zeros
computation) and then gets its data: a sync in between made the batch all zeros, an extra graph
output, or a buffer given up to the graph ("buffer ... is deleted" at the next step). When that
happens depends on thread timing, so these tests check the invariant that rules it out instead:
the prefetch thread's placement runs no XLA operation at all, only creates tensors around data
already on the device, and the training thread still gets fastai's types and the right values.
"""

from __future__ import annotations

import json

import pytest

from tests.support.workers import run_python

pytestmark = [pytest.mark.slow, pytest.mark.xla]

PLACE_AND_PREFETCH = """
import json
import torch, torch_xla
import torch_xla.debug.metrics as met
from fastai.data.core import TfmdDL
from fastai.torch_core import TensorCategory, TensorImage
from worker import spmd
from worker.prefetch import DevicePrefetcher

device = torch_xla.device()
place = spmd.placement(device, None)  # what build_learner gives the prefetch thread

def xla_operations():
    return {name: met.counter_value(name) for name in met.counter_names()
            if name.startswith("xla::")}

images = TensorImage(torch.arange(8 * 3 * 4 * 4, dtype=torch.uint8).reshape(8, 3, 4, 4))
labels = TensorCategory(torch.arange(8) % 3)
before = xla_operations()
placed = place((images, labels))
after = xla_operations()

items = [(TensorImage(images[i]), TensorCategory(labels[i])) for i in range(8)]
yielded = list(DevicePrefetcher(TfmdDL(items, bs=4), place))
print(json.dumps({
    "operations": {name: count - before.get(name, 0) for name, count in after.items()
                   if count != before.get(name, 0)},
    "placed": [[type(t).__name__, t.device.type] for t in placed],
    "yielded": [[type(t).__name__ for t in batch] + [batch[0].device.type] for batch in yielded],
    "values": [torch.equal(yielded[0][0].cpu(), images[:4]),
               torch.equal(yielded[1][0].cpu(), images[4:]),
               torch.equal(torch.cat([y.cpu() for _, y in yielded]), labels)],
}))
"""


@pytest.fixture(scope="module")
def report() -> dict:
    output = run_python(PLACE_AND_PREFETCH, PJRT_DEVICE="CPU")
    return json.loads(output.splitlines()[-1])


def test_the_prefetch_threads_placement_runs_no_xla_operation(report):
    """`tensor.to(device)` runs xla::empty_symint, _to_copy and _copy_from (a pending tensor
    that a sync on the training thread can catch); xm.send_cpu_data_to_device runs none."""
    assert report["operations"] == {}
    assert report["placed"] == [["Tensor", "xla"], ["Tensor", "xla"]]


def test_the_training_thread_gets_fastais_types_and_the_host_values(report):
    assert report["yielded"] == [["TensorImage", "TensorCategory", "xla"]] * 2
    assert report["values"] == [True, True, True]

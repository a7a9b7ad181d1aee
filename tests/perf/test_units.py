"""Fast tests of the data-parallel and prefetch parts, on the CPU (no XLA runtime needed)."""

from __future__ import annotations

import copy
import pickle
import threading

import pytest
import torch
from fastai.callback.core import Callback
from fastai.torch_core import set_seed, to_device

from datasets.labelling import scan_items
from db.spec import JobSpec
from tests.support.workers import digits_subset
from worker import spmd, xla_report
from worker.data import build_dataloaders, loader_workers, usable_cpus
from worker.prefetch import DevicePrefetcher, PrefetchCallback
from worker.training import build_learner

CPU = torch.device("cpu")


def _dls(data_dir, per_class: int = 12, bs: int = 16, augment: bool = False):
    items = scan_items(digits_subset(data_dir, per_class), {"type": "folder"})
    spec = JobSpec(bs=bs, img_size=8, augment=augment, device="cpu")
    return build_dataloaders(items, spec, CPU)


def _prefetch_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "traindeck-prefetch"]


def _on_cpu(batch):
    return to_device(batch, CPU)


# --- devices and batch split ----------------------------------------------------------------


def test_cores_default_to_every_device_and_one_or_all_are_accepted():
    assert spmd.devices_to_use(None, 8, "TPU") == 8
    assert spmd.devices_to_use(8, 8, "TPU") == 8
    assert spmd.devices_to_use(1, 8, "TPU") == 1


def test_more_cores_than_the_worker_has_or_a_partial_mesh_is_refused_with_a_reason():
    with pytest.raises(spmd.DeviceRequestError, match=r"cores 16: this worker has 8 XLA TPU"):
        spmd.devices_to_use(16, 8, "TPU")
    with pytest.raises(spmd.DeviceRequestError, match="use cores 1 or 8, or leave it empty"):
        spmd.devices_to_use(4, 8, "TPU")
    with pytest.raises(spmd.DeviceRequestError, match="has 1 XLA CPU device; use cores 1"):
        spmd.devices_to_use(2, 1, "CPU")


def test_the_global_batch_is_divided_over_the_devices_or_refused_with_multiples_to_use():
    assert spmd.per_device_batch_size(64, 8) == 8
    assert spmd.per_device_batch_size(64, 1) == 64
    with pytest.raises(spmd.DeviceRequestError) as refused:
        spmd.per_device_batch_size(30, 4)
    assert str(refused.value) == (
        "batch size 30 cannot be split evenly over 4 XLA devices: the global batch is divided "
        "among them, so use a multiple of 4 (e.g. 28 or 32)"
    )
    with pytest.raises(spmd.DeviceRequestError, match=r"\(e\.g\. 8\)"):
        spmd.per_device_batch_size(3, 8)


def test_cores_narrow_the_cpu_backends_virtual_devices_before_the_runtime_starts(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "4")
    spmd.narrow_cpu_devices(2)
    assert spmd.os.environ["CPU_NUM_DEVICES"] == "2"
    spmd.narrow_cpu_devices(8)  # more than offered: left for the refusal with the count
    assert spmd.os.environ["CPU_NUM_DEVICES"] == "2"
    spmd.narrow_cpu_devices(None)
    assert spmd.os.environ["CPU_NUM_DEVICES"] == "2"
    monkeypatch.setenv("CPU_NUM_DEVICES", "two")
    with pytest.raises(spmd.DeviceRequestError, match="CPU_NUM_DEVICES='two' on this worker"):
        spmd.narrow_cpu_devices(2)
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    spmd.narrow_cpu_devices(2)  # a TPU's devices are not narrowed this way
    assert spmd.os.environ["CPU_NUM_DEVICES"] == "two"


def test_loader_workers_follow_the_cpus_this_process_may_use():
    assert loader_workers(1_000, cpus=96) == 0  # small sets load in the prefetch thread
    assert loader_workers(50_000, cpus=2) == 1
    assert loader_workers(50_000, cpus=8) == 7
    assert loader_workers(50_000, cpus=96) == 16
    assert loader_workers(50_000, cpus=1) == 0
    assert loader_workers(50_000) == loader_workers(50_000, cpus=usable_cpus())


def test_the_worker_s_setting_chooses_the_loader_workers(monkeypatch):
    monkeypatch.setenv("TRAINDECK_LOADER_WORKERS", "3")
    assert loader_workers(1_000, cpus=96) == 3  # a small set too, when the person says so
    monkeypatch.setenv("TRAINDECK_LOADER_WORKERS", "0")
    assert loader_workers(50_000, cpus=8) == 0


# --- the prefetcher -------------------------------------------------------------------------


def test_prefetched_validation_batches_equal_fastais_own(data_dir):
    dls = _dls(data_dir)
    plain = list(dls.valid)
    prefetched = list(DevicePrefetcher(dls.valid, _on_cpu))

    assert len(prefetched) == len(plain) == len(dls.valid)
    for (x_plain, y_plain), (x_pre, y_pre) in zip(plain, prefetched, strict=True):
        assert type(x_pre) is type(x_plain) and type(y_pre) is type(y_plain)
        assert x_pre.dtype == torch.float32, "the batch transforms ran (to float, normalise)"
        assert torch.equal(x_pre, x_plain) and torch.equal(y_pre, y_plain)
    assert not _prefetch_threads()


def test_prefetched_training_passes_reshuffle_and_drop_the_partial_batch(data_dir):
    dls = _dls(data_dir)  # 96 training images, bs 16
    prefetcher = DevicePrefetcher(dls.train, _on_cpu)
    first = torch.cat([y for _, y in prefetcher])
    second = torch.cat([y for _, y in prefetcher])

    assert len(first) == len(second) == len(dls.train) * 16
    assert sorted(first.tolist()) != first.tolist() or sorted(second.tolist()) != second.tolist()
    assert not torch.equal(first, second), "each pass is shuffled anew"
    assert prefetcher.batches == 2 * len(dls.train)


def test_a_pass_left_early_stops_the_loading_thread(data_dir):
    dls = _dls(data_dir)
    prefetcher = DevicePrefetcher(dls.train, _on_cpu, depth=1)
    batches = iter(prefetcher)
    next(batches)
    assert _prefetch_threads()
    batches.close()  # what a CancelFitException does to fastai's loop
    assert not _prefetch_threads()


def test_a_loading_error_surfaces_in_the_training_thread(data_dir):
    dls = _dls(data_dir)

    def broken(batch):
        raise OSError("image file is truncated")

    with pytest.raises(OSError, match="image file is truncated"):
        list(DevicePrefetcher(dls.valid, broken))
    assert not _prefetch_threads()


class _SeenDataLoaders(Callback):
    order = 0  # after PrefetchCallback (-30)

    def __init__(self):
        self.seen: list[str] = []

    def before_train(self):
        self.seen.append(type(self.learn.dl).__name__)

    def before_validate(self):
        self.seen.append(type(self.learn.dl).__name__)


@pytest.mark.slow  # trains a model
def test_the_callback_runs_a_learners_training_and_validation_through_the_prefetcher(
    data_dir, tmp_path
):
    dls = _dls(data_dir, augment=True)
    set_seed(0)
    learn = build_learner(dls, JobSpec(bs=16, img_size=8, device="cpu"), CPU, tmp_path)
    prefetch = PrefetchCallback(_on_cpu)
    seen = _SeenDataLoaders()
    learn.add_cbs([prefetch, seen])

    learn.fit(2, 1e-3)

    assert seen.seen == ["DevicePrefetcher"] * 4
    assert [p.batches for p in prefetch.prefetchers] == [
        len(dls.train),
        len(dls.valid),
    ] * 2
    assert len(learn.recorder.values) == 2
    assert not _prefetch_threads()


# --- the XLA report -------------------------------------------------------------------------


def test_a_cache_that_cannot_load_its_graphs_is_reported_once():
    first = {"persistent_cache_load_failures": 0}
    failed = {"persistent_cache_load_failures": 7}
    warning = xla_report.cache_load_failure_warning(first, failed, "/data/xla_cache")
    assert warning.startswith(
        "the XLA compilation cache in /data/xla_cache holds 7 graph(s) of this job that this "
        "XLA backend could not load"
    )
    assert "cannot load cached executables: pytorch/xla#9094" in warning  # on a TPU neither
    assert xla_report.cache_load_failure_warning(failed, failed | {"x": 1}, "c") is None
    assert xla_report.cache_load_failure_warning(None, first, "c") is None


# --- batch norm that SPMD can split ---------------------------------------------------------


@pytest.mark.parametrize("shape", [(16, 4, 5, 5), (16, 6)])
def test_partitionable_batch_norm_computes_what_batch_norm_computes(shape):
    torch.manual_seed(0)
    layer = torch.nn.BatchNorm2d(shape[1]) if len(shape) == 4 else torch.nn.BatchNorm1d(shape[1])
    twin = copy.deepcopy(layer)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.5, 0.5)
        twin.load_state_dict(layer.state_dict())
    inputs = torch.randn(*shape) * 3 + 1
    for _ in range(3):  # the running estimates after several updates too
        expected = layer(inputs)
        got = spmd.partitionable_batch_norm(twin, inputs)
    torch.testing.assert_close(got, expected)
    for name, value in layer.state_dict().items():
        torch.testing.assert_close(twin.state_dict()[name], value, msg=name)
    expected.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(twin.weight.grad, layer.weight.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(twin.bias.grad, layer.bias.grad, rtol=1e-4, atol=1e-4)

    layer.eval()
    twin.eval()
    torch.testing.assert_close(spmd.partitionable_batch_norm(twin, inputs), layer(inputs))


@pytest.mark.slow  # trains a model
def test_the_batch_norm_callback_leaves_plain_layers_behind_for_the_export(data_dir, tmp_path):
    dls = _dls(data_dir)
    learn = build_learner(dls, JobSpec(bs=16, img_size=8, device="cpu"), CPU, tmp_path)
    callback = spmd.PartitionableBatchNormCallback()
    seen = []

    class Check(Callback):
        def after_batch(self):
            seen.append(all("forward" in layer.__dict__ for layer in callback.layers))

    learn.add_cbs([callback, Check()])
    learn.fit(1, 1e-3)

    assert seen and all(seen), "every batch-norm layer computed the partitionable way"
    layers = [m for m in learn.model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert layers and not any("forward" in layer.__dict__ for layer in layers)
    assert b"worker" not in pickle.dumps(learn.model)

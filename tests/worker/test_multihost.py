"""One job across the processes of one XLA runtime (`worker.multihost`): what runs here.

torch_xla's CPU backend runs one process only, so a runtime of several processes cannot be
formed on this machine. These tests check each process's share of the data with explicit
(index, count) arguments, through fastai's own loader too, and, with a real runtime of one
process on XLA's CPU backend, the minibatch placement, a fit on the share's loader and the
distributed checkpoint written to the Cloud Storage emulator and read back into a fresh Learner.
Training across several processes is not tested here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from datasets.labelling import scan_items
from db.spec import JobSpec
from tests.support.browser import free_port
from tests.support.workers import REPO, digits_subset, worker_env
from worker.multihost import (
    Processes,
    ProcessShare,
    ShareError,
    check_shareable,
    join_tensors,
    pass_order,
    share_batch_size,
    share_of,
    share_training,
    split_tensors,
)
from worker.spmd import DataParallel


@pytest.mark.parametrize(("items", "count"), [(40, 4), (37, 4), (10, 3), (8, 8), (5, 1)])
def test_the_shares_hold_each_item_once_and_are_equal(items: int, count: int) -> None:
    order = pass_order(items, seed=7, pass_number=0)
    shares = [share_of(order, index, count) for index in range(count)]
    assert {len(share) for share in shares} == {items // count}
    seen = np.concatenate(shares).tolist()
    assert len(seen) == len(set(seen)), "an item in two shares"
    # Every item once; only the tail of the order that cannot be shared evenly (fewer than
    # `count` items) waits for another pass, as DistributedSampler(drop_last=True) leaves it.
    assert sorted(seen) == sorted(order[: items // count * count].tolist())
    assert items - len(seen) < count


def test_the_shares_of_each_batch_are_the_one_process_batch() -> None:
    items, bs, count = 50, 12, 4
    order = pass_order(items, seed=3, pass_number=2)
    local = share_batch_size(bs, count)
    shares = [share_of(order, index, count) for index in range(count)]
    batches = items // bs  # a one-process loader's full batches (drop_last)
    assert {len(share) // local for share in shares} == {batches}
    for batch in range(batches):
        rows = np.concatenate([share[batch * local : (batch + 1) * local] for share in shares])
        assert sorted(rows.tolist()) == sorted(order[batch * bs : (batch + 1) * bs].tolist())


def test_every_process_draws_the_same_order_and_a_new_one_each_pass() -> None:
    first, last = ProcessShare(30, 0, 3, seed=5), ProcessShare(30, 2, 3, seed=5)
    pass_0 = first()
    assert pass_0 == share_of(pass_order(30, 5, 0), 0, 3).tolist()
    assert set(pass_0).isdisjoint(last())
    assert first() != pass_0
    assert first.passes == 2 and last.passes == 1


def test_what_the_processes_cannot_share_is_refused() -> None:
    assert share_batch_size(32, 4) == 8
    with pytest.raises(ShareError, match=r"batch size 30 cannot be shared evenly by the 4 "):
        share_batch_size(30, 4)
    with pytest.raises(ShareError, match=r"multiple of 4 \(e\.g\. 28 or 32\)"):
        share_batch_size(30, 4)
    with pytest.raises(ShareError, match=r"multiple of 4 \(e\.g\. 4\)"):
        share_batch_size(2, 4)
    with pytest.raises(ValueError, match="process index 4 is not one of 4"):
        share_of(np.arange(8), 4, 4)
    spec = JobSpec(bs=32, cores=1)
    with pytest.raises(ShareError, match="cores 1: a job across the 4 processes"):
        check_shareable(spec, None, 4, shared_store=True)
    parallel = DataParallel(devices=16, device=torch.device("cpu"), mesh=None)
    with pytest.raises(ShareError, match="set TRAINDECK_STORE to a gs:// bucket"):
        check_shareable(JobSpec(bs=32), parallel, 4, shared_store=False)
    check_shareable(JobSpec(bs=32), parallel, 4, shared_store=True)


def test_a_checkpoint_state_splits_into_tensors_and_joins_again() -> None:
    weight = torch.arange(6.0).reshape(2, 3)
    state = {
        "model": {"fc.weight": weight, "fc.bias": torch.zeros(2)},
        "optimizer": {"state": [{"grad_avg": torch.ones(3), "step": 4}], "hypers": [{"lr": 0.1}]},
        "epoch": 2,
        "spec": {"bs": 8, "name": None},
        "classes": ["a", "b"],
        "tracker": {"best_model": {"fc.weight": weight * 2}, "pair": (1, 2)},
    }
    tensors = split_tensors(state)
    assert all(isinstance(value, torch.Tensor) for value in tensors.values())
    assert len(tensors) == 5  # four tensors and the skeleton
    joined = join_tensors(tensors)
    assert torch.equal(joined["model"]["fc.weight"], weight)
    assert torch.equal(joined["tracker"]["best_model"]["fc.weight"], weight * 2)
    assert joined["optimizer"]["state"][0]["step"] == 4
    assert torch.equal(joined["optimizer"]["state"][0]["grad_avg"], torch.ones(3))
    assert {key: joined[key] for key in ("epoch", "spec", "classes")} == {
        "epoch": 2,
        "spec": {"bs": 8, "name": None},
        "classes": ["a", "b"],
    }
    assert joined["tracker"]["pair"] == (1, 2)


def test_each_process_loads_its_share_through_fastais_loader(tmp_path) -> None:
    """fastai's TfmdDL (on the CPU) with each process's share: as the prefetcher copies it per
    pass, it yields bs / count images a batch, the share's items in the share's order, and
    the shares of one pass together hold each training item once."""
    from worker.data import build_dataloaders

    items = scan_items(digits_subset(tmp_path, 5), {"type": "folder"})
    spec = JobSpec(bs=8, img_size=16)
    count = 2
    loaded: list[int] = []
    for index in range(count):
        dls = share_training(
            build_dataloaders(items, spec, torch.device("cpu")), spec, Processes(index, count)
        )
        train = dls.train
        training_items = len(train.dataset)
        assert (train.bs, len(train)) == (4, training_items // 8)
        host = train.new(device=None, after_batch=None)  # what the prefetcher iterates
        labels = torch.cat([y for _x, y in host])
        assert all(x.shape[0] == 4 for x, _y in train.new(device=None, after_batch=None))
        expected = share_of(pass_order(training_items, spec.seed, 0), index, count)
        expected = expected[: len(train) * 4]
        assert labels.tolist() == [int(train.dataset[i][1]) for i in expected]
        loaded.extend(expected.tolist())
    assert len(loaded) == len(set(loaded)) == training_items // 8 * 8


@pytest.mark.slow
@pytest.mark.xla
def test_minibatch_placement_and_distributed_checkpoint_on_a_runtime_of_one_process(
    data_dir, gcs
) -> None:
    """A real XLA runtime of one process with two CPU devices, its gloo group by `xla://`: a
    share placed as a minibatch; a fit on the share's loader; CheckpointManager's checkpoint
    of the trained Learner written to the Cloud Storage emulator and read back, by a new
    manager as a resumed attempt does, into a fresh Learner."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.worker.multihost_probe", str(data_dir)],
        cwd=REPO,
        env=worker_env(PJRT_DEVICE="CPU", CPU_NUM_DEVICES="2", MASTER_PORT=str(free_port())),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])

    placement = figures["placement"]
    assert placement["shapes"] == [[4, 3, 4, 4], [4, 3, 4, 4]]
    assert placement["global_shape"] == [8, 3, 4, 4] and placement["values_kept"]
    assert "per-host batch size must be divisible" in placement["uneven_refused"]
    assert figures["from_process_0"] == {"pruned_at": 3}

    fit = figures["fit"]
    assert fit["prefetchers"] == ["SharedBatchPrefetch"]
    assert fit["local_bs"] == 8  # one process: its share is the whole batch
    assert fit["batches"] and set(fit["batches"]) == {8}

    saved = figures["checkpoint"]
    assert saved["where"].startswith("gs://traindeck-test/td/jobs/7/checkpoints/distributed/")
    stored = saved["stored"]
    prefix = "jobs/7/checkpoints/distributed/0/"
    assert f"{prefix}.metadata" in stored and f"{prefix}.manager_metadata" in stored
    assert any(key.startswith(prefix) and key.endswith(".distcp") for key in stored)
    assert saved["differed_before"], "the fresh Learner started with the trained weights"
    assert saved["model_equal"] and saved["optimizer_equal"]
    assert saved["optimizer_tensors"] > 0, "no optimizer state was compared"
    assert (saved["epoch"], saved["lr"], saved["spec_equal"]) == (0, 1e-3, True)
    assert saved["tracker"]["best"] == 0.25
    assert saved["classes"] == [str(label) for label in range(10)]
    # Shared, the loaders' pickle names worker.multihost; the export, made after
    # unshare_training, does not (it must load where the worker's code is absent).
    assert figures["export"] == {
        "shared_names_multihost": True,
        "train_bs": 8,
        "names_multihost": False,
    }

"""The XLA augmentation (`worker.augment`): fastai's aug_transforms, computed the same way, with
the same probabilities, and run whole by XLA (the last test, on XLA's CPU backend)."""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest
import torch
from fastai.torch_core import TensorCategory, TensorImage, set_seed, to_device
from fastai.vision.augment import (
    Brightness,
    Contrast,
    Flip,
    Rotate,
    Warp,
    Zoom,
    aug_transforms,
    setup_aug_tfms,
)
from fasttransform.transform import DisplayedTransform, Transform
from scipy import stats

from datasets.labelling import scan_items
from db.spec import JobSpec
from tests.support.workers import digits_subset, run_python
from worker.augment import Draws, XlaAugment, augment_batch, parameter_array
from worker.data import augmentation, build_dataloaders
from worker.prefetch import DevicePrefetcher

CPU = torch.device("cpu")
DRAWS = 4000  # images per distribution


def _fixed_batch(n: int, height: int = 16, width: int = 16) -> torch.Tensor:
    """n copies of one asymmetric image in [0, 1]: a bright bar on the left, a ramp, noise."""
    generator = torch.Generator().manual_seed(0)
    image = torch.rand(3, height, width, generator=generator) * 0.3 + 0.2
    image[:, 2 : height - 2, 1:4] = 0.95
    image[0] += torch.linspace(0, 0.1, width)
    return image.expand(n, -1, -1, -1).contiguous()


def _fastai(x: torch.Tensor, tfms: list) -> torch.Tensor:
    out = TensorImage(x.clone())
    for tfm in tfms:
        out = tfm(out, split_idx=0)
    return out.as_subclass(torch.Tensor)


def _ours(x: torch.Tensor, augment: XlaAugment) -> torch.Tensor:
    return augment(TensorImage(x.clone()), split_idx=0).as_subclass(torch.Tensor)


def test_with_the_same_random_numbers_it_computes_what_fastais_aug_transforms_compute():
    """Flip, perspective warp, rotation, zoom about a centre, brightness and contrast, given the
    same draws: fastai's own transforms (fed the draws) and ours agree pixel for pixel, on a
    non-square batch (fastai's aspect correction) and with reflection at the borders."""
    n, height, width = 12, 16, 20
    rng = np.random.default_rng(1)
    flip = rng.integers(0, 2, n).astype(float)
    rotate, zoom = rng.uniform(-10, 10, n), rng.uniform(1, 1.1, n)
    col, row = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
    warp_x, warp_y = rng.uniform(-0.2, 0.2, n), rng.uniform(-0.2, 0.2, n)
    brightness = rng.uniform(0.4, 0.6, n)
    contrast = np.exp(rng.uniform(np.log(0.8), -np.log(0.8), n))
    listed = [list(map(float, values)) for values in (flip, rotate, zoom, col, row, warp_x, warp_y)]
    size = (height, width)
    fastai_tfms = setup_aug_tfms(
        [
            Flip(p=1.0, draw=listed[0], size=size),
            Warp(p=1.0, draw_x=listed[5], draw_y=listed[6], size=size),
            Rotate(p=1.0, draw=listed[1], size=size),
            Zoom(p=1.0, draw=listed[2], draw_x=listed[3], draw_y=listed[4], size=size),
            Brightness(p=1.0, draw=list(map(float, brightness))),
            Contrast(p=1.0, draw=list(map(float, contrast))),
        ]
    )
    x = torch.rand(n, 3, height, width, generator=torch.Generator().manual_seed(2))
    draws = Draws(
        flip=flip, rotate=rotate, zoom=zoom, col=col, row=row, warp_x=warp_x, warp_y=warp_y,
        brightness=brightness, contrast=contrast,
    )  # fmt: skip
    parameters = torch.from_numpy(parameter_array(draws, height, width))

    ours = augment_batch(x.clone(), parameters, size)
    theirs = _fastai(x, fastai_tfms)

    assert ours.shape == theirs.shape == (n, 3, height, width)
    assert (ours - theirs).abs().max() < 1e-4
    assert (ours - x).abs().amax(dim=(1, 2, 3)).min() > 0.01, "every image was changed"


def test_the_random_numbers_follow_fastais_ranges_and_probabilities():
    draws = XlaAugment(16, seed=0).draw(DRAWS)
    tolerance = 4 * (0.25 * 0.75 / DRAWS) ** 0.5  # four standard deviations of a p=0.75 share

    assert abs(draws.flip.mean() - 0.5) < tolerance
    for applied, neutral in [
        (draws.rotate, 0.0), (draws.zoom, 1.0), (draws.warp_x, 0.0), (draws.warp_y, 0.0),
        (draws.brightness, 0.5), (draws.contrast, 1.0),
    ]:  # fmt: skip
        assert abs((applied != neutral).mean() - 0.75) < tolerance
    assert np.abs(draws.rotate).max() <= 10 and np.abs(draws.rotate).max() > 9.9
    assert draws.zoom.min() >= 1 and draws.zoom.max() <= 1.1
    assert np.abs(draws.warp_x).max() <= 0.2 and np.abs(draws.warp_y).max() <= 0.2
    assert draws.brightness.min() >= 0.4 and draws.brightness.max() <= 0.6
    assert draws.contrast.min() >= 0.8 - 1e-9 and draws.contrast.max() <= 1 / 0.8 + 1e-9
    assert draws.col.min() >= 0 and draws.col.max() <= 1


def test_on_a_fixed_batch_it_flips_rotates_and_relights_with_the_requested_probabilities():
    """Measured on the images it outputs, one augmentation switched on at a time."""
    x = _fixed_batch(DRAWS)
    tolerance = 4 * (0.25 / DRAWS) ** 0.5

    flips = _ours(x, XlaAugment(16, seed=1, p_affine=0, p_lighting=0))
    flipped = (flips - x.flip(-1)).abs().amax(dim=(1, 2, 3)) < 1e-5
    unchanged = (flips - x).abs().amax(dim=(1, 2, 3)) < 1e-5
    assert bool((flipped | unchanged).all()), "a flip mirrors the image, nothing else"
    assert abs(flipped.float().mean() - 0.5) < tolerance

    rotation_only = XlaAugment(16, seed=2, p_flip=0, max_zoom=1, max_warp=0, p_lighting=0)
    rotated = (_ours(x, rotation_only) - x).abs().amax(dim=(1, 2, 3)) > 1e-3
    assert abs(rotated.float().mean() - 0.75) < tolerance

    # A flat grey image of 0.5 keeps its value under contrast alone (0 in logit space): only a
    # brightness change moves it, by at most logit(0.6), which a contrast change scales.
    grey = torch.full((DRAWS, 3, 16, 16), 0.5)
    relit = _ours(grey, XlaAugment(16, seed=3, p_flip=0, p_affine=0))
    moved = (relit - 0.5).abs().amax(dim=(1, 2, 3))
    assert abs((moved > 1e-4).float().mean() - 0.75) < tolerance
    assert moved.max() <= torch.sigmoid(torch.logit(torch.tensor(0.6)) / 0.8) - 0.5 + 1e-5
    lit = _ours(x, XlaAugment(16, seed=4, p_flip=0, p_affine=0))
    changed = (lit - x).abs().amax(dim=(1, 2, 3)) > 1e-4
    assert abs(changed.float().mean() - (1 - 0.25**2)) < tolerance, "brightness or contrast"


def test_its_output_matches_fastais_aug_transforms_in_distribution():
    """The same fixed batch through fastai's eager aug_transforms (defaults) and through ours:
    per image, the mean brightness, the change from the original and the left-right balance
    (which a flip reverses) are distributed alike (two-sample Kolmogorov–Smirnov)."""
    x = _fixed_batch(DRAWS)
    set_seed(5)
    theirs = _fastai(x, aug_transforms(size=16))
    ours = _ours(x, XlaAugment(16, seed=5))

    def features(batch: torch.Tensor) -> dict[str, np.ndarray]:
        half = batch.shape[-1] // 2
        return {
            "mean": batch.mean(dim=(1, 2, 3)).numpy(),
            "change": (batch - x).abs().mean(dim=(1, 2, 3)).numpy(),
            "left_minus_right": (
                batch[..., :half].mean(dim=(1, 2, 3)) - batch[..., half:].mean(dim=(1, 2, 3))
            ).numpy(),
        }

    for name, values in features(ours).items():
        theirs_values = features(theirs)[name]
        result = stats.ks_2samp(values, theirs_values)
        assert result.pvalue > 1e-3, (name, result)


def test_validation_batches_pass_through_unchanged():
    x = TensorImage(_fixed_batch(4))
    assert XlaAugment(16, seed=0)(x, split_idx=1) is x


def test_an_xla_job_gets_it_and_the_other_devices_keep_fastais_transforms():
    spec = JobSpec(img_size=16, augment=True, seed=7)
    (on_xla,) = augmentation(spec, torch.device("xla"))
    assert isinstance(on_xla, XlaAugment) and on_xla.size == (16, 16) and on_xla.seed == 7
    for device in ("cpu", "cuda"):
        assert [type(t).__name__ for t in augmentation(spec, torch.device(device))] == [
            "Flip",
            "Brightness",
        ]  # fastai's composed affine and lighting transforms


def test_copies_keep_it_and_a_pickle_names_no_traindeck_code():
    augment = XlaAugment(16, seed=3)
    assert isinstance(copy.deepcopy(augment), XlaAugment)
    assert isinstance(copy.copy(augment), XlaAugment)
    assert copy.deepcopy(augment).draw(5).rotate.tolist() == augment.draw(5).rotate.tolist()
    pickled = pickle.dumps(augment)
    assert b"worker" not in pickled and b"traindeck" not in pickled
    restored = pickle.loads(pickled)
    assert type(restored) is Transform
    x = TensorImage(_fixed_batch(2))
    assert restored(x, split_idx=0) is x


class _LabelEcho(DisplayedTransform):
    """Gets each batch's labels from the loading thread; records whether they arrive with it."""

    split_idx, order = 0, 30

    def __init__(self):
        super().__init__()
        self.pairs: list[bool] = []
        self.made = 0

    def host_inputs(self, batch, place):
        self.made += 1
        return place(batch[1].clone())

    def receive(self, labels):
        self.labels = labels

    def encodes(self, y: TensorCategory):
        self.pairs.append(torch.equal(self.labels, y))
        return y


def test_the_prefetch_thread_makes_host_inputs_for_the_batch_they_arrive_with(data_dir):
    items = scan_items(digits_subset(data_dir, 12), {"type": "folder"})
    dls = build_dataloaders(items, JobSpec(bs=16, img_size=8, device="cpu"), CPU)
    echo = _LabelEcho()
    dls.train.after_batch.add(echo)

    batches = list(DevicePrefetcher(dls.train, lambda batch: to_device(batch, CPU)))
    assert echo.pairs == [True] * len(batches) == [True] * len(dls.train)
    list(DevicePrefetcher(dls.valid, lambda batch: to_device(batch, CPU)))
    assert echo.made == len(dls.train), "nothing is made for a pass that skips the transform"


RUN_ON_XLA = """
import json
import numpy as np, torch, torch_xla
import torch_xla.debug.metrics as met
from fastai.torch_core import TensorImage
from worker.augment import XlaAugment, augment_batch

device = torch_xla.device()
augment = XlaAugment(16, seed=0)
host = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
x = TensorImage(host).to(device)
compiles, largest_error = [], 0.0
for step in range(4):
    parameters = augment.parameters_for(8, 16, 16)
    augment.receive(torch.from_numpy(parameters).to(device))
    out = augment(x, split_idx=0)
    torch_xla.sync()
    compiles.append(met.metric_data("CompileTime")[0])
    on_host = augment_batch(host, torch.from_numpy(parameters), (16, 16))
    largest_error = max(largest_error, float((out.cpu() - on_host).abs().max()))
print(json.dumps({
    "compiles": compiles,
    "fallbacks": [name for name in met.counter_names() if name.startswith("aten::")],
    "largest_error": largest_error,
}))
"""


@pytest.mark.slow
@pytest.mark.xla
def test_on_xla_it_compiles_once_falls_back_never_and_computes_what_the_cpu_computes():
    report = json.loads(run_python(RUN_ON_XLA, PJRT_DEVICE="CPU").splitlines()[-1])
    assert report["fallbacks"] == []
    assert report["compiles"] == [1, 1, 1, 1], "new random numbers, the same graph"
    assert report["largest_error"] < 1e-4

"""fastai's `aug_transforms`, in a form XLA runs whole: one graph, nothing falls back to the CPU.

fastai's own augmentation, on an XLA device, copies tensors to the host and back in every
step: the perspective warp solves its coefficients with `torch.linalg.solve`
(`aten::_linalg_solve_ex`), the sampler reads the coordinates' range with `.item()` and the warp
branches in Python on a device value (`aten::_local_scalar_dense`), and `F.grid_sample` has no
XLA lowering (`aten::grid_sampler_2d`). Its random draws also happen on the device, so what
the step's graph holds changes with them.

`XlaAugment` does the same augmentations with the same defaults and probabilities
(`aug_transforms()`: a horizontal flip with p 0.5; with p 0.75 each a rotation of up to 10°, a
zoom of up to 1.1 about a random centre and a perspective warp of up to 0.2 along each axis;
with p 0.75 each a brightness and a contrast change of up to 0.2, in logit space), split in two:

- on the host, per batch, in float64 numpy: every random number is drawn, and the flip, the
  rotation, the zoom and the perspective warp (its coefficients solved by numpy) are composed
  into one 3×3 matrix per image; with the two lighting factors that makes a float32 array of
  shape (batch, PARAMETERS);
- on the device, from that tensor: the matrices applied to a fixed grid of output pixel
  coordinates, fastai's reflection padding, bilinear sampling written as four gathers, and the
  lighting. The same ops on the same shapes every step, so the training step stays one graph.

On XLA the prefetch thread (`worker.prefetch`) draws each batch's parameters and copies them
to the device(s) with the batch, split like it under SPMD (`host_inputs`); called without it,
the transform draws them itself. It runs on training batches only (fastai's random transforms
leave validation images as they are), between `IntToFloatTensor` and `Normalize`.

Pickled (in `learn.export()`), it becomes a plain fastai-free identity `Transform`: the export
must load where traindeck is not installed, and inference never runs training-only transforms.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import torch
from fastai.vision.core import TensorImage
from fasttransform.transform import DisplayedTransform, Transform

# Columns of the parameter array: the 3×3 sampling matrix (row-major), then lighting.
MATRIX = slice(0, 9)
BRIGHTNESS = 9  # added to the logits: logit(b), b drawn in 0.5·(1 ± max_lighting)
CONTRAST = 10  # multiplies the logits: exp(u), u drawn in ±log(1 - max_lighting)
PARAMETERS = 11

LOGIT_EPS = 1e-7  # fastai's `logit` clamps to [1e-7, 1 - 1e-7]

# The corners a perspective warp moves, in fastai's order (_WarpCoord).
CORNERS = np.array([[-1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [1.0, 1.0]])


class Draws:
    """The random numbers of one batch, as fastai's aug_transforms would draw them (float64).

    `flip` is 1 for a flipped image; `rotate` in degrees; `zoom` ≥ 1 with its centre `col`,
    `row` in [0, 1]; `warp_x`, `warp_y` the perspective magnitudes; `brightness` in (0, 1)
    (0.5: unchanged); `contrast` > 0 (1: unchanged). An augmentation not applied to an image
    holds its neutral value, as fastai's masks do."""

    FIELDS = ("flip", "rotate", "zoom", "col", "row", "warp_x", "warp_y", "brightness", "contrast")

    def __init__(self, **values: Any):
        for name in self.FIELDS:
            setattr(self, name, np.asarray(values[name], dtype=np.float64))

    @property
    def size(self) -> int:
        return len(self.flip)


class XlaAugment(DisplayedTransform):
    """fastai's `aug_transforms(size=size)` for XLA: random numbers and matrices on the host,
    sampling and lighting on the device as fixed-shape tensor ops (see the module's text)."""

    split_idx, order = 0, 30  # training only; after IntToFloatTensor (10), before Normalize (99)

    def __init__(
        self,
        size: int | tuple[int, int],
        seed: int | None = None,
        max_rotate: float = 10.0,
        min_zoom: float = 1.0,
        max_zoom: float = 1.1,
        max_warp: float = 0.2,
        max_lighting: float = 0.2,
        p_flip: float = 0.5,
        p_affine: float = 0.75,
        p_lighting: float = 0.75,
    ):
        super().__init__()
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.seed = seed
        self.max_rotate, self.min_zoom, self.max_zoom = max_rotate, min_zoom, max_zoom
        self.max_warp, self.max_lighting = max_warp, max_lighting
        self.p_flip, self.p_affine, self.p_lighting = p_flip, p_affine, p_lighting
        self.rng = np.random.default_rng(seed)
        self._lock = threading.Lock()  # the prefetch thread and the training thread both draw
        self._next: torch.Tensor | None = None
        self._grids: dict[tuple[Any, ...], torch.Tensor] = {}

    # --- the host side ---

    def draw(self, n: int) -> Draws:
        """Random numbers for a batch of `n` images, with fastai's ranges and probabilities."""
        with self._lock:
            rng = self.rng

            def applied(p: float) -> np.ndarray:
                return rng.random(n) < p

            flip = applied(self.p_flip).astype(np.float64)
            rotate = np.where(
                applied(self.p_affine), rng.uniform(-self.max_rotate, self.max_rotate, n), 0.0
            )
            zoom = np.where(
                applied(self.p_affine), rng.uniform(self.min_zoom, self.max_zoom, n), 1.0
            )
            col, row = rng.uniform(0.0, 1.0, n), rng.uniform(0.0, 1.0, n)
            warp_x = np.where(
                applied(self.p_affine), rng.uniform(-self.max_warp, self.max_warp, n), 0.0
            )
            warp_y = np.where(
                applied(self.p_affine), rng.uniform(-self.max_warp, self.max_warp, n), 0.0
            )
            half = 0.5 * self.max_lighting
            brightness = np.where(
                applied(self.p_lighting), rng.uniform(0.5 - half, 0.5 + half, n), 0.5
            )
            bound = -math.log(1 - self.max_lighting) if self.max_lighting < 1 else 0.0
            contrast = np.where(
                applied(self.p_lighting), np.exp(rng.uniform(-bound, bound, n)), 1.0
            )
        return Draws(
            flip=flip, rotate=rotate, zoom=zoom, col=col, row=row, warp_x=warp_x,
            warp_y=warp_y, brightness=brightness, contrast=contrast,
        )  # fmt: skip

    def parameters_for(self, n: int, height: int, width: int) -> np.ndarray:
        """A fresh draw for `n` images of `height`×`width` as the device's float32 array."""
        return parameter_array(self.draw(n), height, width)

    def host_inputs(self, batch: Any, place: Any) -> torch.Tensor | None:
        """Called by the prefetch thread with each host batch: this batch's parameters, copied
        to the device(s) by `place` as the batch is. None when the batch has no images."""
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            return None
        n, _, height, width = images.shape
        return place(torch.from_numpy(self.parameters_for(n, height, width)))

    def receive(self, parameters: torch.Tensor | None) -> None:
        """The parameters `host_inputs` made for the batch the training thread applies next."""
        self._next = parameters

    # --- the device side ---

    def encodes(self, x: TensorImage) -> TensorImage:
        n, _, height, width = x.shape
        parameters, self._next = self._next, None
        if parameters is None or parameters.shape[0] != n:
            parameters = torch.from_numpy(self.parameters_for(n, height, width)).to(x.device)
        out = augment_batch(x.as_subclass(torch.Tensor), parameters, self.size, self._grid)
        return TensorImage(out)

    def _grid(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        key = (height, width, str(device))
        grid = self._grids.get(key)
        if grid is None:
            grid = output_grid(height, width).to(device)
            self._grids[key] = grid
        return grid

    # --- copies and pickles ---

    def _arguments(self) -> dict[str, Any]:
        return {
            "size": self.size, "seed": self.seed, "max_rotate": self.max_rotate,
            "min_zoom": self.min_zoom, "max_zoom": self.max_zoom, "max_warp": self.max_warp,
            "max_lighting": self.max_lighting, "p_flip": self.p_flip,
            "p_affine": self.p_affine, "p_lighting": self.p_lighting,
        }  # fmt: skip

    def __copy__(self) -> XlaAugment:
        twin = XlaAugment(**self._arguments())
        twin.rng = self.rng
        return twin

    def __deepcopy__(self, memo: dict[int, Any]) -> XlaAugment:
        twin = XlaAugment(**self._arguments())
        twin.rng.bit_generator.state = self.rng.bit_generator.state
        return twin

    def __reduce__(self) -> tuple[Any, ...]:
        # A pickle (the export) names no traindeck code: an identity, as at inference.
        return (Transform, ())


def parameter_array(draws: Draws, height: int, width: int) -> np.ndarray:
    """(n, PARAMETERS) float32: each image's sampling matrix (output → input coordinates, in
    [-1, 1]) and its lighting, composed in float64 as fastai composes them."""
    n = draws.size
    out = np.empty((n, PARAMETERS), dtype=np.float64)
    out[:, MATRIX] = sampling_matrices(draws, height, width).reshape(n, 9)
    out[:, BRIGHTNESS] = np.log(draws.brightness / (1 - draws.brightness))
    out[:, CONTRAST] = draws.contrast
    return out.astype(np.float32)


def sampling_matrices(draws: Draws, height: int, width: int) -> np.ndarray:
    """(n, 3, 3): the perspective warp after flip · rotation · zoom, as fastai applies them
    (AffineCoordTfm composes the affine matrices, corrects them for the aspect ratio, then
    the warp maps the affine grid's coordinates)."""
    sign = 1.0 - 2.0 * draws.flip
    flip = _affine(sign, 0 * sign, 0 * sign, 0 * sign, 1 + 0 * sign, 0 * sign)
    theta = np.deg2rad(draws.rotate)
    rotate = _affine(
        np.cos(theta), np.sin(theta), 0 * theta, -np.sin(theta), np.cos(theta), 0 * theta
    )
    scale = 1.0 / draws.zoom
    zoom = _affine(
        scale, 0 * scale, (1 - scale) * (2 * draws.col - 1),
        0 * scale, scale, (1 - scale) * (2 * draws.row - 1),
    )  # fmt: skip
    affine = flip @ rotate @ zoom
    affine[:, 0, 1] *= height / width
    affine[:, 1, 0] *= width / height
    return perspective_matrices(draws.warp_x, draws.warp_y) @ affine


def _affine(*entries: np.ndarray) -> np.ndarray:
    a, b, c, d, e, f = entries
    zero, one = np.zeros_like(a), np.ones_like(a)
    return np.stack(
        [np.stack([a, b, c], -1), np.stack([d, e, f], -1), np.stack([zero, zero, one], -1)], 1
    )


def perspective_matrices(warp_x: np.ndarray, warp_y: np.ndarray) -> np.ndarray:
    """(n, 3, 3): fastai's perspective warp (`_WarpCoord`, `find_coeffs`): the homography that
    takes the moved corners to the image's corners, solved here in float64 numpy."""
    x, y = warp_x, warp_y
    moved = np.stack(
        [np.stack([-1 - y, -1 - x], -1), np.stack([-1 + y, 1 + x], -1),
         np.stack([1 + y, -1 + x], -1), np.stack([1 - y, 1 - x], -1)],
        1,
    )  # fmt: skip
    n = len(x)
    system = np.zeros((n, 8, 8))
    target = np.zeros((n, 8))
    for i, (cx, cy) in enumerate(CORNERS):
        mx, my = moved[:, i, 0], moved[:, i, 1]
        system[:, 2 * i, 0], system[:, 2 * i, 1], system[:, 2 * i, 2] = mx, my, 1.0
        system[:, 2 * i, 6], system[:, 2 * i, 7] = -cx * mx, -cx * my
        system[:, 2 * i + 1, 3], system[:, 2 * i + 1, 4], system[:, 2 * i + 1, 5] = mx, my, 1.0
        system[:, 2 * i + 1, 6], system[:, 2 * i + 1, 7] = -cy * mx, -cy * my
        target[:, 2 * i], target[:, 2 * i + 1] = cx, cy
    coefficients = np.linalg.solve(system, target[..., None])[..., 0]
    return np.concatenate([coefficients, np.ones((n, 1))], 1).reshape(n, 3, 3)


def output_grid(height: int, width: int) -> torch.Tensor:
    """(height·width, 3): every output pixel's (x, y, 1), x and y in [-1, 1], corners on the
    corner pixels' centres (align_corners=True, as fastai samples)."""
    ys = torch.linspace(-1.0, 1.0, height, dtype=torch.float64)
    xs = torch.linspace(-1.0, 1.0, width, dtype=torch.float64)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    ones = torch.ones_like(grid_x)
    return torch.stack([grid_x, grid_y, ones], -1).reshape(-1, 3).float()


def augment_batch(
    x: torch.Tensor,
    parameters: torch.Tensor,
    size: tuple[int, int],
    grid_for: Any = None,
) -> torch.Tensor:
    """Warp and relight a float batch (n, c, h, w) in [0, 1] by `parameters` (n, PARAMETERS):
    tensor ops with shapes fixed by the batch's, nothing read back to the host."""
    n, channels = x.shape[:2]
    out_h, out_w = size
    grid = grid_for(out_h, out_w, x.device) if grid_for else output_grid(out_h, out_w).to(x.device)
    parameters = parameters.to(x.dtype)
    matrices = parameters[:, MATRIX].reshape(n, 3, 3)
    points = torch.matmul(grid.to(x.dtype), matrices.transpose(1, 2))  # (n, out_h·out_w, 3)
    sx = points[..., 0] / points[..., 2]
    sy = points[..., 1] / points[..., 2]
    sampled = bilinear_reflect(x, sx, sy).reshape(n, channels, out_h, out_w)
    return relight(sampled, parameters[:, BRIGHTNESS], parameters[:, CONTRAST])


def _reflect(coordinate: torch.Tensor, size: int) -> torch.Tensor:
    """PyTorch's grid_sample reflection padding (align_corners=True), in pixel units."""
    if size == 1:
        return torch.zeros_like(coordinate)
    span = float(size - 1)
    distance = coordinate.abs()
    flips = torch.floor(distance / span)
    extra = torch.fmod(distance, span)
    odd = torch.remainder(flips, 2.0) == 1.0
    return torch.where(odd, span - extra, extra).clamp(0.0, span)


def bilinear_reflect(x: torch.Tensor, sx: torch.Tensor, sy: torch.Tensor) -> torch.Tensor:
    """`F.grid_sample(x, grid, 'bilinear', 'reflection', align_corners=True)` for sample points
    (sx, sy) of shape (n, points) in [-1, 1]-coordinates: (n, c, points), from four gathers."""
    n, channels, height, width = x.shape
    ix = _reflect((sx + 1) * ((width - 1) / 2), width)
    iy = _reflect((sy + 1) * ((height - 1) / 2), height)
    x0f, y0f = torch.floor(ix), torch.floor(iy)
    wx1, wy1 = ix - x0f, iy - y0f
    wx0, wy0 = 1 - wx1, 1 - wy1
    x0 = x0f.long().clamp(0, width - 1)
    y0 = y0f.long().clamp(0, height - 1)
    x1 = (x0 + 1).clamp(max=width - 1)  # its weight is 0 where it is clamped
    y1 = (y0 + 1).clamp(max=height - 1)
    flat = x.reshape(n, channels, height * width)
    points = sx.shape[1]

    def pick(row: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
        index = (row * width + column).unsqueeze(1).expand(n, channels, points)
        return torch.gather(flat, 2, index)

    return (
        pick(y0, x0) * (wy0 * wx0).unsqueeze(1)
        + pick(y0, x1) * (wy0 * wx1).unsqueeze(1)
        + pick(y1, x0) * (wy1 * wx0).unsqueeze(1)
        + pick(y1, x1) * (wy1 * wx1).unsqueeze(1)
    )


def relight(
    x: torch.Tensor, brightness_logit: torch.Tensor, contrast: torch.Tensor
) -> torch.Tensor:
    """fastai's Brightness then Contrast, in logit space: sigmoid((logit(x) + b) · c)."""
    clamped = x.clamp(LOGIT_EPS, 1 - LOGIT_EPS)
    logits = -(1 / clamped - 1).log()
    shape = (-1,) + (1,) * (x.dim() - 1)
    return torch.sigmoid((logits + brightness_logit.view(shape)) * contrast.view(shape))

"""A fit's own forward for some layers of a model, taken away when the fit ends.

Where a layer must compute differently while traindeck trains it (batch norm as reductions
that SPMD splits, a strided convolution of one pixel in float32 on the CPU), an instance
`forward` is set on it: the layer keeps its class, parameters and buffers, so checkpoints and
the export hold plain torchvision/fastai modules, and nothing of traindeck is pickled once the
instance attribute is removed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn


def override_forward(
    model: nn.Module, wanted: Callable[[nn.Module], bool], forward: Callable[..., Any]
) -> list[nn.Module]:
    """Every layer of `model` that is `wanted` computes as `forward(layer, *inputs)`; returns
    them, for `restore_forward`."""
    layers = [module for module in model.modules() if wanted(module)]
    for layer in layers:
        layer.forward = functools.partial(forward, layer)
    return layers


def restore_forward(layers: list[nn.Module]) -> None:
    for layer in layers:
        layer.__dict__.pop("forward", None)

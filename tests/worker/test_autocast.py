"""bf16 autocast on the CPU: strided convolutions on a single pixel compute in float32."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import torch
from torch import nn

from worker.callbacks import AutocastCallback


def _weight_gradient(conv: nn.Conv2d, x: torch.Tensor, upstream: torch.Tensor) -> torch.Tensor:
    conv.weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(x)
    (y.float() * upstream).sum().backward()
    return conv.weight.grad.clone()


def test_a_strided_convolution_on_one_pixel_gets_the_float32_weight_gradient():
    """resnet18's layer4 at 16 px: a 3×3, stride-2, padded convolution of a 1×1 input. oneDNN's
    bf16 backward left the padding taps of its weight gradient unwritten (NaN or 1e37 in about
    1 of 10 draws of these shapes), which ended bf16 jobs on CPU workers in divergence."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(256, 512, 3, stride=2, padding=1, bias=False))
    callback = AutocastCallback("cpu")
    callback.learn = SimpleNamespace(model=model)
    callback.before_fit()
    conv = model[0]
    for _ in range(10):
        x = torch.randn(8, 256, 1, 1)
        upstream = torch.randn(8, 512, 1, 1)
        patched = _weight_gradient(conv, x, upstream)
        conv.weight.grad = None
        (conv._conv_forward(x, conv.weight, None) * upstream).sum().backward()  # float32
        assert torch.isfinite(patched).all()
        assert torch.allclose(patched, conv.weight.grad, atol=1e-5)
    callback.after_fit()


def test_larger_inputs_stay_in_bf16_and_the_fit_end_leaves_plain_layers():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.Conv2d(4, 4, 3, padding=1))
    callback = AutocastCallback("cpu")
    callback.learn = SimpleNamespace(model=model)
    callback.before_fit()
    assert callback.patched == [model[0]], "only strided convolutions"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(torch.randn(2, 3, 8, 8)).dtype == torch.bfloat16
        assert model[0](torch.randn(2, 3, 1, 1)).dtype == torch.float32
    callback.after_fit()
    assert "forward" not in model[0].__dict__
    assert b"worker" not in pickle.dumps(model), "the export would need traindeck's code"


def test_other_devices_are_left_alone():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1))
    callback = AutocastCallback("xla")
    callback.learn = SimpleNamespace(model=model)
    callback.before_fit()
    assert callback.patched == [] and "forward" not in model[0].__dict__

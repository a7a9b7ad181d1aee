"""The recipe our users bring on the real XLA path (PJRT_DEVICE=CPU): hyper-parameters that
change every step, as fit_one_cycle changes them, never change the step's graph."""

from __future__ import annotations

import json

import pytest

from tests.support.workers import run_python

pytestmark = [pytest.mark.slow, pytest.mark.xla]

# fastai's optimizer step takes its hyper-parameters as Python numbers: weight decay multiplies
# by 1 - lr·wd, Adam steps by -lr. Through one-cycle the rate sweeps the values, meets wd's (the
# default peak rate 1e-2 is the default wd) and ends so low that 1 - lr·wd rounds to 1.0.
STEPS_ON_XLA = """
import json, sys
from worker.job_process import keep_python_numbers_out_of_the_graph
if sys.argv[1] == "kept":
    keep_python_numbers_out_of_the_graph()  # as the job process does, before torch_xla starts
import torch, torch_xla
import torch_xla.debug.metrics as met
device = torch_xla.device()
weights, grads = torch.ones(8, device=device), torch.full((8,), 0.5, device=device)
torch_xla.sync()  # the two are device data from here on
wd, counts = 0.01, []
for lr in (0.004, 0.01, 1e-7, 0.003):
    weights.mul_(1 - lr * wd).add_(grads, alpha=-lr)
    torch_xla.sync()
    counts.append(met.metric_data("CompileTime")[0])
print(json.dumps(counts))
"""


def _compiles(mode: str) -> list[int]:
    output = run_python(STEPS_ON_XLA, mode, PJRT_DEVICE="CPU")
    return json.loads(output.splitlines()[-1])


def test_changing_hyper_parameters_reach_the_graph_as_inputs_and_never_recompile_it():
    kept = _compiles("kept")
    assert kept == [kept[0]] * 4, "one graph for every step"
    # torch_xla's defaults: 1.0 is baked in as a constant, and equal numbers share one input.
    defaults = _compiles("defaults")
    assert defaults[-1] > defaults[0]

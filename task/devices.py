"""The model's side of the simulated clock: training cost per example (a fleet's plot:
task.device_plot).

``strategies.engine.clock`` needs c, the training seconds per example on the reference device
(eq. 1 there). It is calibrated once per model, without timing anything, so simulation
and deployment get the same number on any machine:

    c = 3 x 2 x MACs(one example's forward pass) / (reference GFLOP/s x 10^9)

MACs are the multiply-accumulates of the Conv2d and Linear layers, counted from their
shapes during one forward pass of a zero example, plus one per parameter of any other
module (the SVM's weight vector, normalisation scales); activations and pooling are left
out (a few percent for these models); 2 FLOPs per MAC; the backward
pass costs about twice the forward (gradients with respect to activations and to
weights), hence the 3 (Kaplan et al., "Scaling Laws for Neural Language Models", 2020,
Sec. 2.1: C = 6N per token).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import nn

FLOPS_PER_MAC = 2
TRAINING_PASSES = 3  # forward + backward ~ 3 forward passes


def forward_macs(model: nn.Module, input_shape: Sequence[int]) -> int:
    """Multiply-accumulates of one example's forward pass: Conv2d and Linear layers from
    their output shapes, one per parameter of any other module."""
    counted = [0]

    def conv(module: nn.Conv2d, _inputs, output: torch.Tensor) -> None:
        per_output = (module.in_channels // module.groups) * math.prod(module.kernel_size)
        counted[0] += output.numel() * per_output

    def linear(module: nn.Linear, _inputs, output: torch.Tensor) -> None:
        counted[0] += output.numel() * module.in_features

    probe = copy.deepcopy(model).to("cpu").eval()  # the caller's model is left as it was
    hooks = []
    for module in probe.modules():
        if isinstance(module, nn.Conv2d):
            hooks.append(module.register_forward_hook(conv))
        elif isinstance(module, nn.Linear):
            hooks.append(module.register_forward_hook(linear))
        else:
            counted[0] += sum(p.numel() for p in module.parameters(recurse=False))
    try:
        with torch.no_grad():
            probe(torch.zeros((1, *input_shape)))
    finally:
        for hook in hooks:
            hook.remove()
    return counted[0]


def training_flops_per_example(model: nn.Module, input_shape: Sequence[int]) -> int:
    """FLOPs of one training example: 3 x 2 x forward MACs (module docstring)."""
    return TRAINING_PASSES * FLOPS_PER_MAC * forward_macs(model, input_shape)


def seconds_per_example(model: nn.Module, input_shape: Sequence[int],
                        reference_gflops: float) -> float:
    """c of ``strategies.engine.clock`` eq. (1): training FLOPs per example / the reference speed."""
    if not (math.isfinite(reference_gflops) and reference_gflops > 0):
        raise ValueError(f"reference_gflops must be a finite number > 0, got {reference_gflops}")
    return training_flops_per_example(model, input_shape) / (reference_gflops * 1e9)

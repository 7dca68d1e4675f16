"""The model's training cost per example (task.devices) against hand-counted MACs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from task.devices import forward_macs, seconds_per_example, training_flops_per_example
from task.models import build_model


def tiny() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.GroupNorm(1, 2), nn.Flatten(),
                         nn.Linear(2 * 26 * 26, 10))


def test_macs_hand_counted():
    # conv: 2 x 26 x 26 outputs x (1 x 3 x 3) = 12,168; linear: 1,352 x 10 = 13,520;
    # GroupNorm's 2 + 2 parameters, one MAC each
    assert forward_macs(tiny(), (1, 28, 28)) == 12_168 + 13_520 + 4
    assert training_flops_per_example(tiny(), (1, 28, 28)) == 6 * 25_692
    assert seconds_per_example(tiny(), (1, 28, 28), 2.0) == pytest.approx(6 * 25_692 / 2e9)


def test_grouped_convolution_and_the_svm():
    conv = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=2))  # 4 x 8 x 8 x (2 x 9)
    assert forward_macs(conv, (4, 8, 8)) == 4 * 64 * 18
    assert forward_macs(build_model("svm", (1, 28, 28), 2), (1, 28, 28)) == 784


def test_counting_leaves_the_model_and_the_rng_alone():
    model = build_model("lenet-gn", (1, 28, 28), 10).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    seconds_per_example(model, (1, 28, 28), 1.0)
    assert model.training and torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("gflops", [0.0, -1.0, float("inf")])
def test_reference_speed_must_be_positive(gflops):
    with pytest.raises(ValueError, match="reference_gflops"):
        seconds_per_example(tiny(), (1, 28, 28), gflops)

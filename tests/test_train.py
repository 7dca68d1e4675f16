"""task.train (the device, the app's optimiser), task.evaluate and task.layout; the loop
itself is tested in tests/test_sgd_loop.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from strategies import contract as C
from strategies.client import local_sgd
from task.evaluate import EvalResult, evaluate
from task.layout import inference_layout, training_layout
from task.models import build_model
from task.train import resolve_device, sgd_optimizer

from tests.tiny_torch import SHAPE, Quadratic, all_equal, params, tiny_data, tiny_model


# ----------------------------------------------------------------- the app's optimiser
def test_sgd_optimizer_takes_the_train_config_then_the_fallbacks():
    model = tiny_model()
    opt = sgd_optimizer(model, {C.LR: 0.2, C.MOMENTUM: 0.9}, lr=0.1, momentum=0.5,
                        weight_decay=1e-3)
    assert isinstance(opt, torch.optim.SGD) and len(opt.param_groups) == 1
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.2, 0.9, 1e-3)
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]
    group = sgd_optimizer(model, {}, lr=0.1).param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.1, 0.0, 0.0)


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device().type == expected


# ----------------------------------------------------------------- evaluate
def test_evaluate_range_and_consistency():
    x, y = tiny_data(23)
    model = tiny_model()
    result = evaluate(model, x, y)
    assert isinstance(result, EvalResult)
    assert result.num_examples == 23
    assert 0.0 <= result.accuracy <= 1.0
    assert math.isfinite(result.loss) and result.loss > 0
    with torch.no_grad():
        logits = model(x)
        expected_acc = float((logits.argmax(1) == y).float().mean())
        expected_loss = float(nn.functional.cross_entropy(logits, y))
    assert result.accuracy == pytest.approx(expected_acc)
    assert result.loss == pytest.approx(expected_loss, rel=1e-5)
    chunked = evaluate(model, x, y, batch_size=4)  # uneven last chunk
    assert chunked.accuracy == result.accuracy
    assert chunked.loss == pytest.approx(result.loss, rel=1e-5)


def test_evaluate_perfect_model():
    model = Quadratic()  # num_correct from the base class; logits all equal -> argmax 0
    x, y = torch.zeros(5, 1), torch.zeros(5, dtype=torch.int64)
    assert evaluate(model, x, y).accuracy == 1.0


def test_evaluate_empty():
    model = tiny_model()
    result = evaluate(model, torch.zeros(0, *SHAPE), torch.zeros(0, dtype=torch.int64))
    assert result.num_examples == 0


def test_evaluate_does_not_change_weights():
    x, y = tiny_data(10)
    model = tiny_model()
    before = params(model)
    evaluate(model, x, y)
    assert all_equal(before, params(model))


def test_inference_layout_is_channels_last_for_convolutions_on_images_only():
    conv, images = build_model("cnn-small", (3, 28, 28), 10), torch.rand(8, 3, 28, 28)
    model, x = inference_layout(conv, images)
    assert x.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous(
        memory_format=torch.channels_last)
    first_conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert first_conv.weight.is_contiguous(memory_format=torch.channels_last)
    mlp, flat = tiny_model(), torch.rand(8, *SHAPE)
    assert inference_layout(mlp, flat) == (mlp, flat)


def conv_weight(model: nn.Module) -> torch.Tensor:
    """The weight of the model's second convolution (its first has one input channel, whose
    weight is both contiguous and channels-last)."""
    return [m for m in model.modules() if isinstance(m, nn.Conv2d)][1].weight


def test_training_layout_is_channels_last_for_convolutions_on_images_only():
    torch.manual_seed(0)
    conv = build_model("cnn-small", (1, 28, 28), 10)
    assert training_layout(conv, (1, 28, 28)) is conv
    assert conv_weight(conv).is_contiguous(memory_format=torch.channels_last)
    assert not conv_weight(conv).is_contiguous()
    mlp = tiny_model()
    before = [p.data_ptr() for p in mlp.parameters()]
    assert training_layout(mlp, SHAPE) is mlp and [p.data_ptr() for p in mlp.parameters()] == before


def test_received_weights_keep_the_training_layout():
    torch.manual_seed(0)
    model = training_layout(build_model("cnn-small", (1, 28, 28), 10), (1, 28, 28))
    received = {k: torch.randn_like(v).contiguous() for k, v in model.state_dict().items()}
    model.load_state_dict(received)
    assert conv_weight(model).is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in received.items())


def test_local_sgd_in_the_training_layout_agrees_with_the_default_layout_to_float_rounding():
    torch.manual_seed(0)
    plain = build_model("cnn-small", (1, 28, 28), 10)
    fast = training_layout(copy.deepcopy(plain), (1, 28, 28))
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g)
    results = [local_sgd(m, x, y, lr=0.05, batch_size=16, steps=8, seed=2) for m in (plain, fast)]
    assert results[0].local_steps == results[1].local_steps == 8
    assert results[0].train_loss == pytest.approx(results[1].train_loss, rel=1e-5)
    for a, b in zip(plain.parameters(), fast.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_client_app_trains_its_model_in_the_training_layout():
    """The ClientApp's per-process model is the one :func:`training_layout` returns."""
    from fedapp.client_app import task_model

    model = task_model("cnn-small", (1, 28, 28), 10, "cpu")
    assert conv_weight(model).is_contiguous(memory_format=torch.channels_last)
    assert not conv_weight(model).is_contiguous()

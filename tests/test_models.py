"""Tests for task.models: shapes, parameter counts, losses and the registry."""

import math

import pytest
import torch
from torch import nn

from strategies.client import has_representation
from task.models import (MODEL_NAMES, REPRESENTATION_MODELS, ClassifierModule, build_model,
                         count_parameters)

MNIST_SHAPE = (1, 28, 28)
CIFAR_SHAPE = (3, 32, 32)


def first_linear(model: nn.Module) -> nn.Linear:
    return next(m for m in model.modules() if isinstance(m, nn.Linear))


def test_model_names_order():
    assert MODEL_NAMES == ("mlp-2nn", "mlp-2nn-moon", "cnn-mcmahan", "cnn-small",
                           "cnn-small-moon", "lenet-gn", "cnn-fedveca", "resnet18-gn", "svm")


@pytest.mark.parametrize("name, expected", [("mlp-2nn", 199_210), ("cnn-mcmahan", 1_663_370)])
def test_parameter_counts_match_mcmahan_2017(name, expected):
    assert count_parameters(build_model(name, MNIST_SHAPE, 10)) == expected


@pytest.mark.parametrize("shape, classes, expected", [
    (MNIST_SHAPE, 10, 44_470), (MNIST_SHAPE, 62, 48_890), (CIFAR_SHAPE, 10, 62_050)])
def test_lenet_gn_matches_dynamicfl_paper(shape, classes, expected):
    """Le et al. (DynamicFL) Table 6: ~48.9k parameters on FEMNIST, ~62.1k on CIFAR-10."""
    model = build_model("lenet-gn", shape, classes)
    assert count_parameters(model) == expected
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert [(m.num_groups, m.num_channels) for m in norms] == [(1, 6), (1, 16)]


def test_count_parameters_ignores_frozen():
    model = build_model("mlp-2nn", MNIST_SHAPE, 10)
    model.net[1].weight.requires_grad_(False)
    assert count_parameters(model) == 199_210 - 784 * 200


@pytest.mark.parametrize("name, shape, flat", [
    ("cnn-fedveca", MNIST_SHAPE, 1568), ("cnn-fedveca", CIFAR_SHAPE, 2048),
    ("cnn-small", MNIST_SHAPE, 256), ("cnn-small", CIFAR_SHAPE, 400),
])
def test_flattened_size_is_computed_from_input_shape(name, shape, flat):
    assert first_linear(build_model(name, shape, 10)).in_features == flat


def test_cnn_fedveca_init():
    model = build_model("cnn-fedveca", MNIST_SHAPE, 10)
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            assert torch.all(m.bias == 0.1)
            assert m.weight.abs().max() <= 0.2


@pytest.mark.parametrize("shape", [MNIST_SHAPE, CIFAR_SHAPE])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_loss_backward(name, shape):
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    assert isinstance(model, ClassifierModule)
    x = torch.randn(4, *shape)
    targets = torch.tensor([0, 1, 2, 3], dtype=torch.int64)
    outputs = model(x)
    assert outputs.shape == ((4,) if name == "svm" else (4, 10))

    loss = model.loss(outputs, targets)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)

    correct = model.num_correct(outputs.detach(), targets)
    assert type(correct) is int and 0 <= correct <= 4


def test_resnet18_gn_has_no_batchnorm():
    model = build_model("resnet18-gn", CIFAR_SHAPE, 10)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())


def test_svm_loss_and_accuracy_by_hand():
    model = build_model("svm", (1, 1, 2), 10)
    x = torch.tensor([[1.0, 1.0], [0.5, 0.0], [0.0, -1.0]]).view(3, 1, 1, 2)
    targets = torch.tensor([2, 3, 4])  # y = +1, -1, +1

    # w = 0: all margins 0 -> hinge 1 each, loss 0.5, nothing correct.
    out = model(x)
    assert torch.equal(out, torch.zeros(3))
    assert model.loss(out, targets).item() == pytest.approx(0.5)
    assert model.num_correct(out, targets) == 0

    with torch.no_grad():
        model.weight.copy_(torch.tensor([1.0, -2.0]))
    out = model(x)
    # outputs -1, 0.5, 2; margins y*out = -1, -0.5, 2; hinge^2 = 4, 2.25, 0
    assert torch.allclose(out, torch.tensor([-1.0, 0.5, 2.0]))
    # 0.1/2 * (1 + 4) + 0.5 * (6.25 / 3)
    assert model.loss(out, targets).item() == pytest.approx(0.25 + 6.25 / 6)
    assert model.num_correct(out, targets) == 1


def test_unknown_name_raises():
    with pytest.raises(ValueError) as excinfo:
        build_model("vgg-nope", MNIST_SHAPE, 10)
    message = str(excinfo.value)
    assert "vgg-nope" in message
    assert all(name in message for name in MODEL_NAMES)


@pytest.mark.parametrize("shape, classes, expected", [(MNIST_SHAPE, 10, 75_046),
                                                      (CIFAR_SHAPE, 10, 92_626)])
def test_cnn_small_moon_is_moons_model_fed_con(shape, classes, expected):
    """MOON's ModelFedCon on the simple CNN: 28x28x1 by hand: convs 156 + 2,416, FC 256x120
    30,840 + 120x84 10,164, head 84x84 7,140 + 84x256 21,760, output 256x10 2,570."""
    model = build_model("cnn-small-moon", shape, classes)
    assert count_parameters(model) == expected
    head = [(m.in_features, m.out_features) for m in model.projection
            if isinstance(m, nn.Linear)]
    assert head == [(84, 84), (84, 256)]
    assert (model.output.in_features, model.output.out_features) == (256, classes)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_representation_models_expose_it_and_stay_classifiers(name):
    """forward(x) are the logits of forward_with_representation(x); z is the 256-d
    projection (the models MOON accepts); the other models have no representation."""
    shape = (1, 1, 60) if name.startswith("mlp") else MNIST_SHAPE
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    assert has_representation(model) is (name in REPRESENTATION_MODELS)
    if name in REPRESENTATION_MODELS:
        x = torch.randn(3, *shape)
        logits, z = model.forward_with_representation(x)
        assert torch.equal(logits, model(x)) and z.shape == (3, 256)
        assert torch.equal(model.output(z), logits)

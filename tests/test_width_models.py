"""Width-scalable models (task.models: build_model(width=, scaler=), width_spec, width_units)
against strategies.engine.submodel_math: a sub-model extracted with the spec has the shapes of the
model built at that width, loads into it and runs (HeteroFL Sec. 3.1, FjORD Sec. 3,
FedRolex Sec. 3.2)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from strategies.engine.submodel_math import (
    HiddenUnits,
    WidthSpec,
    extract,
    submodel_indices,
    unit_indices,
)
from task.models import MODEL_NAMES, WIDTH_MODELS, Scaler, build_model, width_spec, width_units

MNIST_SHAPE = (1, 28, 28)
CIFAR_SHAPE = (3, 32, 32)
WIDTHS = (1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16)
CASES = [("cnn-small", MNIST_SHAPE), ("cnn-small", CIFAR_SHAPE), ("resnet18-gn", CIFAR_SHAPE)]


def as_spec(name, shape, classes=10) -> WidthSpec:
    axes = width_spec(name, shape, classes)
    return WidthSpec({key: tuple(None if a is None else HiddenUnits(*a) for a in entries)
                      for key, entries in axes.items()})


def numpy_state(model: nn.Module) -> dict[str, np.ndarray]:
    return {key: value.detach().cpu().numpy() for key, value in model.state_dict().items()}


def same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a)


@pytest.fixture(scope="module")
def global_models():
    models = {}
    for name, shape in CASES:
        torch.manual_seed(0)
        models[name, shape] = build_model(name, shape, 10)
    return models


@pytest.mark.parametrize("units, width", [
    (6, 0.5), (16, 1 / 16), (120, 1 / 8), (84, 1 / 16), (64, 0.55), (100, 0.55), (7, 1e-9)])
def test_width_units_examples(units, width):
    assert width_units(units, width) == len(unit_indices("static", units, width))


def test_width_units_agrees_with_unit_indices():
    ratios = [k / 100 for k in range(1, 101)] + [1 / 2 ** k for k in range(1, 8)] + [1 / 3, 2 / 3]
    for units, ratio in itertools.product(list(range(1, 70)) + [84, 120, 256, 512, 1000], ratios):
        n = width_units(units, ratio)
        assert n == unit_indices("static", units, ratio).size, (units, ratio)
        assert n == unit_indices("rolling", units, ratio, round=5).size, (units, ratio)
        assert 1 <= n <= units and n >= math.floor(units * ratio)


@pytest.mark.parametrize("name, shape", CASES)
def test_spec_covers_every_parameter(name, shape, global_models):
    state = global_models[name, shape].state_dict()
    spec = width_spec(name, shape, 10)
    assert set(spec) == {k for k, v in state.items() if v.is_floating_point()}
    for key, entries in spec.items():
        assert len(entries) == state[key].dim(), key
        assert all(a is None or (isinstance(a[0], str) and isinstance(a[1], int)) for a in entries)
    assert spec[next(iter(spec))][1] is None  # first layer's input channels never scale
    fc = [k for k in spec if k.endswith("weight")][-1]
    assert spec[fc][0] is None and spec[fc.replace("weight", "bias")] == (None,)


def test_cnn_small_flatten_repeat_is_the_feature_map():
    assert width_spec("cnn-small", MNIST_SHAPE, 10)["classifier.1.weight"] == (
        ("fc1", 1), ("conv2", 16))  # 16 channels x 4 x 4 = 256 inputs
    assert width_spec("cnn-small", CIFAR_SHAPE, 10)["classifier.1.weight"] == (
        ("fc1", 1), ("conv2", 25))  # 16 x 5 x 5 = 400


def test_resnet_residual_sums_share_a_dimension():
    spec = width_spec("resnet18-gn", CIFAR_SHAPE, 10)
    assert spec["net.conv1.weight"][0] == spec["net.layer1.1.conv2.weight"][0] == ("layer1", 1)
    assert spec["net.layer2.0.downsample.0.weight"][:2] == (("layer2", 1), ("layer1", 1))
    assert spec["net.layer2.0.conv2.weight"][0] == spec["net.layer2.1.conv2.weight"][0]
    assert spec["net.layer4.1.bn2.weight"] == (("layer4", 1),)
    assert spec["net.fc.weight"] == (None, ("layer4", 1))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name, shape", CASES)
def test_extracted_submodel_is_the_width_model(name, shape, width, global_models):
    """(a) extract()'s shapes equal build_model(width=r)'s, static and rolling; (b) the
    width-r model loads them strictly and runs."""
    params = numpy_state(global_models[name, shape])
    shapes = {k: v.shape for k, v in params.items()}
    spec = as_spec(name, shape)
    small = build_model(name, shape, 10, width=width)
    expected = {k: tuple(v.shape) for k, v in small.state_dict().items()}
    for scheme, rnd in (("static", 0), ("rolling", 7)):
        sub = extract(params, submodel_indices(spec, shapes, scheme, width, rnd))
        assert {k: v.shape for k, v in sub.items()} == expected, scheme
    static = extract(params, submodel_indices(spec, shapes, "static", width))
    small.load_state_dict({k: torch.from_numpy(v) for k, v in static.items()}, strict=True)
    small.eval()
    with torch.no_grad():
        out = small(torch.randn(2, *shape))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_width_models_keep_ceil_units():
    model = build_model("cnn-small", MNIST_SHAPE, 10, width=0.3)
    convs = [m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)]
    fcs = [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]
    assert convs == [2, 5] and fcs == [(5 * 16, 36), (36, 26), (26, 10)]  # ceil(0.3 * units)
    assert model.features[0][0].in_channels == 1


def test_resnet_group_norm_rule():
    """GroupNorm(2, C) for even C, GroupNorm(1, C) for odd (width 0.1: ceil(6.4) = 7)."""
    norms = {(m.num_groups, m.num_channels) for m in
             build_model("resnet18-gn", CIFAR_SHAPE, 10, width=1 / 16).modules()
             if isinstance(m, nn.GroupNorm)}
    assert norms == {(2, 4), (2, 8), (2, 16), (2, 32)}
    odd = build_model("resnet18-gn", CIFAR_SHAPE, 10, width=0.1)
    assert (1, 7) in {(m.num_groups, m.num_channels) for m in odd.modules()
                      if isinstance(m, nn.GroupNorm)}
    assert odd(torch.randn(2, *CIFAR_SHAPE)).shape == (2, 10)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_width_one_is_todays_model(name):
    """(c) width=1 (and scaler=False) gives the default call's state_dict bit for bit and
    leaves the RNG where the default call leaves it."""
    shape = CIFAR_SHAPE
    torch.manual_seed(0)
    default = build_model(name, shape, 10).state_dict()
    after_default = torch.rand(3)
    for width in (1.0, 1):
        torch.manual_seed(0)
        assert same_bits(build_model(name, shape, 10, width=width).state_dict(), default)
        assert torch.equal(torch.rand(3), after_default)
    if name in WIDTH_MODELS:
        torch.manual_seed(0)
        assert same_bits(build_model(name, shape, 10, scaler=True).state_dict(), default)


def test_scaler_divides_in_training_only():
    """(d) Scaler(r): x / r in train mode, x in eval mode, no parameters."""
    scaler = Scaler(0.25)
    x = torch.tensor([1.0, -2.0, 3.0])
    assert torch.equal(scaler.train()(x), torch.tensor([4.0, -8.0, 12.0]))
    assert torch.equal(scaler.eval()(x), x)
    assert list(scaler.parameters()) == [] and list(scaler.buffers()) == []
    assert torch.equal(Scaler(1.0).train()(x), x)


@pytest.mark.parametrize("name, shape, count", [("cnn-small", MNIST_SHAPE, 4),
                                                ("resnet18-gn", CIFAR_SHAPE, 20)])
def test_scaler_models(name, shape, count):
    """(d) scaler=True: one Scaler(r) per scaled layer, the same keys and shapes; in eval
    mode the output equals the model without scalers."""
    torch.manual_seed(0)
    plain = build_model(name, shape, 10, width=0.5)
    torch.manual_seed(0)
    scaled = build_model(name, shape, 10, width=0.5, scaler=True)
    scalers = [m for m in scaled.modules() if isinstance(m, Scaler)]
    assert len(scalers) == count and all(s.rate == 0.5 for s in scalers)
    assert not any(isinstance(m, Scaler) for m in plain.modules())
    assert same_bits(plain.state_dict(), scaled.state_dict())
    x = torch.randn(2, *shape)
    plain.eval(), scaled.eval()
    with torch.no_grad():
        assert torch.equal(plain(x), scaled(x))
    if name == "cnn-small":  # no norm: training-mode outputs differ by the scaling
        plain.train(), scaled.train()
        with torch.no_grad():
            assert not torch.allclose(plain(x), scaled(x))


def test_cnn_small_scaler_sits_before_each_relu():
    model = build_model("cnn-small", MNIST_SHAPE, 10, width=0.5, scaler=True)
    for block in model.features:
        assert isinstance(block[0], nn.Conv2d)
        assert isinstance(block[1][0], Scaler) and isinstance(block[1][1], nn.ReLU)
    assert [type(m) for m in model.classifier[2]] == [Scaler, nn.ReLU]
    assert isinstance(model.classifier[5], nn.Linear)  # the class outputs: no scaler


@pytest.mark.parametrize("width", [0, -0.5, 1.5, 2, float("nan"), float("inf"), "0.5", None,
                                   True])
def test_bad_width_raises(width):
    with pytest.raises(ValueError, match=r"width=.*must be a number in \(0, 1\]"):
        build_model("cnn-small", MNIST_SHAPE, 10, width=width)


@pytest.mark.parametrize("name", [n for n in MODEL_NAMES if n not in WIDTH_MODELS])
def test_other_models_refuse_width_and_scaler(name):
    with pytest.raises(ValueError) as excinfo:
        build_model(name, MNIST_SHAPE, 10, width=0.5)
    message = str(excinfo.value)
    assert name in message and "width=0.5" in message and "width=1.0" in message
    assert all(n in message for n in WIDTH_MODELS)
    with pytest.raises(ValueError, match="does not scale in width"):
        build_model(name, MNIST_SHAPE, 10, scaler=True)
    with pytest.raises(ValueError, match=f"{name!r} does not scale in width"):
        width_spec(name, MNIST_SHAPE, 10)


def test_other_error_paths():
    with pytest.raises(ValueError, match="scaler=1 must be True or False"):
        build_model("cnn-small", MNIST_SHAPE, 10, scaler=1)
    with pytest.raises(ValueError, match="Unknown model name 'vgg-nope'"):
        build_model("vgg-nope", MNIST_SHAPE, 10, width=0.5)
    with pytest.raises(ValueError, match="Unknown model name 'vgg-nope'"):
        width_spec("vgg-nope", MNIST_SHAPE, 10)


def test_width_spec_leaves_the_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    width_spec("cnn-small", MNIST_SHAPE, 10)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("scheme, rnd", [("static", 0), ("rolling", 3)])
@pytest.mark.parametrize("shape", [MNIST_SHAPE, CIFAR_SHAPE])
def test_cnn_small_submodel_computes_the_masked_global_model(shape, scheme, rnd, global_models):
    """The spec is right, flatten included: the extracted sub-model (no norm in cnn-small)
    computes what the global model computes with every entry outside the sub-model zeroed,
    also for FedRolex's wrapped windows, whose units come in window order."""
    params = numpy_state(global_models["cnn-small", shape])
    shapes = {k: v.shape for k, v in params.items()}
    indices = submodel_indices(as_spec("cnn-small", shape), shapes, scheme, 0.5, rnd)
    small = build_model("cnn-small", shape, 10, width=0.5)
    small.load_state_dict({k: torch.from_numpy(v) for k, v in extract(params, indices).items()})
    masked = {}
    for key, value in params.items():
        mesh = np.ix_(*[np.arange(n)[i] if isinstance(i, slice) else i
                        for n, i in zip(value.shape, indices[key])])
        masked[key] = np.zeros_like(value)
        masked[key][mesh] = value[mesh]
    full = build_model("cnn-small", shape, 10)
    full.load_state_dict({k: torch.from_numpy(v) for k, v in masked.items()})
    x = torch.randn(2, *shape)
    with torch.no_grad():
        torch.testing.assert_close(small.eval()(x), full.eval()(x), rtol=1e-5, atol=1e-6)

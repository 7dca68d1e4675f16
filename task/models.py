"""Model zoo for federated image classification (PyTorch only).

Every model subclasses :class:`ClassifierModule`, which carries its own loss and
accuracy counting so that training code never needs to know which model it runs.
Flattened feature sizes are always computed from ``input_shape``, never hard-coded.

Width scaling (``cnn-small``, ``resnet18-gn``; HeteroFL, Diao, Ding and Tarokh, ICLR 2021,
Sec. 3.1; FjORD, Horvath et al., NeurIPS 2021, Sec. 3; FedRolex, Alam et al., NeurIPS 2022,
Sec. 3.2): ``build_model(..., width=r)`` keeps :func:`width_units` of every hidden layer's
units, and :func:`width_spec` says which array axes hold which hidden units, in the form
``strategies.engine.submodel_math.WidthSpec`` takes.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .model_names import MODEL_NAMES, REPRESENTATION_MODELS, WIDTH_MODELS  # noqa: F401 - re-exported

InputShape = tuple[int, int, int]


class ClassifierModule(nn.Module):
    """Base class for all models; subclasses implement ``forward(x) -> outputs``.

    The defaults treat ``outputs`` as class logits of shape (N, num_classes)
    and ``targets`` as int64 class ids of shape (N,).
    """

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy between logits and class ids."""
        return F.cross_entropy(outputs, targets)

    def num_correct(self, outputs: torch.Tensor, targets: torch.Tensor) -> int:
        """Number of samples whose arg-max logit equals the target class."""
        return int((outputs.argmax(dim=1) == targets).sum().item())


def width_units(units: int, width: float) -> int:
    """Units a hidden layer of ``units`` keeps at ``width``: ceil(width * units), where a
    product within a relative 1e-12 above an integer counts as that integer, capped at
    ``units``; the rule of ``strategies.engine.submodel_math.unit_indices`` (tests check they agree)."""
    product = int(units) * float(width)
    return min(int(units), math.ceil(product - product * 1e-12))


class Scaler(nn.Module):
    """HeteroFL's Scaler (Diao et al., ICLR 2021, Sec. 3): divides its input by the width
    rate in training mode and is the identity in eval mode; no parameters. As in the
    authors' code (``src/modules/modules.py``; ``src/models/conv.py`` and ``resnet.py``) it
    sits on a scaled layer's output, before that layer's norm and activation."""

    def __init__(self, rate: float):
        super().__init__()
        self.rate = float(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.rate if self.training else x

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


def _relu(scaler_rate: float | None = None) -> nn.Module:
    """ReLU, preceded by a :class:`Scaler` when ``scaler_rate`` is given; the pair takes the
    ReLU's place in a Sequential, so the parameter keys stay those without a scaler."""
    return nn.ReLU() if scaler_rate is None else nn.Sequential(Scaler(scaler_rate), nn.ReLU())


def _flat_features(features: nn.Module, input_shape: InputShape) -> int:
    """Size of ``features(x).flatten(1)`` for one input of ``input_shape``."""
    with torch.no_grad():
        return features(torch.zeros(1, *input_shape)).flatten(1).shape[1]


class MLP2NN(ClassifierModule):
    """McMahan et al., 2017, "Communication-Efficient Learning of Deep Networks
    from Decentralized Data" (AISTATS): the "2NN", two hidden layers of 200
    ReLU units (199,210 parameters on 28x28 grayscale, 10 classes).

    At ``width`` r both hidden layers keep :func:`width_units` of their units; ``scaler``
    puts a :class:`Scaler` before each hidden ReLU (HeteroFL Sec. 3)."""

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: int = 200,
                 width: float = 1.0, scaler: bool = False):
        super().__init__()
        c, h, w = input_shape
        units = width_units(hidden, width)
        rate = float(width) if scaler else None
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c * h * w, units), _relu(rate),
            nn.Linear(units, units), _relu(rate),
            nn.Linear(units, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvNet(ClassifierModule):
    """Generic ``features -> flatten -> classifier`` CNN.

    Parameters
    ----------
    features : nn.Module
        Convolutional trunk.
    input_shape : tuple of int
        (channels, height, width); used to size the first linear layer.
    hidden_sizes : sequence of int
        Widths of the ReLU hidden layers of the classifier head.
    num_classes : int
        Number of output logits.
    scaler_rate : float, optional
        If given, a :class:`Scaler` of this rate before each hidden layer's ReLU.
    """

    def __init__(self, features: nn.Module, input_shape: InputShape,
                 hidden_sizes: tuple[int, ...], num_classes: int,
                 scaler_rate: float | None = None):
        super().__init__()
        self.features = features
        layers: list[nn.Module] = [nn.Flatten()]
        in_features = _flat_features(features, input_shape)
        for width in hidden_sizes:
            layers += [nn.Linear(in_features, width), _relu(scaler_rate)]
            in_features = width
        layers.append(nn.Linear(in_features, num_classes))
        self.classifier = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _conv_block(in_ch: int, out_ch: int, padding: int, groups: int = 0,
                scaler_rate: float | None = None) -> nn.Sequential:
    """5x5 conv, optional GroupNorm(``groups``), ReLU, 2x2 max-pool; ``scaler_rate``
    (blocks without a norm only) puts a :class:`Scaler` in the ReLU's slot, before it."""
    if groups and scaler_rate is not None:
        raise ValueError("a Scaler belongs before the norm; only norm-free blocks take one")
    norm = [nn.GroupNorm(groups, out_ch)] if groups else []
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 5, padding=padding), *norm,
                         _relu(scaler_rate), nn.MaxPool2d(2))


def cnn_mcmahan(input_shape: InputShape, num_classes: int) -> ConvNet:
    """McMahan et al., 2017: CNN with two 5x5 'same' convs (32, 64), 2x2 pools,
    a 512-unit FC layer (1,663,370 parameters on 28x28 grayscale, 10 classes)."""
    c = input_shape[0]
    features = nn.Sequential(_conv_block(c, 32, 2), _conv_block(32, 64, 2))
    return ConvNet(features, input_shape, (512,), num_classes)


def cnn_small(input_shape: InputShape, num_classes: int, width: float = 1.0,
              scaler: bool = False) -> ConvNet:
    """Li et al., 2021, "Federated Learning on Non-IID Data Silos: An
    Experimental Study" (NIID-Bench, ICDE): LeNet-like simple CNN with
    unpadded 5x5 convs (6, 16) and FC 120 -> 84 -> classes.

    At ``width`` r the convs and the two hidden FC layers keep :func:`width_units` of
    their units (HeteroFL Sec. 3.1); ``scaler`` puts a :class:`Scaler` on each of their
    outputs, before the ReLU (HeteroFL's ``conv.py``: conv, scaler, norm, ReLU, pool)."""
    c = input_shape[0]
    units = functools.partial(width_units, width=width)
    rate = float(width) if scaler else None
    features = nn.Sequential(_conv_block(c, units(6), 0, scaler_rate=rate),
                             _conv_block(units(6), units(16), 0, scaler_rate=rate))
    return ConvNet(features, input_shape, (units(120), units(84)), num_classes,
                   scaler_rate=rate)


def lenet_gn(input_shape: InputShape, num_classes: int) -> ConvNet:
    """The CNN of Le et al., "DynamicFL" (Table 6 and the reference code): LeNet-5
    (unpadded 5x5 convs 6, 16; FC 120 -> 84 -> classes) with ``GroupNorm(1, C)`` (the
    paper's "layer normalization") after each conv.

    Kaiming-normal (fan_out) conv weights and zero linear biases, as the reference code.
    44,470 parameters on 28x28x1 with 10 classes (48,890 with FEMNIST's 62; 62,050 on
    32x32x3), the paper's 48.9k / 62.1k.
    """
    c = input_shape[0]
    features = nn.Sequential(_conv_block(c, 6, 0, groups=1), _conv_block(6, 16, 0, groups=1))
    model = ConvNet(features, input_shape, (120, 84), num_classes)
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
    return model


def cnn_fedveca(input_shape: InputShape, num_classes: int) -> ConvNet:
    """Luo et al., "FedVeca: Federated Vectorized Averaging on Non-IID Data
    with Adaptive Bi-directional Global Objective": two 5x5x32 'same' convs,
    each with ReLU and 2x2/2 max-pool, FC 256, FC classes.

    Initialised as the reference code: weights ~ truncated normal (std 0.1,
    cut at +-0.2), biases = 0.1.
    """
    c = input_shape[0]
    features = nn.Sequential(_conv_block(c, 32, 2), _conv_block(32, 32, 2))
    model = ConvNet(features, input_shape, (256,), num_classes)
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.trunc_normal_(module.weight, std=0.1, a=-0.2, b=0.2)
            nn.init.constant_(module.bias, 0.1)
    return model


class ProjectionHeadNet(ClassifierModule):
    """MOON's network (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021,
    Sec. 3.3.1 and 4.1; the authors' ``ModelFedCon``): a base encoder, a projection head
    (a 2-layer MLP, Linear(d, d) -> ReLU -> Linear(d, out_dim), out_dim 256 by default) and
    an output layer Linear(out_dim, classes) on the projection.

    ``forward(x)`` returns the logits, so the model is a normal classifier for every
    strategy and for evaluation; ``forward_with_representation(x)`` returns (logits, z)
    with z = R_w(x), the projection head's output that MOON's contrastive loss compares
    (:mod:`strategies.client.moon`).
    """

    def __init__(self, encoder: nn.Module, feature_dim: int, num_classes: int,
                 out_dim: int = 256):
        super().__init__()
        self.encoder = encoder
        self.projection = nn.Sequential(nn.Linear(feature_dim, feature_dim), nn.ReLU(),
                                        nn.Linear(feature_dim, out_dim))
        self.output = nn.Linear(out_dim, num_classes)

    def forward_with_representation(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, z): z = R_w(x), the projection of the encoder's features."""
        z = self.projection(self.encoder(x))
        return self.output(z), z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_representation(x)[0]


def cnn_small_moon(input_shape: InputShape, num_classes: int) -> ProjectionHeadNet:
    """MOON's ``ModelFedCon`` on the simple CNN (the authors' ``simple-cnn`` /
    ``simple-cnn-mnist``): encoder = NIID-Bench's CNN up to its 84-unit layer (unpadded 5x5
    convs 6, 16 with 2x2 max-pools; FC 120 -> 84, ReLU after each), projection head
    Linear(84, 84) -> ReLU -> Linear(84, 256), output Linear(256, classes). 75,046 parameters
    on 28x28x1 with 10 classes. PyTorch's default initialisation, as the authors' code."""
    c = input_shape[0]
    features = nn.Sequential(_conv_block(c, 6, 0), _conv_block(6, 16, 0), nn.Flatten())
    flat = _flat_features(features, input_shape)
    encoder = nn.Sequential(features, nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84),
                            nn.ReLU())
    return ProjectionHeadNet(encoder, 84, num_classes)


def mlp_2nn_moon(input_shape: InputShape, num_classes: int) -> ProjectionHeadNet:
    """MOON's network on McMahan et al.'s 2NN encoder (two ReLU layers of 200): projection
    head Linear(200, 200) -> ReLU -> Linear(200, 256), output Linear(256, classes). For
    non-image data (Synthetic) and fast tests; the MOON paper's small model is
    ``cnn-small-moon``."""
    c, h, w = input_shape
    encoder = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 200), nn.ReLU(),
                            nn.Linear(200, 200), nn.ReLU())
    return ProjectionHeadNet(encoder, 200, num_classes)


class _ScaledGroupNorm(nn.GroupNorm):
    """GroupNorm whose input first passes its ``scaler`` (a :class:`Scaler`, no
    parameters), so the keys are GroupNorm's. GroupNorm is invariant to a positive input
    scale up to its eps, so here the Scaler changes almost nothing (so in HeteroFL's
    ResNet with ``norm='gn'``, where it also precedes the norm)."""

    def __init__(self, num_groups: int, num_channels: int, rate: float):
        super().__init__(num_groups, num_channels)
        self.scaler = Scaler(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.scaler(x))


def _resnet_group_norm(channels: int, scaler_rate: float | None = None) -> nn.GroupNorm:
    """GroupNorm(2, C) where C is even, else GroupNorm(1, C) (widths 1 .. 1/32 keep every
    stage even: 64 r >= 2)."""
    groups = 2 if channels % 2 == 0 else 1
    if scaler_rate is None:
        return nn.GroupNorm(groups, channels)
    return _ScaledGroupNorm(groups, channels, scaler_rate)


class ResNet18GN(ClassifierModule):
    """He et al., 2016, "Deep Residual Learning for Image Recognition" (CVPR):
    torchvision ResNet-18 with GroupNorm(2, C) instead of BatchNorm (Hsieh et
    al., 2020), a 3x3 stride-1 stem and no max-pool for small images.
    Randomly initialised; no weights are ever downloaded.

    At ``width`` r every conv keeps :func:`width_units` of its channels (stages 64, 128,
    256, 512; HeteroFL Sec. 3.1); the input channels and the class outputs never scale.
    GroupNorm rule: 2 groups where the channel count is even, else 1 (width 1 is today's
    GroupNorm(2, C)); its weight and bias scale with their channels. ``scaler`` puts a
    :class:`Scaler` on every conv's output, inside the norm that follows it, before the
    normalisation (HeteroFL's ``resnet.py``: ``n1(scaler(x))``)."""

    def __init__(self, input_shape: InputShape, num_classes: int, width: float = 1.0,
                 scaler: bool = False):
        super().__init__()
        from torchvision.models.resnet import BasicBlock, ResNet  # noqa: PLC0415 - ~170 MB

        units = functools.partial(width_units, width=width)
        rate = float(width) if scaler else None
        norm_layer = functools.partial(_resnet_group_norm, scaler_rate=rate)

        class WidthResNet(ResNet):
            """torchvision's ResNet (the same modules, initialisation and RNG draws as
            ``resnet18``) with every stage's planes mapped by ``units``."""

            def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
                if planes == 64:  # layer1 takes the stem's 64 channels, which scale too
                    self.inplanes = units(64)
                return super()._make_layer(block, units(planes), blocks, stride, dilate)

        self.net = WidthResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes,
                               norm_layer=norm_layer)
        self.net.conv1 = nn.Conv2d(input_shape[0], units(64), 3, stride=1, padding=1,
                                   bias=False)
        if units(64) != 64:  # built by ResNet.__init__ at full width
            self.net.bn1 = norm_layer(units(64))
        if units(512) != 512:
            self.net.fc = nn.Linear(units(512), num_classes)
        self.net.maxpool = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LinearSVM(ClassifierModule):
    """Linear squared-hinge SVM of FedVeca (Luo et al.) for the binary
    even/odd digit task.

    ``f(x) = <w, vec(x)>`` with no bias and ``w`` initialised to zero. Class ids
    are mapped to ``y = +1`` (even) / ``-1`` (odd), and
    ``loss = l2/2 * ||w||^2 + 1/2 * mean(max(0, 1 - y f(x))^2)``.
    """

    def __init__(self, input_shape: InputShape, num_classes: int = 2, l2: float = 0.1):
        super().__init__()
        c, h, w = input_shape
        self.l2 = l2
        self.weight = nn.Parameter(torch.zeros(c * h * w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.weight

    @staticmethod
    def signed_labels(targets: torch.Tensor) -> torch.Tensor:
        """+1 for even class ids, -1 for odd ones."""
        return 1.0 - 2.0 * (targets % 2).float()

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        margins = self.signed_labels(targets) * outputs
        hinge = torch.clamp(1.0 - margins, min=0.0).pow(2).mean()
        return 0.5 * self.l2 * self.weight.pow(2).sum() + 0.5 * hinge

    def num_correct(self, outputs: torch.Tensor, targets: torch.Tensor) -> int:
        return int((self.signed_labels(targets) * outputs > 0).sum().item())


_BUILDERS: dict[str, Callable[[InputShape, int], ClassifierModule]] = {
    "mlp-2nn": MLP2NN,
    "mlp-2nn-moon": mlp_2nn_moon,
    "cnn-mcmahan": cnn_mcmahan,
    "cnn-small": cnn_small,
    "cnn-small-moon": cnn_small_moon,
    "lenet-gn": lenet_gn,
    "cnn-fedveca": cnn_fedveca,
    "resnet18-gn": ResNet18GN,
    "svm": LinearSVM,
}

if tuple(_BUILDERS) != MODEL_NAMES:  # one list of names, kept where torch is not needed
    raise ImportError(f"task.models builds {tuple(_BUILDERS)} but task.model_names lists "
                      f"{MODEL_NAMES}: make them equal")


# the models build_model scales in width, and width_spec describes


def _check_width(name: str, width, scaler) -> None:
    if name not in _BUILDERS:
        raise ValueError(f"Unknown model name {name!r}; valid names: {', '.join(MODEL_NAMES)}")
    if (not isinstance(width, numbers.Real) or isinstance(width, bool)
            or not 0.0 < float(width) <= 1.0):
        raise ValueError(f"width={width!r} must be a number in (0, 1], e.g. 0.5 for half "
                         f"width (1.0: the full model)")
    if not isinstance(scaler, bool):
        raise ValueError(f"scaler={scaler!r} must be True or False")
    if name not in WIDTH_MODELS and (float(width) != 1.0 or scaler):
        raise ValueError(f"model {name!r} does not scale in width (width={width!r}, "
                         f"scaler={scaler!r}); use width=1.0 and scaler=False with it, or a "
                         f"width-scalable model: {', '.join(WIDTH_MODELS)}")


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int,
                width: float = 1.0, scaler: bool = False) -> ClassifierModule:
    """Build the model registered as ``name`` for ``(C, H, W)`` inputs.

    ``width`` in (0, 1] shrinks every hidden layer to :func:`width_units` of its units
    (only :data:`WIDTH_MODELS`; 1.0 is the full model, the same parameters and RNG draws
    as without the argument); ``scaler`` adds HeteroFL's :class:`Scaler` after each scaled
    layer (HeteroFL Sec. 3; only :data:`WIDTH_MODELS`).

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`MODEL_NAMES`, ``width`` is not in (0, 1], or
        ``width != 1`` or ``scaler`` is asked of a model not in :data:`WIDTH_MODELS`.
    """
    _check_width(name, width, scaler)
    if name in WIDTH_MODELS:
        return _BUILDERS[name](tuple(input_shape), num_classes, width=width, scaler=scaler)
    return _BUILDERS[name](tuple(input_shape), num_classes)


def width_spec(name: str, input_shape: tuple[int, int, int], num_classes: int
               ) -> dict[str, tuple]:
    """Per parameter key of the full-width model's state_dict, per array axis: None (never
    scales: first inputs, class outputs, kernels) or ``(hidden_dimension, repeat)``, the
    arguments of ``strategies.engine.submodel_math.HiddenUnits`` (repeat = entries per unit: H*W
    of the feature map after cnn-small's flatten, else 1).

    mlp-2nn: dimensions ``fc1``, ``fc2``. cnn-small: ``conv1``, ``conv2``, ``fc1``,
    ``fc2``. resnet18-gn: ``layerI`` for stage I's block outputs, shared by everything a residual adds together (the stem
    with layer1, each downsample with its stage), and ``layerI.J.conv1`` for a block's
    inner channels.
    """
    _check_width(name, 1.0, False)
    if name == "mlp-2nn":
        return {"net.1.weight": (("fc1", 1), None), "net.1.bias": (("fc1", 1),),
                "net.3.weight": (("fc2", 1), ("fc1", 1)), "net.3.bias": (("fc2", 1),),
                "net.5.weight": (None, ("fc2", 1)), "net.5.bias": (None,)}
    if name == "cnn-small":
        return _cnn_small_spec(tuple(input_shape), num_classes)
    if name == "resnet18-gn":
        return _resnet18_spec()
    raise ValueError(f"model {name!r} does not scale in width; width_spec describes only "
                     f"{', '.join(WIDTH_MODELS)}")


def _cnn_small_spec(input_shape: InputShape, num_classes: int) -> dict[str, tuple]:
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream alone
        features = cnn_small(input_shape, num_classes).features
    with torch.no_grad():
        _, _, height, width = features(torch.zeros(1, *input_shape)).shape  # feature map
    spec: dict[str, tuple] = {}
    conv_in = None
    for index, dim in enumerate(("conv1", "conv2")):
        spec[f"features.{index}.0.weight"] = ((dim, 1), conv_in, None, None)
        spec[f"features.{index}.0.bias"] = ((dim, 1),)
        conv_in = (dim, 1)
    fc_in = ("conv2", height * width)  # flatten: channel c -> inputs c*H*W .. c*H*W+H*W-1
    for index, dim in ((1, "fc1"), (3, "fc2")):
        spec[f"classifier.{index}.weight"] = ((dim, 1), fc_in)
        spec[f"classifier.{index}.bias"] = ((dim, 1),)
        fc_in = (dim, 1)
    spec["classifier.5.weight"] = (None, fc_in)
    spec["classifier.5.bias"] = (None,)
    return spec


def _resnet18_spec() -> dict[str, tuple]:
    def conv(out, inp):
        return (out, inp, None, None)

    def norm(prefix, dim):
        return {f"{prefix}.weight": (dim,), f"{prefix}.bias": (dim,)}

    spec: dict[str, tuple] = {"net.conv1.weight": conv(("layer1", 1), None),
                              **norm("net.bn1", ("layer1", 1))}
    stage_in = ("layer1", 1)  # layer1's blocks add their outputs to the stem's
    for stage in range(1, 5):
        stage_out = (f"layer{stage}", 1)
        for block in range(2):
            prefix = f"net.layer{stage}.{block}"
            inner = (f"layer{stage}.{block}.conv1", 1)
            block_in = stage_in if block == 0 else stage_out
            spec[f"{prefix}.conv1.weight"] = conv(inner, block_in)
            spec.update(norm(f"{prefix}.bn1", inner))
            spec[f"{prefix}.conv2.weight"] = conv(stage_out, inner)
            spec.update(norm(f"{prefix}.bn2", stage_out))
            if block == 0 and stage > 1:
                spec[f"{prefix}.downsample.0.weight"] = conv(stage_out, stage_in)
                spec.update(norm(f"{prefix}.downsample.1", stage_out))
        stage_in = stage_out
    spec["net.fc.weight"] = (None, stage_in)
    spec["net.fc.bias"] = (None,)
    return spec


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

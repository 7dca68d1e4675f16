"""Model zoo for federated image classification (PyTorch only).

Every model subclasses :class:`ClassifierModule`, which carries its own loss and
accuracy counting so that training code never needs to know which model it runs.
Flattened feature sizes are always computed from ``input_shape``, never hard-coded.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .model_names import MODEL_NAMES, REPRESENTATION_MODELS  # noqa: F401 - re-exported

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


def _flat_features(features: nn.Module, input_shape: InputShape) -> int:
    """Size of ``features(x).flatten(1)`` for one input of ``input_shape``."""
    with torch.no_grad():
        return features(torch.zeros(1, *input_shape)).flatten(1).shape[1]


class MLP2NN(ClassifierModule):
    """McMahan et al., 2017, "Communication-Efficient Learning of Deep Networks
    from Decentralized Data" (AISTATS): the "2NN", two hidden layers of 200
    ReLU units (199,210 parameters on 28x28 grayscale, 10 classes)."""

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: int = 200):
        super().__init__()
        c, h, w = input_shape
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c * h * w, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
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
    """

    def __init__(self, features: nn.Module, input_shape: InputShape,
                 hidden_sizes: tuple[int, ...], num_classes: int):
        super().__init__()
        self.features = features
        layers: list[nn.Module] = [nn.Flatten()]
        in_features = _flat_features(features, input_shape)
        for width in hidden_sizes:
            layers += [nn.Linear(in_features, width), nn.ReLU()]
            in_features = width
        layers.append(nn.Linear(in_features, num_classes))
        self.classifier = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _conv_block(in_ch: int, out_ch: int, padding: int, groups: int = 0) -> nn.Sequential:
    """5x5 conv, optional GroupNorm(``groups``), ReLU, 2x2 max-pool."""
    norm = [nn.GroupNorm(groups, out_ch)] if groups else []
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 5, padding=padding), *norm,
                         nn.ReLU(), nn.MaxPool2d(2))


def cnn_mcmahan(input_shape: InputShape, num_classes: int) -> ConvNet:
    """McMahan et al., 2017: CNN with two 5x5 'same' convs (32, 64), 2x2 pools,
    a 512-unit FC layer (1,663,370 parameters on 28x28 grayscale, 10 classes)."""
    c = input_shape[0]
    features = nn.Sequential(_conv_block(c, 32, 2), _conv_block(32, 64, 2))
    return ConvNet(features, input_shape, (512,), num_classes)


def cnn_small(input_shape: InputShape, num_classes: int) -> ConvNet:
    """Li et al., 2021, "Federated Learning on Non-IID Data Silos: An
    Experimental Study" (NIID-Bench, ICDE): LeNet-like simple CNN with
    unpadded 5x5 convs (6, 16) and FC 120 -> 84 -> classes."""
    c = input_shape[0]
    features = nn.Sequential(_conv_block(c, 6, 0), _conv_block(6, 16, 0))
    return ConvNet(features, input_shape, (120, 84), num_classes)


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


class ResNet18GN(ClassifierModule):
    """He et al., 2016, "Deep Residual Learning for Image Recognition" (CVPR):
    torchvision ResNet-18 with GroupNorm(2, C) instead of BatchNorm (Hsieh et
    al., 2020), a 3x3 stride-1 stem and no max-pool for small images.
    Randomly initialised; no weights are ever downloaded."""

    def __init__(self, input_shape: InputShape, num_classes: int):
        super().__init__()
        import torchvision  # noqa: PLC0415 - ~170 MB resident; only this model needs it

        self.net = torchvision.models.resnet18(
            weights=None, num_classes=num_classes,
            norm_layer=functools.partial(nn.GroupNorm, 2))
        self.net.conv1 = nn.Conv2d(input_shape[0], 64, 3, stride=1, padding=1, bias=False)
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


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> ClassifierModule:
    """Build the model registered as ``name`` for ``(C, H, W)`` inputs.

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`MODEL_NAMES`.
    """
    if name not in _BUILDERS:
        raise ValueError(f"Unknown model name {name!r}; valid names: {', '.join(MODEL_NAMES)}")
    return _BUILDERS[name](tuple(input_shape), num_classes)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

"""Tiny torch data and models shared by the training tests."""

from __future__ import annotations

import torch
from torch import nn

from task.models import ClassifierModule, build_model

SHAPE = (1, 4, 4)
NUM_CLASSES = 3


def tiny_data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *SHAPE, generator=g), torch.randint(0, NUM_CLASSES, (n,), generator=g)


def tiny_model(seed: int = 0) -> ClassifierModule:
    torch.manual_seed(seed)
    return build_model("mlp-2nn", SHAPE, NUM_CLASSES)


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def all_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


class Quadratic(ClassifierModule):
    """One parameter w, loss 0.5 * (w - 3)^2 whatever the data."""

    def __init__(self, w0: float = 0.0):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([w0], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(x), 1, dtype=torch.float64)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((self.w - 3.0) ** 2).sum()

"""Evaluation of a model on held-in tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models import ClassifierModule


@dataclass(frozen=True)
class EvalResult:
    num_examples: int
    loss: float
    accuracy: float


@torch.no_grad()
def evaluate(model: ClassifierModule, x: torch.Tensor, y: torch.Tensor, batch_size: int = 128) -> EvalResult:
    """Mean loss and top-1 accuracy (``model.num_correct``) over (x, y)."""
    model.eval()
    n = len(y)
    if n == 0:
        return EvalResult(0, float("nan"), float("nan"))
    loss_sum, correct = 0.0, 0
    for start in range(0, n, batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        out = model(xb)
        loss_sum += float(model.loss(out, yb)) * len(yb)
        correct += model.num_correct(out, yb)
    return EvalResult(num_examples=n, loss=loss_sum / n, accuracy=correct / n)

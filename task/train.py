"""Local solvers: minibatch SGD for E epochs or a fixed number of steps.

One function, :func:`local_sgd`, covers FedAvg's ClientUpdate (McMahan et al.
Alg. 1), FedSGD (E = 1, B = full), momentum / weight decay, and FedProx's proximal
term (Li et al. MLSys'20): the gradient gets mu * (w - w_global), i.e. the local
objective is F_k(w) + (mu/2) * ||w - w_global||^2. With mu = 0 no proximal code
runs at all, so FedProx(mu=0) is bit-identical to FedAvg for the same seed.

The minibatch order (:func:`strategies.client.batches.batch_indices`, seeded by
:func:`strategies.client.batches.client_seed`) is the one FedVeca's client helper uses,
so a FedVeca round and a local_sgd run with the same seed see the same batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from strategies.client.batches import batch_indices, client_seed
from strategies.sampling import steps_for_epochs  # u_k = floor(E n_k / B): one definition

from .models import ClassifierModule

__all__ = ["LocalResult", "batch_indices", "client_seed", "local_sgd", "resolve_device",
           "steps_for_epochs"]


@dataclass(frozen=True)
class LocalResult:
    """What the strategies need from local training."""

    num_examples: int
    local_steps: int
    train_loss: float


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' picks CUDA when present, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def local_sgd(
    model: ClassifierModule,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    batch_size: int,
    epochs: float = 1,
    steps: int = 0,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    proximal_mu: float = 0.0,
    seed: int = 0,
    after_step: Callable[[torch.nn.Module], None] | None = None,
    before_step: Callable[[torch.nn.Module], None] | None = None,
    forward: Callable[[torch.nn.Module, torch.Tensor],
                      tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> LocalResult:
    """Train ``model`` in place on (x, y); ``steps`` > 0 overrides ``epochs``.

    E epochs mean floor(E n / B) steps of exactly B examples (see batch_indices).
    Hooks of the strategies' client helpers:

    * ``forward(model, x) -> (outputs, extra)`` replaces ``model(x)``; ``extra`` is added to
      the loss that is differentiated (MOON's mu l_con,
      :meth:`strategies.client.moon.MoonClient.forward`);
    * ``before_step(model)`` runs after ``backward()``, before the optimiser step (FedDyn's
      regulariser gradient, :meth:`strategies.client.feddyn.FedDynClient.regularise`);
    * ``after_step(model)`` runs after every optimiser step (SCAFFOLD's correction,
      :meth:`strategies.client.scaffold.ScaffoldClient.correct`).

    Data and model must already be on the same device. The batch order depends only
    on ``seed``. Returns the number of examples, the SGD steps taken (tau_i) and the
    mean minibatch loss over those steps (the model's own loss, without ``extra`` or a
    proximal / FedDyn term).
    """
    n = len(y)
    if n == 0:
        return LocalResult(num_examples=0, local_steps=0, train_loss=float("nan"))
    total_steps = steps if steps > 0 else steps_for_epochs(n, batch_size, epochs)
    if total_steps < 1:
        raise ValueError(f"local work must be at least one step, "
                         f"got epochs={epochs}, steps={steps}")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                                weight_decay=weight_decay)
    anchor = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else None
    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    batches = batch_indices(n, batch_size, generator)
    for _ in range(total_steps):
        idx = next(batches).to(x.device)
        optimizer.zero_grad(set_to_none=True)
        if forward is None:
            loss = model.loss(model(x[idx]), y[idx])
            loss.backward()
        else:
            outputs, extra = forward(model, x[idx])
            loss = model.loss(outputs, y[idx])
            (loss + extra).backward()
        if anchor is not None:
            with torch.no_grad():
                for p, p0 in zip(model.parameters(), anchor):
                    if p.grad is not None:
                        p.grad.add_(p - p0, alpha=proximal_mu)
        if before_step is not None:
            before_step(model)
        optimizer.step()
        if after_step is not None:
            after_step(model)
        loss_sum += loss.detach()
    return LocalResult(num_examples=n, local_steps=total_steps,
                       train_loss=float(loss_sum) / total_steps)

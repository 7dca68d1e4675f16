"""The local-SGD loop: every local step of every fedhetero client runs here.

:func:`sgd_steps` is the loop itself: for each minibatch, ``zero_grad``, the loss,
``backward``, an optional look at the gradients, ``optimizer.step()``. It runs whatever
optimiser it is given (the user's own: SGD with momentum, Adam, weight decay, ...), and
the strategies' client work enters through two hooks of the loop and through the
optimiser's own step hooks:

=====================  ===================================  ===============================
where                  what                                 who
=====================  ===================================  ===============================
``forward(model, x)``  extra loss term added to the loss    MOON's mu l_con (Li, He and
                       that is differentiated               Song 2021, Eqs. 3-4)
``on_gradients``       reads / changes ``.grad`` after      FedVeca's gradient capture
(model, x, y)          ``backward()``, before the step      (Alg. 2 lines 15-18); DynamicFL's
                                                            optional clipping
optimiser pre-step     adds a gradient term before every    FedProx's mu (w - w^t) (Li et al.
hook                   step (``torch.optim.Optimizer.       2020, Eq. 2); FedDyn's linear
                       register_step_pre_hook``)            term (Acar et al. 2021, Alg. 1)
optimiser post-step    moves the weights after every step   SCAFFOLD's correction
hook                   (``register_step_post_hook``)        (Karimireddy et al. 2020, Alg. 1
                                                            line 10)
=====================  ===================================  ===============================

The optimiser hooks are what the helpers' ``wrap(optimizer)`` methods install
(:class:`strategies.client.ProximalTerm`, :class:`strategies.client.ScaffoldClient`,
:class:`strategies.client.FedDynClient`), so the same correction reaches a user's own
training loop and this one. Batches come from the caller: :func:`local_sgd` cuts E epochs
(floor(E n / B) steps, :func:`strategies.contract.steps_for_epochs`) or a fixed number of
steps from :func:`strategies.client.batches.batch_indices`; DynamicFL's chunks cut rows
[s, s + k) of the round's stream (:func:`strategies.client.dynamicfl.run_chunk`).

torch is imported inside the functions: ``import strategies.client`` needs no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .. import contract as C
from .batches import batch_indices

LossFn = Callable[[Any, Any], Any]
Forward = Callable[[Any, Any], tuple[Any, Any]]
OnGradients = Callable[[Any, Any, Any], None]


@dataclass(frozen=True)
class LocalResult:
    """What the strategies need from local training: |D_i|, tau_i and the mean minibatch
    loss over the tau_i steps (the model's own loss, without extra or hook terms)."""

    num_examples: int
    local_steps: int
    train_loss: float


def default_loss(model: Any) -> LossFn:
    """The model's own ``loss(outputs, targets)`` when it has one, else mean cross-entropy."""
    import torch.nn.functional as F  # noqa: PLC0415, N812  (lazy: no torch at import)

    own = getattr(model, "loss", None)
    return own if callable(own) else F.cross_entropy


def plain_sgd(model: Any, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
              nesterov: bool = False) -> Any:
    """``torch.optim.SGD`` over the model's parameters: the optimiser a helper builds when
    the caller gives none (``nesterov`` only with momentum > 0, as torch requires)."""
    import torch  # noqa: PLC0415

    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                           weight_decay=weight_decay, nesterov=bool(nesterov) and momentum > 0)


def sgd_steps(model: Any, optimizer: Any, batches: Iterable[tuple[Any, Any]], *,
              loss_fn: LossFn | None = None, forward: Forward | None = None,
              on_gradients: OnGradients | None = None) -> tuple[int, float]:
    """Run one optimiser step per minibatch ``(x, y)`` of ``batches``, in place.

    Parameters
    ----------
    model
        The torch module being trained (put in train mode here).
    optimizer
        Any ``torch.optim.Optimizer`` over the model's parameters, with whatever step hooks
        the strategies' helpers installed on it (module docstring).
    batches
        Minibatches ``(x, y)`` on the model's device; one step each.
    loss_fn
        ``loss_fn(outputs, y)``, a batch mean; default: ``model.loss`` or cross-entropy.
    forward
        ``forward(model, x) -> (outputs, extra)`` instead of ``model(x)``; ``extra`` is added
        to the loss that is differentiated (MOON's mu l_con,
        :meth:`strategies.client.MoonClient.forward`).
    on_gradients
        ``on_gradients(model, x, y)`` after ``backward()``, before ``optimizer.step()``
        (FedVeca's gradient capture).

    Returns
    -------
    (steps, mean loss)
        The steps taken and the mean of ``loss_fn`` over them (without ``extra``), summed
        in float64; NaN for no step.
    """
    import torch  # noqa: PLC0415

    loss_fn = loss_fn or default_loss(model)
    model.train()
    steps, loss_sum = 0, None
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        if forward is None:
            loss = loss_fn(model(x), y)
            loss.backward()
        else:
            outputs, extra = forward(model, x)
            loss = loss_fn(outputs, y)
            (loss + extra).backward()
        if on_gradients is not None:
            on_gradients(model, x, y)
        optimizer.step()
        detached = loss.detach()
        loss_sum = detached.to(torch.float64) if loss_sum is None else loss_sum + detached
        steps += 1
    return steps, (float(loss_sum) / steps if steps else float("nan"))


def epoch_batches(x: Any, y: Any, batch_size: int, num_steps: int,
                  seed: int) -> Iterable[tuple[Any, Any]]:
    """``num_steps`` minibatches of B examples of (x, y), cut from one fresh permutation per
    epoch (:func:`strategies.client.batches.batch_indices`, ``torch.Generator`` seeded by
    ``seed``; B = 0 or B >= n: the full local batch every step)."""
    import torch  # noqa: PLC0415

    stream = batch_indices(len(y), batch_size, torch.Generator().manual_seed(seed))
    for _ in range(num_steps):
        idx = next(stream).to(x.device)
        yield x[idx], y[idx]


def step_count(num_examples: int, batch_size: int, epochs: float, steps: int) -> int:
    """The local steps of a call: ``steps`` if > 0, else floor(E n / B)
    (:func:`strategies.contract.steps_for_epochs`); a ValueError if that is < 1."""
    total = steps if steps > 0 else C.steps_for_epochs(num_examples, batch_size, epochs)
    if total < 1:
        raise ValueError(f"local work must be at least one step, got epochs={epochs}, "
                         f"steps={steps}")
    return total


def local_sgd(
    model: Any,
    x: Any,
    y: Any,
    *,
    batch_size: int,
    epochs: float = 1,
    steps: int = 0,
    seed: int = 0,
    optimizer: Any = None,
    lr: float | None = None,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    proximal_mu: float = 0.0,
    forward: Forward | None = None,
    on_gradients: OnGradients | None = None,
    loss_fn: LossFn | None = None,
) -> LocalResult:
    """E epochs (floor(E n / B) steps) or ``steps`` > 0 steps of local SGD on (x, y), in place.

    FedAvg's ClientUpdate (McMahan et al. 2017, Alg. 1) as fedhetero runs it: minibatches
    of exactly B examples cut from one fresh permutation per epoch, in an order that
    depends only on ``seed``. Covers FedSGD (E = 1, B = 0), momentum and weight decay (the
    optimiser's), FedProx's proximal term, and every hook of :func:`sgd_steps`.

    Parameters
    ----------
    model, x, y
        The model and the local data, on one device.
    batch_size, epochs, steps, seed
        B (0: full batch), E, a fixed step count that overrides E, the batch-order seed
        (:func:`strategies.client.client_seed` gives a client's seed for a round).
    optimizer
        The optimiser to run (the caller's own, possibly wrapped by a helper); None builds
        ``torch.optim.SGD(lr, momentum, weight_decay)`` (:func:`plain_sgd`).
    lr, momentum, weight_decay
        Only without ``optimizer``; ``lr`` is then required.
    proximal_mu
        mu > 0 adds FedProx's mu (w - w^t) to every gradient for this call
        (:class:`strategies.client.ProximalTerm`, Li et al. 2020, Eq. 2); mu = 0 runs no
        proximal code at all, so FedProx(mu=0) is FedAvg bit for bit.
    forward, on_gradients, loss_fn
        As :func:`sgd_steps`.

    Returns
    -------
    LocalResult
        n, the steps taken tau_i, and the mean minibatch loss (the model's own loss). An
        empty (x, y) takes no step: (0, 0, NaN).
    """
    from .fedprox import ProximalTerm  # noqa: PLC0415  (fedprox imports this module)

    n = len(y)
    if n == 0:
        return LocalResult(num_examples=0, local_steps=0, train_loss=float("nan"))
    total = step_count(n, batch_size, epochs, steps)
    if optimizer is None:
        if lr is None:
            raise ValueError("local_sgd needs an optimizer or an lr (for torch.optim.SGD)")
        optimizer = plain_sgd(model, lr, momentum, weight_decay)
    elif lr is not None or momentum or weight_decay:
        raise ValueError("local_sgd got an optimizer and lr / momentum / weight_decay: the "
                         "optimizer's own settings are used; leave the others out")
    proximal = ProximalTerm(model, proximal_mu) if proximal_mu > 0 else None
    if proximal is not None:
        proximal.wrap(optimizer)
    try:
        taken, loss = sgd_steps(model, optimizer, epoch_batches(x, y, batch_size, total, seed),
                                loss_fn=loss_fn, forward=forward, on_gradients=on_gradients)
    finally:
        if proximal is not None:
            proximal.unwrap()
    return LocalResult(num_examples=n, local_steps=taken, train_loss=loss)

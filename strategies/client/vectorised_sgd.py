"""Vectorised local SGD: K clients with the same model shape trained together, one batched
step at a time.

The per-client loop (:func:`strategies.client.sgd_steps`) runs every client as its own
sequence of small kernels. Here the K clients' parameters are stacked, shape (K, ...), and
each step is one call of ``torch.func.vmap(torch.func.grad_and_value(loss))`` over the
clients still training (``torch.func.functional_call`` runs the one model object with each
client's weights), then torch's own functional SGD update, :func:`torch.optim.sgd.sgd`
(the function ``torch.optim.SGD.step`` calls), on the stacked tensors: the same
weight-decay, momentum and Nesterov arithmetic, element by element.

Clients take different numbers of steps (E epochs of different n). They come ordered by
their step counts, most first, so the clients still training at step s are a prefix
[0, a); a finished client's rows are never touched again ("masked out" by slicing, with
no arithmetic on them).

Same numbers as the loop up to float32 rounding: a batched convolution sums in another
order than K single ones (the tolerance is stated and tested in tests/test_vectorised.py).
A strategy's per-step term enters through ``before_step`` (FedProx's mu (w - w^t), the
same function :class:`strategies.client.ProximalTerm` applies in the loop).

torch is imported inside the functions: ``import strategies.client`` needs no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .sgd_loop import default_loss

# before_step(grads, params, active): changes the active clients' stacked grads in place
BeforeStep = Callable[[dict[str, Any], dict[str, Any], int], None]
# batches(step, active) -> (x, y) of the active clients, shapes (active, B, ...), (active, B)
StackedBatches = Callable[[int, int], tuple[Any, Any]]


def stacked(states: Sequence[Mapping[str, Any]], like: Mapping[str, Any]) -> dict[str, Any]:
    """The clients' tensors named in ``like``, stacked along a new first dimension (K, ...)
    with the device and dtype of ``like``'s tensor of that name (as ``load_state_dict``
    casts a received model: Flower's FedOpt sends float64); clients holding the very same
    tensor (one received global model) share one conversion, repeated K times. A ValueError
    names a client whose tensor is missing or has another shape, or that has others."""
    import torch  # noqa: PLC0415

    for k, state in enumerate(states):
        extra = sorted(set(state) - set(like))
        if extra:
            raise ValueError(f"client {k}: the received model has {extra}, which the model "
                             f"has not")
    out = {}
    for name, ref in like.items():
        for k, state in enumerate(states):
            if name not in state or tuple(state[name].shape) != tuple(ref.shape):
                got = tuple(state[name].shape) if name in state else "nothing"
                raise ValueError(f"client {k}: the received model's '{name}' is {got}, the "
                                 f"model's is {tuple(ref.shape)}")
        first = states[0][name]
        if all(state[name] is first for state in states):
            tensor = first.detach().to(ref.device, ref.dtype).unsqueeze(0)
            out[name] = tensor.repeat(len(states), *([1] * first.dim()))
        else:
            out[name] = torch.stack([state[name].detach().to(ref.device, ref.dtype)
                                     for state in states])
    return out


def vectorised_sgd(model: Any, params: dict[str, Any], batches: StackedBatches,
                   steps: Sequence[int], *, lr: float, momentum: float = 0.0,
                   weight_decay: float = 0.0, nesterov: bool = False,
                   loss_fn: Callable[[Any, Any], Any] | None = None,
                   before_step: BeforeStep | None = None) -> list[float]:
    """Train K stacked clients in place: client k takes ``steps[k]`` SGD steps.

    Parameters
    ----------
    model
        The torch module whose ``forward`` every client runs (its own weights are not used
        or changed; buffers, e.g. batch-norm statistics, are not supported: give a model
        without any).
    params
        Parameter name -> stacked tensor (K, ...), changed in place.
    batches
        ``batches(step, active)``: the minibatches (x, y) of clients 0 .. active - 1 for
        that step, stacked (active, B, ...) and (active, B).
    steps
        tau_k per client, non-increasing, each >= 1.
    lr, momentum, weight_decay, nesterov
        ``torch.optim.SGD``'s (dampening 0), the same for every client.
    loss_fn
        ``loss_fn(outputs, y)``, a batch mean; default: ``model.loss`` or cross-entropy.
    before_step
        ``before_step(grads, params, active)`` after the gradients, before the update: a
        per-step gradient term on the active clients' rows (views of the stacked tensors).

    Returns
    -------
    list of float
        Each client's mean minibatch loss over its steps (summed in float64), as
        :func:`strategies.client.sgd_steps` returns it.
    """
    import torch  # noqa: PLC0415
    from torch.func import functional_call, grad_and_value, vmap  # noqa: PLC0415
    from torch.optim.sgd import sgd  # noqa: PLC0415

    steps = [int(s) for s in steps]
    if not steps or min(steps) < 1 or any(a < b for a, b in zip(steps, steps[1:])):
        raise ValueError(f"steps must be >= 1 and non-increasing (most first), got {steps}")
    if any(True for _ in model.buffers()):
        raise ValueError("vectorised_sgd: the model has buffers (e.g. batch-norm running "
                         "statistics); train it with the per-client loop (sgd_steps)")
    loss_fn = loss_fn or default_loss(model)
    model.train()

    def client_loss(p: dict[str, Any], x: Any, y: Any) -> Any:
        return loss_fn(functional_call(model, p, (x,)), y)

    step_all = vmap(grad_and_value(client_loss))
    names = list(params)
    buffers: list[Any] = [None] * len(names)
    device = next(iter(params.values())).device
    loss_sums = torch.zeros(len(steps), dtype=torch.float64, device=device)
    for step in range(steps[0]):
        active = sum(1 for s in steps if s > step)
        views = {name: params[name][:active] for name in names}
        x, y = batches(step, active)
        grads, losses = step_all(views, x, y)
        if before_step is not None:
            before_step(grads, views, active)
        momentum_views = [None if b is None else b[:active] for b in buffers]
        sgd([views[n] for n in names], [grads[n] for n in names], momentum_views,
            weight_decay=weight_decay, momentum=momentum, lr=lr, dampening=0.0,
            nesterov=nesterov, maximize=False)
        if step == 0:  # every client takes a first step: the momentum buffers are K long
            buffers = momentum_views
        loss_sums[:active] += losses.detach().to(torch.float64)
    return [total / count for total, count in zip(loss_sums.cpu().tolist(), steps)]

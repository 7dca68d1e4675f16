"""FedProx's client side (Li et al., MLSys 2020, Eq. 2), on the user's own optimiser.

FedProx's client minimises h_k(w; w^t) = F_k(w) + (mu / 2) ||w - w^t||^2 around the
received model w^t, i.e. every local gradient gets mu (w - w^t). A stock ClientApp that
ignores the server's ``proximal-mu`` (Flower's key) runs FedAvg locally and the server
cannot tell; :class:`ProximalTerm` adds the term to any loop::

    if is_fedprox_message(msg):                      # the config carries proximal-mu
        ProximalTerm(model, msg.content["config"]["proximal-mu"]).wrap(optimizer)
    train_loss = your_training_loop(model, optimizer, ...)

The term enters ``.grad`` before each step (an optimiser pre-step hook), so the
optimiser's momentum and weight decay act on the whole of h_k.
"""

from __future__ import annotations

from typing import Any

from flwr.app import Message

from .. import contract as C
from ..engine.records import sent_config
from .optimizer_hooks import StepHooks
from .sides import ClientSide, TrainTask, register_client_side


def add_proximal_term(grads: Any, params: Any, anchors: Any, mu: float) -> None:
    """``g += mu (w - w^t)`` for each (gradient, weight, anchor) triple, in place: the
    gradient of FedProx's (mu / 2) ||w - w^t||^2 (Li et al. 2020, Eq. 2). Any shapes that
    broadcast: one client's tensors in the loop, K stacked clients' in the vectorised one
    (:func:`strategies.client.vectorised_sgd.vectorised_sgd`)."""
    for g, p, p0 in zip(grads, params, anchors):
        g.add_(p - p0, alpha=mu)


def is_fedprox_message(msg: Message) -> bool:
    """True when a train message's config carries ``proximal-mu`` (a FedProx server)."""
    return C.PROXIMAL_MU in (sent_config(msg.content) or {})


class ProximalTerm:
    """mu (w - w^t) added to every parameter's gradient, w^t the weights at construction.

    Parameters
    ----------
    model
        The local model holding the received global model w^t (copied here).
    mu
        mu >= 0 (``proximal-mu``); 0 makes :meth:`apply` a no-op.
    """

    def __init__(self, model: Any, mu: float) -> None:
        mu = float(mu)
        if not mu >= 0:
            raise ValueError(f"proximal-mu must be >= 0, got {mu}")
        self.mu = mu
        self.model = model
        self.anchor = [p.detach().clone() for p in model.parameters()]  # w^t
        self._hooks = StepHooks()

    def apply(self) -> None:
        """``p.grad += mu (p - p^t)`` for every parameter that has a gradient: call it after
        ``loss.backward()``, before ``optimizer.step()`` (or let :meth:`wrap` do it)."""
        import torch  # noqa: PLC0415  (lazy: strategies never needs torch at import)

        if self.mu == 0:
            return
        with torch.no_grad():
            pairs = [(p, p0) for p, p0 in zip(self.model.parameters(), self.anchor)
                     if p.grad is not None]
            add_proximal_term([p.grad for p, _ in pairs], [p for p, _ in pairs],
                              [p0 for _, p0 in pairs], self.mu)

    def wrap(self, optimizer: Any, model: Any = None) -> Any:
        """Apply the term before every ``optimizer.step()``; returns ``optimizer``
        (``model``: unused, the one of the constructor)."""
        self._hooks.install("ProximalTerm", optimizer, before=self.apply)
        return optimizer

    def unwrap(self) -> None:
        """Take the term off the optimiser."""
        self._hooks.remove()


def proximal_hook(task: TrainTask) -> ProximalTerm:
    """FedProx's client side on the one local-SGD loop: the term with the sent mu."""
    return ProximalTerm(task.model, float(task.msg.content[C.CONFIG][C.PROXIMAL_MU]))


register_client_side(ClientSide(
    "strategies.client.ProximalTerm",  # mu = 0 runs no proximal code at all: FedAvg bit for bit
    lambda msg: is_fedprox_message(msg) and float(msg.content[C.CONFIG][C.PROXIMAL_MU]) > 0,
    hook=proximal_hook))

"""MOON's client side (Li, He and Song, CVPR 2021, Algorithm 1, Eqs. (3)-(4)), for any
PyTorch training loop.

The model must expose its representation R_w(x), the output of the projection head, the
network before its output layer (Sec. 3.3.1). Either the model has a method
``forward_with_representation(x) -> (logits, z)`` (fedhetero's ``cnn-small-moon`` and
``mlp-2nn-moon`` do), or :class:`MoonClient` is given a function
``representation(model, x) -> (logits, z)``. A user's own model needs a few lines::

    class Net(nn.Module):
        def forward_with_representation(self, x):
            z = self.projection(self.encoder(x))       # R_w(x)
            return self.output(z), z
        def forward(self, x):
            return self.forward_with_representation(x)[0]

:class:`MoonClient` keeps frozen copies of the received global model w^t and of this
client's previous local model w_i^{t-1} (from ``Context.state``, or the server's copy:
:func:`strategies.client.state.resolve_state`); the loop calls :meth:`~MoonClient.forward`
instead of ``model(x)``, adds the contrastive term it returns to its supervised loss, and
calls :meth:`~MoonClient.finish` at the end, which keeps the trained model in
``Context.state`` as the next round's w_i^{t-1} and builds the reply::

    moon = MoonClient(msg, context.state, model)   # w^t, w_i^{t-1}, mu, tau
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)   # your own
    train_loss = 0.0
    for batch in loader:
        optimizer.zero_grad()
        logits, contrastive = moon.forward(model, batch["img"])   # mu * l_con
        loss = F.cross_entropy(logits, batch["label"])
        (loss + contrastive).backward()                            # Eq. (4)
        optimizer.step()
        train_loss += loss.item() / len(loader)
    content = moon.finish(model, {"train_loss": train_loss,
                                  "num-examples": len(loader.dataset)})
    return Message(content=content, reply_to=msg)

fedhetero's own loop takes the same function: ``strategies.client.local_sgd(...,
forward=moon.forward)``.

Without a previous local model (a client's first round) the contrastive term is 0, so the
round is plain training with l_sup, as in the authors' code's first round.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from .. import contract as C
from ..engine.client_states import state_digest
from ..engine.records import sent_config, to_numpy
from .data import writable_tensor
from .state import resolve_state, save_state
from .sides import ClientSide, register_client_side

STATE_KEY = "moon-previous-model"  # Context.state: w_i^{t-1}, the model after local training
REPRESENTATION_METHOD = "forward_with_representation"

Representation = Callable[[Any, Any], tuple[Any, Any]]


class MissingRepresentation(TypeError):
    """MOON's loss needs the model's representation R_w(x), and the model has none."""


def is_moon_message(msg: Message) -> bool:
    """True when a train message comes from a MOON server (its config has ``moon-mu``)."""
    return C.MOON_MU in (sent_config(msg.content) or {})


def has_representation(model: Any) -> bool:
    """Whether ``model`` has a ``forward_with_representation(x) -> (logits, z)`` method."""
    return callable(getattr(model, REPRESENTATION_METHOD, None))


def representation_of(model: Any, x: Any) -> tuple[Any, Any]:
    """(logits, z) = ``model.forward_with_representation(x)``: the default representation."""
    return getattr(model, REPRESENTATION_METHOD)(x)


def contrastive_loss(z: Any, z_glob: Any, z_prev: Any, temperature: float) -> Any:
    """Eq. (3), averaged over the batch:

        l_con = -log( exp(sim(z, z_glob) / tau)
                      / (exp(sim(z, z_glob) / tau) + exp(sim(z, z_prev) / tau)) )

    sim is the cosine similarity along the last dimension (torch's, eps 1e-8, as the
    authors' code); z, z_glob, z_prev are (batch, d) torch tensors.
    """
    import torch  # noqa: PLC0415  (lazy: strategies never needs torch at import)
    import torch.nn.functional as F  # noqa: PLC0415, N812

    positive = F.cosine_similarity(z, z_glob, dim=-1)
    negative = F.cosine_similarity(z, z_prev, dim=-1)
    logits = torch.stack([positive, negative], dim=1) / temperature
    target = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, target)


class MoonClient:
    """One MOON round on a client: l_sup + mu l_con (Eq. 4) in the loop, then the reply.

    Parameters
    ----------
    msg
        The train message: ``arrays`` (w^t), config ``moon-mu``, ``moon-temperature``,
        ``server-round`` and ``state-round``, optionally ``client-state`` (the server's
        copy of w_i^{t-1}).
    state
        ``context.state``: w_i^{t-1} is kept there between rounds (key
        ``moon-previous-model``).
    model
        The local model (a template: the helper copies it and loads w^t and w_i^{t-1}
        into the copies, which it keeps frozen in eval mode).
    representation
        ``(model, x) -> (logits, z)``; default ``model.forward_with_representation(x)``.

    Raises
    ------
    MissingRepresentation
        The model has no ``forward_with_representation`` and no ``representation`` is given.
    strategies.client.state.ClientStateLost
        The server expects a previous model this node does not hold (a SuperNode restart):
        the reply becomes an error and the next message carries the server's copy.
    """

    def __init__(self, msg: Message, state: Any, model: Any, *,
                 representation: Representation | None = None) -> None:
        if not is_moon_message(msg):
            raise ValueError(f"not a MOON train message: its config has no '{C.MOON_MU}' "
                             f"(check is_moon_message(msg) first)")
        if representation is None and not has_representation(model):
            raise MissingRepresentation(
                f"MOON's contrastive loss (Li et al. 2021, Eq. 3) needs the representation "
                f"R_w(x), the projection head's output, but {type(model).__name__} has no "
                f"method {REPRESENTATION_METHOD}(x) -> (logits, z). Add one, or pass "
                f"MoonClient(msg, state, model, representation=fn) with fn(model, x) -> "
                f"(logits, z) (fedhetero's app: run config model='cnn-small-moon')")
        config = msg.content[C.CONFIG]
        self.mu = float(config[C.MOON_MU])
        self.temperature = float(config[C.MOON_TEMPERATURE])
        self.server_round = int(config.get(C.SERVER_ROUND, 0))
        self.state = state
        self.represent = representation or representation_of
        previous, self.state_round = resolve_state(state, STATE_KEY, msg.content, initial={})
        self.previous_digest = state_digest(previous)
        self.global_model = frozen_copy(model, to_numpy(msg.content[C.ARRAYS]))  # w^t
        self.previous_model = frozen_copy(model, previous) if previous else None  # w_i^{t-1}
        self.steps = 0
        self._contrastive_sum: Any = 0.0

    def forward(self, model: Any, x: Any) -> tuple[Any, Any]:
        """(logits, mu l_con) of the local model on the batch ``x`` (one forward pass of it;
        w^t and w_i^{t-1} run without gradients). mu l_con is a zero tensor without a
        previous local model or with mu = 0."""
        import torch  # noqa: PLC0415

        logits, z = self.represent(model, x)
        self.steps += 1
        if self.previous_model is None or self.mu == 0:
            return logits, torch.zeros((), dtype=logits.dtype, device=logits.device)
        with torch.no_grad():
            _, z_glob = self.represent(self.global_model, x)
            _, z_prev = self.represent(self.previous_model, x)
        loss = contrastive_loss(z, z_glob, z_prev, self.temperature)
        self._contrastive_sum = self._contrastive_sum + loss.detach()
        return logits, self.mu * loss

    def finish(self, model: Any, metrics: Mapping[str, Any]) -> RecordDict:
        """Keep the trained model in ``Context.state`` (w_i^{t-1} of the next round) and
        build the reply.

        Returns a RecordDict with ``arrays`` (w_i^t) and ``metrics``: ``metrics`` (it must
        hold ``num-examples``) plus ``moon-contrastive-loss`` (the mean l_con over the
        steps, without mu), ``state-round`` and ``state-digest`` of the previous model used.
        """
        if self.steps < 1:
            raise ValueError("MOON: no local step went through MoonClient.forward(model, x); "
                             "use it instead of model(x) in the training loop")
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        save_state(self.state, STATE_KEY, {k: v.numpy() for k, v in state.items()},
                   self.server_round)
        out = dict(metrics)
        out[C.MOON_CONTRASTIVE_LOSS] = float(self._contrastive_sum) / self.steps
        out[C.STATE_ROUND_USED] = self.state_round
        out[C.STATE_DIGEST] = self.previous_digest
        return RecordDict({C.ARRAYS: ArrayRecord(state), C.METRICS: MetricRecord(out)})


def frozen_copy(model: Any, arrays: Mapping[str, Any]) -> Any:
    """A copy of ``model`` holding ``arrays``, in eval mode, without gradients."""
    clone = copy.deepcopy(model)
    clone.load_state_dict({k: writable_tensor(v) for k, v in arrays.items()})
    clone.eval()
    for p in clone.parameters():
        p.grad = None
        p.requires_grad_(False)
    return clone


register_client_side(ClientSide(
    "strategies.client.MoonClient", is_moon_message,
    hook=lambda task: MoonClient(task.msg, task.state, task.model)))

"""FedDyn's client side (Acar et al., ICLR 2021, Algorithm 1), for any PyTorch training loop.

:class:`FedDynClient` reads theta^{t-1}, alpha and this client's linear term
grad L_k(theta_k^{t-1}) (from ``Context.state``, or the server's copy:
:func:`strategies.client.state.resolve_state`); the loop calls
:meth:`~FedDynClient.regularise` after every ``loss.backward()`` and before the optimiser
step, and :meth:`~FedDynClient.finish` at the end, which updates the linear term in
``Context.state`` and builds the reply. The optimiser is yours; :meth:`~FedDynClient.wrap`
makes every one of its steps call ``regularise`` first::

    feddyn = FedDynClient(msg, context.state)    # theta^{t-1}, alpha, grad L_k(theta_k^{t-1})
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    feddyn.wrap(optimizer, model)                 # + alpha (theta - theta^{t-1}) - grad L_k
    train_loss = your_training_loop(model, optimizer, loader)
    content = feddyn.finish(model, {"train_loss": train_loss,
                                    "num-examples": len(loader.dataset)})
    return Message(content=content, reply_to=msg)

(Without ``wrap``, call ``feddyn.regularise(model)`` between ``loss.backward()`` and
``optimizer.step()``.)

The loop then minimises Algorithm 1's local objective
L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + (alpha / 2) ||theta - theta^{t-1}||^2;
the regulariser's gradient is in ``.grad`` before the step, so the optimiser's momentum and
weight decay act on that whole objective.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from .. import contract as C
from ..algorithms import feddyn_math as fm
from ..engine.client_states import state_digest
from ..engine.records import sent_config, to_numpy
from .data import writable_tensor
from .optimizer_hooks import StepHooks
from .state import resolve_state, save_state
from .sides import ClientSide, register_client_side

STATE_KEY = "feddyn-linear-term"  # Context.state: grad L_k(theta_k^{t-1})


def is_feddyn_message(msg: Message) -> bool:
    """True when a train message comes from a FedDyn server (its config has ``feddyn-alpha``)."""
    return C.FEDDYN_ALPHA in (sent_config(msg.content) or {})


class FedDynClient:
    """One FedDyn round on a client: the dynamic regulariser, then the linear-term update.

    Parameters
    ----------
    msg
        The train message: ``arrays`` (theta^{t-1}), config ``feddyn-alpha``,
        ``server-round`` and ``state-round``, optionally ``client-state`` (the server's copy
        of the linear term).
    state
        ``context.state``: the linear term is kept there between rounds (key
        ``feddyn-linear-term``).

    Raises
    ------
    strategies.client.state.ClientStateLost
        The server expects a linear term this node does not hold (a SuperNode restart):
        the reply becomes an error and the next message carries the server's copy.
    """

    def __init__(self, msg: Message, state: Any) -> None:
        if not is_feddyn_message(msg):
            raise ValueError(f"not a FedDyn train message: its config has no "
                             f"'{C.FEDDYN_ALPHA}' (check is_feddyn_message(msg) first)")
        config = msg.content[C.CONFIG]
        self.alpha = float(config[C.FEDDYN_ALPHA])
        self.server_round = int(config.get(C.SERVER_ROUND, 0))
        self.state = state
        self.global_model = fm.floating_arrays(to_numpy(msg.content[C.ARRAYS]))  # theta^{t-1}
        self.linear_term, self.state_round = resolve_state(
            state, STATE_KEY, msg.content, initial=fm.zero_state(self.global_model))
        self.steps = 0
        self._terms: dict[str, tuple[Any, Any]] | None = None  # (theta^{t-1}, grad L_k), torch
        self._hooks = StepHooks()

    def wrap(self, optimizer: Any, model: Any) -> Any:
        """Call :meth:`regularise` at the start of every ``optimizer.step()`` (a pre-step
        hook on this optimiser, after ``backward()`` filled ``.grad``; taken off by
        :meth:`finish`); returns ``optimizer``."""
        self._hooks.install("FedDynClient", optimizer, before=lambda: self.regularise(model))
        return optimizer

    def regularise(self, model: Any) -> None:
        """Add alpha (theta - theta^{t-1}) - grad L_k(theta_k^{t-1}) to every trained
        parameter's ``.grad``: call it after ``loss.backward()``, before ``optimizer.step()``.

        Raises ValueError for a model with floating buffers (BatchNorm's running
        statistics): the server's theta^t = average - h / alpha would correct them like
        parameters; use GroupNorm or LayerNorm.
        """
        import torch  # noqa: PLC0415  (lazy: strategies never needs torch at import)

        if self._terms is None:
            self._terms = self._torch_terms(model)
        with torch.no_grad():
            for name, p in model.named_parameters():
                terms = self._terms.get(name)
                if terms is None:
                    continue
                previous, linear = terms
                term = (p - previous).mul_(self.alpha).sub_(linear)
                if p.grad is None:
                    p.grad = term
                else:
                    p.grad.add_(term)
        self.steps += 1

    def _torch_terms(self, model: Any) -> dict[str, tuple[Any, Any]]:
        params = dict(model.named_parameters())
        buffers = [name for name, value in model.state_dict().items()
                   if name not in params and value.is_floating_point()]
        if buffers:
            raise ValueError(f"FedDyn: the model has floating buffers ({', '.join(buffers)}), "
                             f"which have no gradient; the server's theta^t = average - "
                             f"h / alpha would move them like parameters. Use GroupNorm or "
                             f"LayerNorm instead of BatchNorm")
        return {name: (writable_tensor(self.global_model[name]).to(p.device, p.dtype),
                       writable_tensor(self.linear_term[name]).to(p.device, p.dtype))
                for name, p in params.items() if p.requires_grad and name in self.linear_term}

    def finish(self, model: Any, metrics: Mapping[str, Any]) -> RecordDict:
        """The linear-term update in ``Context.state`` and the reply content.

        Returns a RecordDict with ``arrays`` (theta_k^t) and ``metrics``: ``metrics`` (it
        must hold ``num-examples``) plus ``state-round`` and ``state-digest`` of the linear
        term this round started from.
        """
        self._hooks.remove()
        if self.steps < 1:
            raise ValueError("FedDyn: the regulariser was never applied; wrap the optimizer "
                             "(feddyn.wrap(optimizer, model)) or call "
                             "FedDynClient.regularise(model) after every loss.backward()")
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        local = {k: np.asarray(v.numpy()) for k, v in state.items() if k in self.linear_term}
        save_state(self.state, STATE_KEY,
                   fm.linear_term_update(self.linear_term, self.alpha, local, self.global_model),
                   self.server_round)
        out = dict(metrics)
        out[C.STATE_ROUND_USED] = self.state_round
        out[C.STATE_DIGEST] = state_digest(self.linear_term)
        return RecordDict({C.ARRAYS: ArrayRecord(state), C.METRICS: MetricRecord(out)})


register_client_side(ClientSide(
    "strategies.client.FedDynClient", is_feddyn_message,
    hook=lambda task: FedDynClient(task.msg, task.state)))

"""SCAFFOLD's client side (Karimireddy et al., ICML 2020, Algorithm 1, lines 7-14), for any
PyTorch training loop.

:class:`ScaffoldClient` reads x, c, eta_l and this client's c_i (from ``Context.state``, or
the server's copy: :func:`strategies.client.state.resolve_state`); the loop calls
:meth:`~ScaffoldClient.correct` after every optimiser step and
:meth:`~ScaffoldClient.finish` at the end, which applies option II, keeps c_i in
``Context.state`` and builds the reply. The optimiser is yours (momentum, weight decay,
...); :meth:`~ScaffoldClient.wrap` makes every one of its steps call ``correct``::

    scaffold = ScaffoldClient(msg, context.state)        # x, c, c_i and eta_l = config lr
    optimizer = torch.optim.SGD(model.parameters(), lr=scaffold.lr, momentum=0.9)
    scaffold.wrap(optimizer, model)                      # y_i <- y_i - eta_l (c - c_i) per step
    train_loss = 0.0
    for batch in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(batch["img"]), batch["label"])
        loss.backward()
        optimizer.step()
        train_loss += loss.item() / len(loader)
    content = scaffold.finish(model, {"train_loss": train_loss,
                                      "num-examples": len(loader.dataset)})
    return Message(content=content, reply_to=msg)

(Without ``wrap``, call ``scaffold.correct(model)`` right after every ``optimizer.step()``.)

Why after the step: with plain SGD, ``optimizer.step()`` then ``correct`` is line 10,
y_i <- y_i - eta_l (g_i(y_i) + c - c_i). With momentum rho (NIID-Bench runs SCAFFOLD with
SGD momentum 0.9 and weight decay, and corrects the same way: Li et al., ICDE 2022,
``train_net_scaffold``) the correction stays outside the momentum buffer, and option II's
(x - y_i) / (K eta_l) then estimates the momentum-amplified mean gradient g_i / (1 - rho)
(plus weight decay's lambda y): c_i, c and every correction are on that same scale, so
option II stays consistent. Adding c - c_i to the gradient before a momentum step instead
would amplify the correction by 1 / (1 - rho) while option II still divides by K eta_l:
with steady momentum and full participation the deviation c_i - c is then multiplied by
-rho / (1 - rho) every round (-9 for rho = 0.9), and the control variates diverge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from .. import contract as C
from ..algorithms import scaffold_math as sm
from ..engine.client_states import state_digest
from ..engine.records import sent_arrays, to_numpy, to_record
from .optimizer_hooks import StepHooks, learning_rates
from .state import resolve_state, save_state
from .sides import ClientSide, register_client_side

STATE_KEY = "scaffold-c-i"  # Context.state: this client's control variate c_i


def is_scaffold_message(msg: Message) -> bool:
    """True when a train message comes from a SCAFFOLD server (it carries ``scaffold-c``)."""
    return sent_arrays(msg.content, C.SCAFFOLD_C) is not None


class ScaffoldClient:
    """One SCAFFOLD round on a client: correct every local step, then option II.

    Parameters
    ----------
    msg
        The train message: ``arrays`` (x), ``scaffold-c`` (c), config ``server-round``,
        ``lr`` and ``state-round``, optionally ``client-state`` (the server's copy of c_i).
    state
        ``context.state``: c_i is kept there between rounds (key ``scaffold-c-i``).
    lr
        eta_l, the learning rate of the loop's optimiser; default the config's ``lr``.

    Raises
    ------
    strategies.client.state.ClientStateLost
        The server expects a c_i this node does not hold (a SuperNode restart): the reply
        becomes an error and the next message carries the server's copy.
    """

    def __init__(self, msg: Message, state: Any, *, lr: float | None = None) -> None:
        if not is_scaffold_message(msg):
            raise ValueError(f"not a SCAFFOLD train message: it has no ArrayRecord "
                             f"'{C.SCAFFOLD_C}' (check is_scaffold_message(msg) first)")
        config = msg.content[C.CONFIG]
        if lr is None and C.LR not in config:
            raise ValueError(f"SCAFFOLD's option II needs eta_l: the train config has no "
                             f"'{C.LR}'; pass ScaffoldClient(msg, state, lr=...)")
        self.lr = float(config[C.LR] if lr is None else lr)
        self.server_round = int(config.get(C.SERVER_ROUND, 0))
        self.state = state
        self.control = to_numpy(msg.content[C.SCAFFOLD_C])  # c
        self.global_model = {k: v for k, v in to_numpy(msg.content[C.ARRAYS]).items()
                             if k in self.control}  # x
        self.client_control, self.state_round = resolve_state(
            state, STATE_KEY, msg.content, initial=sm.zero_control(self.control))  # c_i
        self.steps = 0
        self._terms: dict[str, Any] | None = None  # c - c_i per trained parameter, torch
        self._hooks = StepHooks()

    def wrap(self, optimizer: Any, model: Any) -> Any:
        """Call :meth:`correct` after every ``optimizer.step()`` (a post-step hook on this
        optimiser, taken off by :meth:`finish`); returns ``optimizer``.

        Raises ValueError when the optimiser's ``lr`` is not eta_l (option II divides by
        K eta_l, so the steps must be taken at that rate).
        """
        rates = learning_rates(optimizer)
        if rates and rates != {self.lr}:
            raise ValueError(
                f"SCAFFOLD: the optimizer's lr {sorted(rates)} is not eta_l = {self.lr} (the "
                f"train config's '{C.LR}'), which option II divides by; build the optimizer "
                f"with lr=scaffold.lr, or pass ScaffoldClient(msg, state, lr=...)")
        self._hooks.install("ScaffoldClient", optimizer, after=lambda: self.correct(model))
        return optimizer

    def correct(self, model: Any) -> None:
        """y_i <- y_i - eta_l (c - c_i) on every trained parameter; call it once after every
        ``optimizer.step()`` (Alg. 1 line 10; module docstring). Counts K."""
        import torch  # noqa: PLC0415  (lazy: strategies never needs torch at import)

        if self._terms is None:
            diff = sm.correction(self.control, self.client_control)
            self._terms = {name: torch.as_tensor(diff[name]).to(p.device, p.dtype)
                           for name, p in model.named_parameters()
                           if p.requires_grad and name in diff}
        with torch.no_grad():
            for name, p in model.named_parameters():
                term = self._terms.get(name)
                if term is not None:
                    p.add_(term, alpha=-self.lr)
        self.steps += 1

    def finish(self, model: Any, metrics: Mapping[str, Any]) -> RecordDict:
        """Option II, c_i <- c_i + delta c_i in ``Context.state``, and the reply content.

        Returns a RecordDict with ``arrays`` (y_i), ``scaffold-delta-c`` (delta c_i) and
        ``metrics``: ``metrics`` (it must hold ``num-examples``) plus ``local-steps`` (K),
        ``state-round`` and ``state-digest`` of the c_i this round started from.
        """
        self._hooks.remove()
        if self.steps < 1:
            raise ValueError("SCAFFOLD: no local step was counted; wrap the optimizer "
                             "(scaffold.wrap(optimizer, model)) or call "
                             "ScaffoldClient.correct(model) after every optimizer.step()")
        trained = {name: p.detach().cpu().numpy() for name, p in model.named_parameters()
                   if p.requires_grad and name in self.control}
        new = sm.option_ii(self.client_control, self.control, self.global_model, trained,
                           self.steps, self.lr)
        delta = sm.control_delta(new, self.client_control)
        save_state(self.state, STATE_KEY, sm.apply_delta(self.client_control, delta),
                   self.server_round)
        out = dict(metrics)
        out[C.LOCAL_STEPS_TAKEN] = self.steps
        out[C.STATE_ROUND_USED] = self.state_round
        out[C.STATE_DIGEST] = state_digest(self.client_control)
        arrays = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
        return RecordDict({C.ARRAYS: arrays, C.METRICS: MetricRecord(out),
                           C.SCAFFOLD_DELTA_C: to_record(delta)})


register_client_side(ClientSide(
    "strategies.client.ScaffoldClient", is_scaffold_message,
    hook=lambda task: ScaffoldClient(task.msg, task.state, lr=task.lr)))

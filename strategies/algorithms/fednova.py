"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020): normalised averaging for heterogeneous local work.

    d_i = (w - w_i) / ||a_i||_1,  tau_eff = sum_i p_i ||a_i||_1,
    w <- w - eta_g tau_eff sum_i p_i d_i                                (eq. 6)

p_i = n_i / n over the accepted replies; ||a_i||_1 from the client's local solver (eq. 5
and its momentum / proximal forms, :mod:`strategies.engine.averaging`). The coefficients are
:func:`strategies.engine.averaging.coefficients_fednova`, the update
:func:`strategies.engine.averaging.fednova_update`.

A client that took no local step (tau_i = 0, so ||a_i||_1 = 0) has no update: d_i of eq. (6)
is 0 / 0. The rule, whether the reply reports ``local-steps`` = 0 (the trust gate refuses it)
or tau_i is derived from E, B and n_i (a stock DataLoader loop with ``drop_last`` and
n_i < B, :func:`stock_loop_steps`): the reply is left out of the round with one log line
(:meth:`Normalised.check`), and p_i = n_i / n is taken over the replies that are aggregated,
so the p_i of eq. (6) still sum to 1 (the engine's rule for a client whose reply failed).
Wang et al.'s code (JYWa/FedNova, ``distoptim/FedNova.py``) has no such case: every client
there runs whole epochs over its partition, and with no step its ``local_normalizing_vec``
would be 0 and its scale tau_eff / 0 undefined.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from logging import WARNING

from flwr.app import Message
from flwr.common.logger import log

from .. import contract as C
from ..contract import Section, logged
from ..engine import averaging as agg
from ..engine import sampling, trust_gate
from ..engine.algorithm import Algorithm, Contract, Outgoing, RoundInput, RoundUpdate
from ..engine.registry import register
from ..engine.round_engine import RoundEngine

__all__ = ["FedNova", "Normalised", "REPORT_STEPS_HELPER", "a_norm",
           "no_step_problem", "stock_loop_steps"]

REPORT_STEPS_HELPER = "strategies.client.report_local_steps"


@dataclass(frozen=True)
class FedNovaSection(Section):
    """FedNova's normalisation (Wang et al. 2020, eqs. 6-7)."""

    a_norms: list[float] = logged(C.LOG_A_NORMS, default=())
    tau_eff: float | None = logged(C.LOG_TAU_EFF)


class Normalised(Algorithm):
    """FedNova's algorithm: eq. (6) with optional server momentum (its state)."""

    name = "FedNova"
    contract = Contract(helper=REPORT_STEPS_HELPER)

    def __init__(self, server_momentum: float = 0.0, local_epochs: float | None = None,
                 batch_size: int | None = None, drop_last: bool = False,
                 steps_reported: bool = False) -> None:
        if not 0 <= server_momentum < 1:
            raise ValueError(f"server_momentum must be in [0, 1), got {server_momentum}")
        self.server_momentum = float(server_momentum)
        self.local_epochs, self.batch_size = local_epochs, batch_size
        self.drop_last = bool(drop_last)
        self.steps_reported = bool(steps_reported)
        self.momentum_buffer: agg.NDArrays | None = None
        self.warned_tau = False  # the derived-tau warning, once per run

    def send(self, plan) -> Outgoing:
        """Nothing beside the model. Before any client trains: a ValueError with the one
        change to make when a stock client's tau_i could not be derived
        (:func:`tau_source_problem`), unless the clients report it (``steps_reported``)."""
        problem = None if self.steps_reported else tau_source_problem(plan.config, self)
        if problem:
            raise ValueError(problem)
        return Outgoing()

    def check(self, plan, reply: Message) -> str | None:
        """A reply whose tau_i is 0 is left out: :func:`no_step_problem` (a reported
        ``local-steps`` of 0 never gets here: the trust gate refuses it the same way)."""
        return no_step_problem(reply, plan.sent(reply.metadata.src_node_id), self)

    def update(self, r: RoundInput) -> RoundUpdate:
        """eq. (6) over the accepted replies, then optional server momentum."""
        a_norms = [a_norm(reply, r.plan.sent(reply.metadata.src_node_id), self)
                   for reply in r.replies]
        n = [float(r.metrics(k)[C.NUM_EXAMPLES]) for k in range(len(r.replies))]
        new, buffer, used, tau_eff = agg.fednova_update(
            r.global_arrays, r.models, agg.coefficients_fednova(n, a_norms), r.server_lr,
            self.momentum_buffer, self.server_momentum, on_reject=r.reject)
        self.momentum_buffer = trust_gate.finite_or_previous(
            buffer, self.momentum_buffer, "FedNova's server momentum v", r.server_round)
        sections = ([FedNovaSection([round(float(a_norms[k]), 4) for k in used], tau_eff)]
                    if used else [])
        return RoundUpdate(new, used, sections=sections)

    def state_dict(self) -> dict:
        """The server momentum buffer v (None without momentum), copied."""
        return {"momentum-buffer": agg.copied(self.momentum_buffer)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.momentum_buffer = agg.copied(state.get("momentum-buffer"))


def no_step_problem(reply: Message, sent: Mapping[str, object], fednova: Normalised
                    ) -> str | None:
    """Why a reply has no FedNova update, or None: its tau_i (:func:`reply_tau`) is 0, so
    ||a_i||_1 = 0 and d_i = (w - w_i) / ||a_i||_1 of Wang et al. 2020, eq. (6), is
    undefined. A reply that reports ``a-norm`` (> 0, checked by the trust gate) has one."""
    metrics = reply.content[C.METRICS]
    if C.A_NORM in metrics or reply_tau(reply, sent, fednova) > 0:
        return None
    return (f"it took no local step (tau_i = 0: {stock_loop_words(metrics, sent, fednova)}), "
            f"so it has no update: FedNova's d_i = (w - w_i) / ||a_i||_1 is undefined for "
            f"||a_i||_1 = 0 (Wang et al. 2020, eq. 6); it is left out of the round and p_i is "
            f"taken over the other replies, as for a client whose reply failed")


def a_norm(reply: Message, sent: Mapping[str, object], fednova: Normalised) -> float:
    """||a_i||_1 of one reply: reported, or from tau_i and the solver it was sent (plain,
    momentum rho, proximal mu: eq. (5) and its forms in Wang et al.'s Sec. 4); 0 for
    tau_i = 0 (such a reply is left out before the update: :func:`no_step_problem`)."""
    metrics = reply.content[C.METRICS]
    if C.A_NORM in metrics:
        return float(metrics[C.A_NORM])
    tau = reply_tau(reply, sent, fednova)
    rho = float(sent.get(C.MOMENTUM, 0.0))
    mu = float(sent.get(C.PROXIMAL_MU, 0.0))
    if rho > 0:
        if mu > 0:
            log(WARNING, "FedNova: momentum and proximal term together; using the momentum norm")
        return agg.fednova_norm_momentum(tau, rho)
    if mu > 0:
        return agg.fednova_norm_proximal(tau, float(sent.get(C.LR, 0.0)), mu)
    return agg.fednova_norm_sgd(tau)


def tau_source_problem(config: Mapping[str, object], fednova: Normalised) -> str | None:
    """Why tau_i of a client that does not report ``local-steps`` could not be derived from
    what the server knows (the ``local-steps`` sent, or E and B), with the one change to
    make; None when it can."""
    if int(config.get(C.LOCAL_STEPS, 0) or 0) > 0:
        return None
    epochs = fednova.local_epochs if fednova.local_epochs is not None else config.get(
        C.LOCAL_EPOCHS)
    batch = fednova.batch_size if fednova.batch_size is not None else config.get(C.BATCH_SIZE)
    if epochs is not None and batch is not None:
        return None
    return (f"FedNova needs each client's local work tau_i; the train config has no "
            f"'{C.LOCAL_STEPS}' and local_epochs={epochs!r}, batch_size={batch!r}, so a stock "
            f"ClientApp's tau_i = E ceil(n_i / B) is unknown. Before any training, give one: "
            f"FedNova(..., local_epochs=E, batch_size=B) with your ClientApp's epochs and "
            f"DataLoader batch size, or, if the ClientApp reports its steps with "
            f"{REPORT_STEPS_HELPER}, FedNova(..., steps_reported=True)")


def reply_tau(reply: Message, sent: Mapping[str, object], fednova: Normalised) -> int:
    """tau_i: the reported ``local-steps``; else the ``local-steps`` sent; else the steps of a
    stock DataLoader loop, E ceil(n_i / B) (:func:`stock_loop_steps`; one warning per run).
    0 when the loop takes no step: such a reply is left out (:func:`no_step_problem`)."""
    metrics = reply.content[C.METRICS]
    if C.LOCAL_STEPS_TAKEN in metrics:
        return int(metrics[C.LOCAL_STEPS_TAKEN])
    steps = int(sent.get(C.LOCAL_STEPS, 0))
    epochs = fednova.local_epochs if fednova.local_epochs is not None else sent.get(
        C.LOCAL_EPOCHS)
    batch = fednova.batch_size if fednova.batch_size is not None else sent.get(C.BATCH_SIZE)
    if steps > 0:
        tau = steps
    elif epochs is None or batch is None:
        raise ValueError(
            f"FedNova: replies carry no '{C.LOCAL_STEPS_TAKEN}' and the local work tau_i "
            f"cannot be derived: local_epochs={epochs!r}, batch_size={batch!r}. Pass the "
            f"clients' values, FedNova(local_epochs=E, batch_size=B) (B=0 for full batch; "
            f"drop_last=True if their DataLoader drops the last batch), or put "
            f"'{C.LOCAL_EPOCHS}' and '{C.BATCH_SIZE}' in the train config, or report the "
            f"steps from the ClientApp with {REPORT_STEPS_HELPER}")
    else:
        tau = stock_loop_steps(int(metrics[C.NUM_EXAMPLES]), int(batch), epochs,
                               drop_last=fednova.drop_last)
    if not fednova.warned_tau:
        fednova.warned_tau = True
        rule = "sent local-steps" if steps > 0 else (
            f"E {'floor' if fednova.drop_last else 'ceil'}(n_i / B) with E={epochs}, "
            f"B={batch or 'full'}")
        log(WARNING, "FedNova: replies carry no '%s'; tau_i is taken as the %s (report it "
            "with %s to be exact)", C.LOCAL_STEPS_TAKEN, rule, REPORT_STEPS_HELPER)
    return tau


def stock_loop_steps(num_examples: int, batch_size: int, epochs: float, *,
                     drop_last: bool = False) -> int:
    """tau_i of ``for _ in range(E): for batch in DataLoader(...)``
    (:func:`strategies.engine.sampling.dataloader_steps`): 0 when that loop takes no step
    (``drop_last`` with n_i < B; E b < 1; n_i = 0)."""
    return sampling.dataloader_steps(num_examples, batch_size, epochs, drop_last=drop_last)


def stock_loop_words(metrics: Mapping[str, object], sent: Mapping[str, object],
                     fednova: Normalised) -> str:
    """Where a tau_i of 0 came from, for the log line of :func:`no_step_problem`."""
    if C.LOCAL_STEPS_TAKEN in metrics:
        return f"'{C.LOCAL_STEPS_TAKEN}' = {metrics[C.LOCAL_STEPS_TAKEN]!r}"
    epochs = fednova.local_epochs if fednova.local_epochs is not None else sent.get(
        C.LOCAL_EPOCHS)
    batch = fednova.batch_size if fednova.batch_size is not None else sent.get(C.BATCH_SIZE)
    return (f"a stock DataLoader loop over n_i = {metrics.get(C.NUM_EXAMPLES)!r} examples with "
            f"E = {epochs!r}, B = {batch!r}, drop_last={fednova.drop_last}")


class FedNova(RoundEngine):
    """FedNova's normalised averaging (Wang et al. 2020, eq. 6) on the engine's sampling.

    Parameters
    ----------
    server_momentum : float
        gamma of optional server momentum on the normalised update (0 = off, default).
    local_epochs, batch_size : float, int, optional
        E and B of clients that do not report ``local-steps`` (Flower's stock PyTorch
        ClientApp); default: the train config's ``local-epochs`` and ``batch-size``.
        B = 0 means one full batch per epoch.
    drop_last : bool
        How such a client's loop batches an epoch: ``False`` (PyTorch's DataLoader
        default) runs tau_i = E ceil(n_i / B) steps, ``True`` runs E floor(n_i / B); a
        fractional E gives floor(E ceil(n_i / B)) (:func:`strategies.engine.sampling.
        dataloader_steps`). When E or B is not known either way, the first round stops
        before any client trains with a ValueError saying how to give them (or
        ``steps_reported``); tau_i is never guessed. A loop that takes no step (``True``
        with n_i < B) gives tau_i = 0: that reply is left out (module docstring).
    steps_reported : bool
        The ClientApp reports tau_i (``local-steps``, :data:`REPORT_STEPS_HELPER`), so E and
        B are not needed; a reply without it then stops the run as before.
    straggler_policy : str
        ``"partial"`` by default: FedNova exists to aggregate unequal local work.
    **kwargs
        As :class:`~strategies.engine.round_engine.RoundEngine` (the weighting is always
        n_i / n; ``server_lr`` eta_g scales the normalised step).

    Notes
    -----
    tau_i = 0 (reported, or derived for a stock client) means no update: the reply is left
    out with one log line and counts in ``clients-failed``, p_i = n_i / n over the replies
    aggregated (module docstring). A round whose every reply is left out keeps the model.

    Contract
    --------
    Each reply: ArrayRecord ``arrays`` (the local model w_i) and MetricRecord ``metrics``
    with ``num-examples`` and, best, ``local-steps`` (tau_i, the SGD steps taken;
    ``strategies.client.fednova.report_local_steps`` adds it); optionally ``a-norm``
    (||a_i||_1) for a local solver other than plain, momentum or proximal SGD. The
    server computes ||a_i||_1 from tau_i and the ``momentum``, ``proximal-mu`` and
    ``lr`` it sent that client.
    """

    def __init__(self, *flower_args, server_momentum: float = 0.0,
                 local_epochs: float | None = None, batch_size: int | None = None,
                 drop_last: bool = False, steps_reported: bool = False,
                 straggler_policy: str = "partial", **kwargs) -> None:
        if kwargs.get("weighting", "examples") != "examples":
            raise ValueError(f"FedNova weights clients by num-examples; "
                             f"weighting={kwargs['weighting']!r} is not supported")
        super().__init__(*flower_args, straggler_policy=straggler_policy, algorithm=Normalised(
            server_momentum, local_epochs, batch_size, drop_last, steps_reported), **kwargs)


FEDNOVA_WHY = "FedNova's eq. (5) weights clients by num-examples"
register("fednova", FedNova, "FedNova (Wang et al. 2020, eq. 6): averaging normalised by each "
         "client's local steps", reads={"server-momentum": "server_momentum"},
         only=(("weighting", ("examples",), FEDNOVA_WHY),))

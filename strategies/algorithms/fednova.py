"""FedNova (Wang et al., NeurIPS 2020): normalised averaging for heterogeneous local work.

    d_i = (w - w_i) / ||a_i||_1,  tau_eff = sum_i p_i ||a_i||_1,
    w <- w - eta_g tau_eff sum_i p_i d_i                                (eq. 6)

p_i = n_i / n over the accepted replies; ||a_i||_1 from the client's local solver (eq. 5
and its momentum / proximal forms, :mod:`strategies.engine.averaging`). The coefficients are
:func:`strategies.engine.averaging.coefficients_fednova`, the update
:func:`strategies.engine.averaging.fednova_update`; this module moves records.
"""

from __future__ import annotations

from logging import INFO, WARNING

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from ..engine import averaging as agg
from .. import contract as C
from ..engine import sampling
from ..engine import trust_gate
from .fedavg import FedAvg
from ..engine.round_plan import RoundPlan
from ..engine.round_report import FedNovaSection

REPORT_STEPS_HELPER = "strategies.client.report_local_steps"


class FedNova(FedAvg):
    """FedNova's normalised averaging (Wang et al. 2020, eq. 6) on FedAvg's sampling.

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
        fractional E gives floor(E ceil(n_i / B)) (:func:`strategies.engine.sampling.dataloader_steps`).
        When E or B is not known either way, the first such reply stops the run with a
        ValueError saying how to give them; tau_i is never guessed.
    straggler_policy : str
        ``"partial"`` by default: FedNova exists to aggregate unequal local work.
    **kwargs
        As :class:`FedAvg` (the weighting is always n_i / n; ``server_lr`` eta_g scales
        the normalised step).

    Contract
    --------
    Each reply: ArrayRecord ``arrays`` (the local model w_i) and MetricRecord ``metrics``
    with ``num-examples`` and, best, ``local-steps`` (tau_i, the SGD steps taken;
    ``strategies.client.fednova.report_local_steps`` adds it); optionally ``a-norm``
    (||a_i||_1) for a local solver other than plain, momentum or proximal SGD. The
    server computes ||a_i||_1 from tau_i and the ``momentum``, ``proximal-mu`` and
    ``lr`` it sent that client.
    """

    CLIENT_HELPER = REPORT_STEPS_HELPER

    def __init__(self, *flower_args, server_momentum: float = 0.0, local_epochs: float | None = None,
                 batch_size: int | None = None, drop_last: bool = False,
                 straggler_policy: str = "partial", **kwargs) -> None:
        if not 0 <= server_momentum < 1:
            raise ValueError(f"server_momentum must be in [0, 1), got {server_momentum}")
        if kwargs.get("weighting", "examples") != "examples":
            raise ValueError(f"FedNova weights clients by num-examples; "
                             f"weighting={kwargs['weighting']!r} is not supported")
        super().__init__(*flower_args, straggler_policy=straggler_policy, **kwargs)
        self.server_momentum = float(server_momentum)
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.momentum_buffer: agg.NDArrays | None = None
        self._warned_derived_tau = False

    def summary(self) -> None:
        """Log the configuration."""
        log(INFO, "\t├──> FedNova server momentum: %s", self.server_momentum)
        super().summary()

    def state_dict(self) -> dict:
        """FedAvg's state plus the server momentum buffer v (None without momentum), copied."""
        state = super().state_dict()
        state["momentum-buffer"] = (None if self.momentum_buffer is None else
                                    {k: np.array(v, copy=True)
                                     for k, v in self.momentum_buffer.items()})
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        super().load_state_dict(state)
        buffer = state.get("momentum-buffer")
        self.momentum_buffer = (None if buffer is None else
                                {k: np.array(v, copy=True) for k, v in buffer.items()})

    # ------------------------------------------------------------------ aggregation
    def update_model(
        self, plan: RoundPlan, global_arrays: agg.NDArrays, replies: list[Message],
        models: list[tuple[int, agg.NDArrays]],
    ) -> tuple[agg.NDArrays | None, list[int]]:
        """eq. (6) over the accepted replies, then optional server momentum."""
        a_norms = [self.a_norm(plan, r) for r in replies]
        n = [float(r.content[C.METRICS][C.NUM_EXAMPLES]) for r in replies]
        new, buffer, used, tau_eff = agg.fednova_update(
            global_arrays, models, agg.coefficients_fednova(n, a_norms), self.server_lr,
            self.momentum_buffer, self.server_momentum, on_reject=self.rejecter(replies))
        self.momentum_buffer = trust_gate.finite_or_previous(
            buffer, self.momentum_buffer, "FedNova's server momentum v", plan.server_round)
        if used:
            plan.report.add(FedNovaSection([round(float(a_norms[k]), 4) for k in used], tau_eff))
        return new, used

    def a_norm(self, plan: RoundPlan, reply: Message) -> float:
        """||a_i||_1 of one reply (reported, or from tau_i and the solver it was sent)."""
        metrics = reply.content[C.METRICS]
        if C.A_NORM in metrics:
            return float(metrics[C.A_NORM])
        sent = plan.sent(reply.metadata.src_node_id)
        tau = self.reply_tau(reply, sent)
        rho = float(sent.get(C.MOMENTUM, 0.0))
        mu = float(sent.get(C.PROXIMAL_MU, 0.0))
        if rho > 0:
            if mu > 0:
                log(WARNING, "FedNova: momentum and proximal term together; "
                    "using the momentum norm")
            return agg.fednova_norm_momentum(tau, rho)
        if mu > 0:
            return agg.fednova_norm_proximal(tau, float(sent.get(C.LR, 0.0)), mu)
        return agg.fednova_norm_sgd(tau)

    def reply_tau(self, reply: Message, sent) -> int:
        """tau_i: the reported ``local-steps``; else the ``local-steps`` sent; else the steps
        of a stock DataLoader loop, E ceil(n_i / B) (one warning per run)."""
        metrics = reply.content[C.METRICS]
        if C.LOCAL_STEPS_TAKEN in metrics:
            return int(metrics[C.LOCAL_STEPS_TAKEN])
        steps = int(sent.get(C.LOCAL_STEPS, 0))
        epochs = self.local_epochs if self.local_epochs is not None else sent.get(C.LOCAL_EPOCHS)
        batch = self.batch_size if self.batch_size is not None else sent.get(C.BATCH_SIZE)
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
            tau = sampling.dataloader_steps(int(metrics[C.NUM_EXAMPLES]), int(batch), epochs,
                                            drop_last=self.drop_last)
        if not self._warned_derived_tau:
            self._warned_derived_tau = True
            rule = "sent local-steps" if steps > 0 else (
                f"E {'floor' if self.drop_last else 'ceil'}(n_i / B) with E={epochs}, "
                f"B={batch or 'full'}")
            log(WARNING, "FedNova: replies carry no '%s'; tau_i is taken as the %s (report it "
                "with %s to be exact)", C.LOCAL_STEPS_TAKEN, rule, REPORT_STEPS_HELPER)
        return max(tau, 1)

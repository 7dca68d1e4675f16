"""FedNova (Wang et al., NeurIPS'20): normalised averaging for heterogeneous local work.

    d_i = (w - w_i) / ||a_i||_1,  tau_eff = sum_i p_i ||a_i||_1,  w <- w - tau_eff sum_i p_i d_i

(eq. 5 of FedVeca for plain SGD), p_i = n_i / n over the replies, with ||a_i||_1 from
the client's local solver: tau_i for SGD, momentum and proximal forms in
:mod:`strategies.aggregate`. The math is :func:`strategies.aggregate.fednova_update`.
"""

from __future__ import annotations

from logging import INFO, WARNING

import numpy as np

from flwr.app import Message
from flwr.common.logger import log

from . import aggregate as agg
from . import contract as C
from .fedavg import FedAvg, _to_numpy


class FedNova(FedAvg):
    """FedNova's normalised averaging on FedAvg's sampling and reply checks.

    Parameters
    ----------
    server_momentum : float
        gamma of optional server momentum on the normalised update (0 = off, default).
    local_epochs, batch_size : int
        Only for clients that do not report ``local-steps`` (e.g. Flower's stock PyTorch
        ClientApp): tau_i is then floor(E n_i / B) from these values, with one warning.
    straggler_policy : str
        ``"partial"`` by default: FedNova exists to aggregate unequal local work.
    **kwargs
        As :class:`FedAvg` (the weighting is always n_i / n; ``server_lr`` eta_g scales
        the normalised step: w <- w - eta_g tau_eff sum_i p_i d_i).

    Contract
    --------
    Each reply: ArrayRecord ``arrays`` (the local model w_i) and MetricRecord
    ``metrics`` with ``num-examples`` and ``local-steps`` (tau_i, the SGD steps taken);
    optionally ``a-norm`` (||a_i||_1) for a local solver other than plain/momentum/
    proximal SGD. The server computes ||a_i||_1 from tau_i and the ``momentum``,
    ``proximal-mu`` and ``lr`` it sent that client.
    """

    def __init__(self, *, server_momentum: float = 0.0, local_epochs: int | None = None,
                 batch_size: int | None = None, straggler_policy: str = "partial", **kwargs) -> None:
        if not 0 <= server_momentum < 1:
            raise ValueError(f"server_momentum must be in [0, 1), got {server_momentum}")
        if kwargs.get("weighting", "examples") != "examples":
            raise ValueError(f"FedNova weights clients by num-examples; weighting={kwargs['weighting']!r} "
                             "is not supported")
        super().__init__(straggler_policy=straggler_policy, **kwargs)
        self.server_momentum = float(server_momentum)
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.momentum_buffer: agg.NDArrays | None = None
        self._warned_derived_tau = False
        self.last_a_norms = np.zeros(0)

    def summary(self) -> None:
        """Log the configuration."""
        log(INFO, "\t├──> FedNova server momentum: %s", self.server_momentum)
        super().summary()

    def state_dict(self) -> dict:
        """FedAvg's state plus the server momentum buffer v (None without momentum), copied."""
        state = super().state_dict()
        state["momentum-buffer"] = (None if self.momentum_buffer is None
                                    else {k: np.array(v, copy=True) for k, v in self.momentum_buffer.items()})
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        super().load_state_dict(state)
        buffer = state.get("momentum-buffer")
        self.momentum_buffer = None if buffer is None else {k: np.array(v, copy=True) for k, v in buffer.items()}

    def a_norm(self, reply: Message) -> float:
        """||a_i||_1 of one reply (reported, or from tau_i and the solver it was sent)."""
        metrics = reply.content[C.METRICS]
        if C.A_NORM in metrics:
            return float(metrics[C.A_NORM])
        sent = self.sent_configs.get(reply.metadata.src_node_id, {})
        tau = self.reply_tau(reply, sent)
        rho = float(sent.get(C.MOMENTUM, 0.0))
        mu = float(sent.get(C.PROXIMAL_MU, 0.0))
        if rho > 0:
            if mu > 0:
                log(WARNING, "FedNova: momentum and proximal term together; using the momentum norm")
            return agg.fednova_norm_momentum(tau, rho)
        if mu > 0:
            return agg.fednova_norm_proximal(tau, float(sent.get(C.LR, 0.0)), mu)
        return agg.fednova_norm_sgd(tau)

    def reply_tau(self, reply: Message, sent) -> int:
        """tau_i: reported ``local-steps``, else floor(E n_i / B) with a warning."""
        metrics = reply.content[C.METRICS]
        if C.LOCAL_STEPS_TAKEN in metrics:
            return int(metrics[C.LOCAL_STEPS_TAKEN])
        epochs = self.local_epochs or sent.get(C.LOCAL_EPOCHS, 1)  # may be a fraction of an epoch
        batch = self.batch_size if self.batch_size is not None else int(sent.get(C.BATCH_SIZE, 0))
        steps = int(sent.get(C.LOCAL_STEPS, 0))
        tau = steps if steps > 0 else agg.steps_for_epochs(int(metrics[C.NUM_EXAMPLES]), batch, epochs)
        if not self._warned_derived_tau:
            self._warned_derived_tau = True
            log(WARNING, "FedNova: replies carry no '%s'; tau_i is derived as floor(E n_i / B) with "
                "E=%s, B=%s (pass local_epochs/batch_size to FedNova if these are not the clients' values)",
                C.LOCAL_STEPS_TAKEN, epochs, batch or "full")
        return max(tau, 1)

    def client_weights(self, replies: list[Message]) -> tuple[np.ndarray, list[dict[str, float]]]:
        """r_i = n_i / ||a_i||_1, with n_i and n_i ||a_i||_1 summed alongside (FedNova eq. 5)."""
        a_norms = np.array([self.a_norm(r) for r in replies])
        n = np.array([float(r.content[C.METRICS][C.NUM_EXAMPLES]) for r in replies])
        return n / a_norms, [{"n": n_i, "na": n_i * a_i, "a": a_i} for n_i, a_i in zip(n, a_norms)]

    def accumulate(self, replies, weights, extras):
        """FedAvg's stream; also keeps the accepted replies' ||a_i||_1 for the run log."""
        acc, accepted = super().accumulate(replies, weights, extras)
        by_reply = {id(r): e["a"] for r, e in zip(replies, extras)}
        self.last_a_norms = np.array([by_reply[id(r)] for r in accepted])
        return acc, accepted

    def reply_problem(self, reply: Message) -> str | None:
        """FedAvg's checks plus: ``local-steps`` an integer >= 1, ``a-norm`` finite and > 0."""
        problem = super().reply_problem(reply)
        if problem:
            return problem
        metrics = reply.content[C.METRICS]
        steps = metrics.get(C.LOCAL_STEPS_TAKEN)
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, float))
                                  or not np.isfinite(steps) or steps < 1 or steps != int(steps)):
            return f"'{C.LOCAL_STEPS_TAKEN}' must be an integer >= 1, got {steps!r}"
        a_norm = metrics.get(C.A_NORM)
        if a_norm is not None and (isinstance(a_norm, bool) or not isinstance(a_norm, (int, float))
                                   or not np.isfinite(a_norm) or a_norm <= 0):
            return f"'{C.A_NORM}' must be a finite number > 0, got {a_norm!r}"
        return None

    def new_arrays(self, server_round: int, acc: agg.WeightedModelSum, planned: float) -> agg.NDArrays:
        """w - tau_eff sum_i p_i d_i over the accepted replies, then optional server momentum."""
        global_arrays = _to_numpy(self.current_arrays)
        new = acc.update(global_arrays, agg.fednova_scale(acc) * planned, self.server_lr)
        new, self.momentum_buffer = agg.apply_server_momentum(
            global_arrays, new, self.momentum_buffer, self.server_momentum)
        diag = self.diagnostics.setdefault(server_round, {})
        diag["a-norms"] = [round(float(a), 4) for a in self.last_a_norms]
        diag["tau-eff"] = acc.extras["na"] / acc.extras["n"]
        return new

"""FedVeca (Luo et al., arXiv 2209.13803): FedNova's aggregation (eq. 5) with an adaptive
number of local steps tau_(k,i) per client and round (eq. 15).

The math is in :mod:`strategies.algorithms.fedveca_math` (tau rule, global gradient, L) and
:func:`strategies.engine.averaging.fednova_update` (eq. 5); this module moves data between
Flower records and those functions, and keeps the cross-round state.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..engine import averaging as agg
from .. import contract as C
from . import fedveca_math as vm
from ..engine import trust_gate
from .fednova import FedNova
from ..engine.records import to_numpy
from ..engine.round_plan import ClientTask, RoundPlan
from ..engine.round_report import FedVecaEstimates, FedVecaSection

STATE_VERSION = 1


class FedVeca(FedNova):
    """FedVeca: per-client adaptive local steps from the bi-directional vectors.

    Round k of the paper is Flower's ``server_round`` k + 1. Every round:

    1. ``configure_train`` sends each sampled node its own ConfigRecord: the common
       train config plus ``local-steps`` = its tau_(k,i), ``gnorm2-prev`` =
       ||grad F(w_{k-1})||^2, ``fedveca-estimate`` (k >= 1), ``beta-mode`` and
       ``grad-subsample``.
    2. ``aggregate_train`` applies eq. (5), w_{k+1} = w_k - eta tau_k d_k (FedNova's
       rule with ||a_i||_1 = tau_i, p_i = D_i / sum_j D_j over the accepted replies),
       forms the global gradient grad F(w_k) = sum_i p_i grad F_i(w_k) (eq. 8), folds
       the smoothness estimate L_{k-1} into the running max L (Alg. 1 lines 11-16,
       diagnostic only), and, when the clients sent beta and delta, sets
       tau_(k+1,i) = floor(A_i / (A_i - alpha min_j A_j)), A_i = eta beta_i^2 delta_i,
       then <= 1 -> 2 and the cap ``tau_max`` (eq. 15, Alg. 1 lines 17-21).

    Timeline (Alg. 1): rounds k = 0 and 1 use ``tau_init``; round 0 has no
    ||grad F(w_{-1})||^2, so clients first estimate beta and delta in round 1, and the
    first adaptive tau is used in round k = 2 (``server_round`` 3).

    Partial participation (not in the paper): p_i, tau_k, grad F(w_k) and min_j A_j are
    taken over the clients whose replies were accepted this round; a client that is
    not sampled, fails, or sends no estimate keeps its last tau. Clients are keyed by
    the ``partition-id`` they report to the client-info query (``query_client_info=True``;
    node id without it), so the tau table survives node restarts and checkpoints.

    Parameters
    ----------
    tau_init : int
        tau_(0,i) = tau_(1,i) for every client, >= 2 (default 20 = floor(1 / (1 - 0.95))).
    tau_max : int
        Cap on every tau (paper Sec. IV-A4: 50).
    alpha : float
        alpha_k of eq. (15), fixed over rounds (paper: 0.95). Theorem 2 needs
        0 < alpha < min(1, 2L / min A) (logged, not enforced); alpha >= 1 makes the
        clients with r_i <= alpha "negative direction" clients, which get ``tau_max``.
    beta_mode : str
        Client estimator of beta (Assumption 3, Alg. 2 lines 14-16): ``"same-batch"`` (both
        gradients on the
        step's minibatch; default) or ``"literal"`` (Alg. 2 line 15: full local
        gradient at w_k vs. the minibatch gradient at w^lambda).
    grad_subsample : int
        0: grad F_i(w_k) over the whole local set (paper). > 0: over this many random
        local examples (faster, noisier).
    lr : float
        eta for A_i and eta tau_k L when a node's config carries no ``lr`` (the paper
        uses 0.01; normally the ``lr`` of the train config is used).
    **kwargs
        As :class:`FedAvg` (``fraction_train``, ``seed``, ``min_available_nodes``, ...).
        Simulated stragglers, server momentum and a server learning rate are not part
        of eq. (5) and are rejected.

    Contract
    --------
    Server -> client, per node (ConfigRecord ``config``): ``server-round``, ``lr``,
    ``batch-size``, ``local-steps`` (this client's tau), ``gnorm2-prev`` (float, 0.0
    when unknown), ``fedveca-estimate`` (bool), ``beta-mode``, ``grad-subsample``.
    The client runs exactly ``local-steps`` plain SGD steps (eq. 1: no momentum, no
    weight decay, a fresh minibatch each step) from the received model w_k.

    Client -> server: ArrayRecord ``arrays`` (the local model after tau steps, same
    keys, shapes and dtypes as the global model); ArrayRecord ``grad`` with
    grad F_i(w_k), the mean-loss gradient at the *received* model over the local
    training set, one array per floating array of the model (same key and shape;
    zeros for floating buffers that are not parameters); MetricRecord ``metrics`` with
    ``num-examples`` (D_i), ``local-steps`` (tau actually run, >= 1) and, when
    ``fedveca-estimate`` is true, ``beta`` and ``delta`` (finite, >= 0). A reply
    missing any of these, or with NaN / Inf in its arrays, is rejected with one log
    line naming the node; the others are aggregated. ``strategies.client.fedveca.fedveca_train``
    computes all of it for a PyTorch model; a round in which every reply lacks
    ``local-steps`` or ``grad`` stops the run with a
    :class:`strategies.engine.records.ClientContractError` naming that helper.
    """

    CLIENT_HELPER = "strategies.client.fedveca_train"
    min_partial_steps = vm.TAU_MIN  # delta_(k,i) needs two local steps (Alg. 2 line 18)

    def __init__(self, *flower_args, tau_init: int = 20, tau_max: int = 50, alpha: float = 0.95,
                 beta_mode: str = "same-batch", grad_subsample: int = 0, lr: float = 0.01,
                 **kwargs) -> None:
        if isinstance(tau_max, bool) or not isinstance(tau_max, int) or tau_max < vm.TAU_MIN:
            raise ValueError(f"tau_max must be an integer >= {vm.TAU_MIN}, got {tau_max!r}")
        if (isinstance(tau_init, bool) or not isinstance(tau_init, int)
                or not vm.TAU_MIN <= tau_init <= tau_max):
            raise ValueError(f"tau_init must be an integer in [{vm.TAU_MIN}, tau_max={tau_max}] "
                             f"(delta needs two local steps), got {tau_init!r}")
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"alpha must be a finite number > 0 (the paper uses 0.95), "
                             f"got {alpha!r}")
        if (isinstance(grad_subsample, bool) or not isinstance(grad_subsample, int)
                or grad_subsample < 0):
            raise ValueError(f"grad_subsample must be an integer >= 0 (0 = whole local set), "
                             f"got {grad_subsample!r}")
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
        for name, neutral in (("straggler_fraction", 0.0), ("server_momentum", 0.0),
                              ("server_lr", 1.0)):
            if kwargs.get(name, neutral) != neutral:
                raise ValueError(f"FedVeca: {name}={kwargs[name]!r} is not supported (eq. 5 has no "
                                 f"such term; FedVeca sets each client's local steps itself); "
                                 f"leave it at {neutral}")
        super().__init__(*flower_args, **kwargs)
        self.tau_init = int(tau_init)
        self.tau_max = int(tau_max)
        self.alpha = float(alpha)
        self.beta_mode = vm.normalise_beta_mode(beta_mode)
        self.grad_subsample = int(grad_subsample)
        self.lr = float(lr)
        # cross-round state (state_dict / load_state_dict)
        self.taus: dict[str, int] = {}
        self.smoothness_max: float | None = None  # L, running max (Alg. 1 line 16)
        # L_k, folded into L in round k + 1 (one-round delay)
        self.smoothness_pending: float | None = None
        self.gnorm2_prev: float | None = None  # ||grad F(w_k)||^2, sent in round k + 1
        self.prev_model: agg.NDArrays | None = None  # w_k (floating arrays)
        self.prev_grad: agg.NDArrays | None = None  # grad F(w_k)
        self._warned_solver = False

    def summary(self) -> None:
        """Log the configuration."""
        log(INFO, "\t├──> FedVeca: tau_init %d, tau_max %d, alpha %s, beta mode %s, "
            "grad subsample %s", self.tau_init, self.tau_max, self.alpha, self.beta_mode,
            self.grad_subsample or "off")
        log(INFO, "\t├──> FedVeca clients run tau plain-SGD steps (eq. 1: no momentum, no "
            "weight decay) at the train config's lr (%g when it sends none): an lr tuned for "
            "SGD with momentum rho is about (1 - rho) times too small (docs/strategies/fedveca.md)", self.lr)
        super().summary()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The cross-round state (tau table, L, previous global gradient and model).

        numpy arrays are copied; everything else is plain Python (JSON-able but for the arrays).
        """
        def copy(arrays):
            return (None if arrays is None else
                    {k: np.array(v, copy=True) for k, v in arrays.items()})
        return {
            **self.participation.state_dict(),
            "version": STATE_VERSION,
            "taus": dict(self.taus),
            "smoothness-max": self.smoothness_max,
            "smoothness-pending": self.smoothness_pending,
            "gnorm2-prev": self.gnorm2_prev,
            "prev-model": copy(self.prev_model),
            "prev-grad": copy(self.prev_grad),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"FedVeca state version {state.get('version')!r} is not "
                             f"{STATE_VERSION}")
        taus = {str(k): int(v) for k, v in state["taus"].items()}
        bad = {k: v for k, v in taus.items() if not vm.TAU_MIN <= v <= self.tau_max}
        if bad:
            raise ValueError(f"FedVeca state has taus outside [{vm.TAU_MIN}, {self.tau_max}]: "
                             f"{bad}")
        self.taus = taus
        self.smoothness_max = state["smoothness-max"]
        self.smoothness_pending = state["smoothness-pending"]
        self.gnorm2_prev = state["gnorm2-prev"]
        self.prev_model = _copied(state["prev-model"])
        self.prev_grad = _copied(state["prev-grad"])
        self.participation.load_state_dict(state)

    # ------------------------------------------------------------------ configure
    def client_key(self, node_id: int) -> str:
        """The tau table's key of a node: its partition id, else ``node-<id>``."""
        return self.participation.client_key(node_id)

    def tau_of(self, node_id: int) -> int:
        """tau this node runs next: its last adaptive tau, else tau_init."""
        return self.taus.get(self.client_key(node_id), self.tau_init)

    def estimating(self) -> bool:
        """Clients estimate beta and delta once ||grad F(w_{k-1})||^2 is known and > 0 (k >= 1)."""
        g = self.gnorm2_prev
        return g is not None and math.isfinite(g) and g > 0

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's selection; one message per node with its own tau in its own ConfigRecord."""
        ignored = {k: config[k] for k in (C.MOMENTUM, C.WEIGHT_DECAY, C.PROXIMAL_MU)
                   if config.get(k, 0)}
        if ignored and not self._warned_solver:
            self._warned_solver = True
            log(WARNING, "FedVeca: clients run plain SGD (eq. 1); the train config's %s are "
                "ignored", ignored)
        messages = super().configure_train(server_round, arrays, config, grid)
        plan = self.plan_of(server_round)
        plan.report.add(FedVecaSection(
            tau_sent={self.client_key(n): int(t.config[C.LOCAL_STEPS])
                      for n, t in plan.tasks.items()},
            estimate=self.estimating()))
        return messages

    def round_eta(self, plan: RoundPlan) -> float:
        """eta of the round (eq. 15 and eta tau_k L): the ``lr`` sent (lr_t under FedAvg's
        schedule), else ``lr``."""
        return float(plan.config.get(C.LR, self.lr))

    def full_local_steps(self, node_id: int, config: ConfigRecord) -> int:
        """This node's full local work: its tau (what ``round_deadline`` may cut)."""
        return self.tau_of(node_id)

    def examples_per_step(self, node_id: int, config: ConfigRecord) -> int:
        """b_i, doubled while the same-batch beta estimate takes a second gradient per step."""
        b = super().examples_per_step(node_id, config)
        estimate = config.get(C.FEDVECA_ESTIMATE, self.estimating())
        same_batch = config.get(C.BETA_MODE, self.beta_mode) == "same-batch"
        return 2 * b if estimate and same_batch else b

    def extra_examples(self, node_id: int, config: ConfigRecord) -> int:
        """grad F_i(w_k) over the local set, or ``grad_subsample`` of it (Alg. 2 line 9)."""
        n = self.participation.info(node_id).num_examples or 0
        return min(self.grad_subsample, n) if self.grad_subsample > 0 else n

    def expected_bytes(self, arrays: ArrayRecord) -> tuple[int, int]:
        """The model down; the model and ``grad`` (its floating arrays) up."""
        down, up = super().expected_bytes(arrays)
        grad = sum(len(a.data) + len(k) for k, a in arrays.items()
                   if np.issubdtype(np.dtype(a.dtype), np.floating))
        return down, up + grad

    def task_config(self, plan: RoundPlan, task: ClientTask) -> ConfigRecord:
        """The common config plus this node's ``local-steps`` (its tau, or the part of it that
        fits ``round_deadline``) and the FedVeca keys."""
        own = ConfigRecord(dict(task.config))
        own[C.LOCAL_STEPS] = (task.reduced_work if task.reduced_work is not None
                              else self.tau_of(task.node_id))
        own[C.GNORM2_PREV] = float(self.gnorm2_prev) if self.estimating() else 0.0
        own[C.FEDVECA_ESTIMATE] = self.estimating()
        own[C.BETA_MODE] = self.beta_mode
        own[C.GRAD_SUBSAMPLE] = self.grad_subsample
        return own

    # ------------------------------------------------------------------ replies
    def contract_gap(self, reply: Message) -> str | None:
        """The FedVeca keys a reply lacks (a stock ClientApp sends neither), or None."""
        metrics = reply.content.metric_records.get(C.METRICS)
        if metrics is None or C.LOCAL_STEPS_TAKEN not in metrics:
            return f"the metric '{C.LOCAL_STEPS_TAKEN}'"
        if C.GRAD not in reply.content.array_records:
            return f"the ArrayRecord '{C.GRAD}'"
        return None

    def reply_problem(self, plan: RoundPlan, reply: Message) -> str | None:
        """FedNova's checks plus: ``local-steps``, the ``grad`` ArrayRecord (keys, shapes, finite)
        and, when asked for, finite ``beta`` and ``delta`` >= 0."""
        problem = super().reply_problem(plan, reply)
        if problem:
            return problem
        content = reply.content
        metrics = content[C.METRICS]
        if C.LOCAL_STEPS_TAKEN not in metrics:
            return f"FedVeca needs metric '{C.LOCAL_STEPS_TAKEN}' (the SGD steps taken)"
        if C.GRAD not in content.array_records:
            return f"FedVeca needs an ArrayRecord '{C.GRAD}' (grad F_i at the received model)"
        expected = {k: a for k, a in plan.arrays.items()
                    if np.issubdtype(np.dtype(a.dtype), np.floating)}
        problem = trust_gate.arrays_problem(C.GRAD, content[C.GRAD], expected)  # real bytes
        if problem:
            return problem
        if plan.sent(reply.metadata.src_node_id).get(C.FEDVECA_ESTIMATE, False):
            for key in (C.BETA, C.DELTA):
                value = metrics.get(key)
                if (value is None or isinstance(value, bool) or not isinstance(value, (int, float))
                        or not math.isfinite(value) or value < 0):
                    return (f"'{key}' must be a finite number >= 0 when "
                            f"'{C.FEDVECA_ESTIMATE}' is sent, got {value!r}")
        return None

    def a_norm(self, plan: RoundPlan, reply: Message) -> float:
        """||a_i||_1 = tau_i: FedVeca's clients run plain SGD (eq. 5)."""
        return agg.fednova_norm_sgd(int(reply.content[C.METRICS][C.LOCAL_STEPS_TAKEN]))

    def aggregate_round(self, plan: RoundPlan, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """eq. (8), then eq. (5) via FedNova, then L and the tau rule (15) for the next round.

        Both sums stream the replies in place (one accumulator each, in the arrays' own
        float32). A reply whose gradient or model holds NaN / Inf is left out of both.
        """
        checked = self.checked_replies(plan, replies)
        grad, checked = self.global_gradient(checked)
        new, accepted = self.aggregate_checked(plan, checked)
        if len(accepted) < len(checked):  # a model had NaN / Inf: eq. (8) over the rest
            grad, _ = self.global_gradient(accepted)
        result = self.train_result(plan, new, accepted)
        del new  # the model's accumulator: free it before L's work
        if accepted:
            self.update_step_sizes(plan, accepted, grad)
        return result

    def global_gradient(self, replies: list[Message]) -> tuple[agg.NDArrays | None,
                                                                list[Message]]:
        """eq. (8), grad F(w_k) = sum_i p_i grad F_i(w_k), over ``replies``, and the replies
        it covers: those whose gradient has NaN / Inf are left out (one log line each)."""
        grads = [to_numpy(r.content[C.GRAD]) for r in replies]
        sizes = [float(r.content[C.METRICS][C.NUM_EXAMPLES]) for r in replies]
        result = vm.gradient_mean(grads, sizes)  # no recursion: eq. (8) in <= 3 passes
        for k, bad_key in result.rejected:
            log(WARNING, "Reply from node %d rejected: '%s' array '%s' has NaN or Inf",
                replies[k].metadata.src_node_id, C.GRAD, bad_key)
        return result.mean, [replies[k] for k in result.kept]

    def update_step_sizes(self, plan: RoundPlan, accepted: list[Message],
                          grad: agg.NDArrays) -> None:
        """L and the next taus from this round's accepted replies and their eq. (8)
        gradient; the round's report."""
        eta = self.round_eta(plan)
        keys = [self.client_key(r.metadata.src_node_id) for r in accepted]
        records = [r.content[C.METRICS] for r in accepted]
        sizes = [float(m[C.NUM_EXAMPLES]) for m in records]
        executed = [int(m[C.LOCAL_STEPS_TAKEN]) for m in records]
        tau_k = vm.aggregated_tau(executed, sizes)
        model = vm.floating_only(to_numpy(plan.arrays))
        # L: L_{k-1} joins the running max now (Alg. 1 lines 11-16), L_k is computed for round k + 1
        latest = self.smoothness_pending
        self.smoothness_max = vm.running_max(self.smoothness_max, latest)
        if self.prev_grad is None:
            self.smoothness_pending = vm.initial_smoothness(grad, model)
        else:
            self.smoothness_pending = vm.smoothness(grad, self.prev_grad, model, self.prev_model)
        self.prev_model, self.prev_grad = model, grad
        self.gnorm2_prev = vm.squared_norm(grad)
        # eq. (15) from the clients that were asked for (and sent) beta and delta
        sent = [plan.sent(r.metadata.src_node_id) for r in accepted]
        estimated = [bool(s.get(C.FEDVECA_ESTIMATE, False)) for s in sent]
        betas = [float(m[C.BETA]) if e else None for m, e in zip(records, estimated)]
        deltas = [float(m[C.DELTA]) if e else None for m, e in zip(records, estimated)]
        etas = [float(s.get(C.LR, eta)) for s in sent]
        effects = [vm.non_iid_effect(eta, b, d) if b is not None else None
                   for eta, b, d in zip(etas, betas, deltas)]
        decision = vm.next_taus(effects, self.alpha, self.tau_max)
        for key, tau in zip(keys, decision.taus):
            if tau is not None:
                self.taus[key] = int(tau)
        next_taus = [self.taus.get(key, self.tau_init) for key in keys]
        tau_next = vm.aggregated_tau(next_taus, sizes)
        L = self.smoothness_max
        sent_section = plan.report.get(FedVecaSection) or FedVecaSection()
        plan.report.add(dataclasses.replace(
            sent_section, tau=dict(zip(keys, executed)), tau_k=tau_k,
            tau_next=dict(zip(keys, next_taus)), tau_k_next=tau_next,
            tau_table=dict(sorted(self.taus.items())), gnorm2=self.gnorm2_prev,
            smoothness_latest=_finite(latest), smoothness=_finite(L),
            eta_tau_k_l=_finite(eta * tau_k * L) if L is not None else None))
        if any(estimated):
            eps = (self.alpha * decision.min_a / L) if (L and decision.min_a) else None
            plan.report.add(FedVecaEstimates(
                beta=_per_client(keys, betas), delta=_per_client(keys, deltas),
                effect=_per_client(keys, effects), ratio=_per_client(keys, decision.ratios),
                sign=dict(zip(keys, decision.signs)), reason=dict(zip(keys, decision.reasons)),
                min_effect=_finite(decision.min_a),
                alpha_bound=_finite(vm.alpha_upper_bound(L, decision.min_a)),
                eta_tau_k_l_upper=_finite(4.0 / (2.0 + eps)) if eps is not None else None))
        log(INFO, "FedVeca round %d: tau_k %.3g, next taus %s, L %s", plan.server_round, tau_k,
            _taus_summary(keys, next_taus), "n/a" if L is None else f"{L:.4g}")


def _taus_summary(keys: list[str], taus: list[int]) -> str:
    """Every client's tau for up to 10 clients, else min / median / max (the run log has all)."""
    if len(taus) <= 10:
        return str(dict(zip(keys, taus)))
    ordered = sorted(taus)
    return (f"min {ordered[0]} / median {ordered[len(ordered) // 2]} / max {ordered[-1]} "
            f"over {len(taus)} clients")


def _copied(arrays: dict | None) -> dict | None:
    return None if arrays is None else {k: np.array(v) for k, v in arrays.items()}


def _finite(value: float | None) -> float | None:
    """JSON-safe: None for a missing, NaN or Inf value."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _per_client(keys: list[str], values: list[float | None]) -> dict[str, float | None]:
    return {k: _finite(v) for k, v in zip(keys, values)}

"""FedVeca (Luo et al., "FedVeca: Federated Vectorized Averaging on Non-IID Data with Adaptive
Bi-directional Global Objective", arXiv 2209.13803): FedNova's aggregation (eq. 5) with an
adaptive number of local steps tau_(k,i) per client and round (eq. 15).

The math is in :mod:`strategies.algorithms.fedveca_math` (tau rule, global gradient, L) and
:func:`strategies.engine.averaging.fednova_update` (eq. 5); :class:`AdaptiveSteps` moves data
between Flower records and those functions and keeps the cross-round state;
:class:`FedVecaWork` tells the engine each client's local work (its tau).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from logging import INFO, WARNING

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.common.logger import log

from .. import contract as C
from ..contract import Section, logged
from ..engine import averaging as agg
from ..engine import trust_gate
from ..engine.algorithm import Algorithm, Contract, Outgoing, RoundInput, RoundUpdate
from ..engine.keys import Key, Rule, above, at_least
from ..engine.records import ClientInfo, to_numpy
from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.round_plan import RoundPlan
from . import fedveca_math as vm
from .fednova import FedNovaSection

__all__ = ["AdaptiveSteps", "FedVeca", "FedVecaWork"]

FEDVECA_HELPER = "strategies.client.fedveca_train"


@dataclass(frozen=True)
class FedVecaEstimates(Section):
    """FedVeca's per-client estimates of a round in which they were asked for (eq. 15)."""

    beta: Mapping[str, float | None] = logged(C.LOG_FEDVECA_BETA, default=None)
    delta: Mapping[str, float | None] = logged(C.LOG_FEDVECA_DELTA, default=None)
    effect: Mapping[str, float | None] = logged(C.LOG_FEDVECA_A, default=None)
    ratio: Mapping[str, float | None] = logged(C.LOG_FEDVECA_R, default=None)
    sign: Mapping[str, int] = logged(C.LOG_FEDVECA_SIGN, default=None)
    reason: Mapping[str, str] = logged(C.LOG_FEDVECA_REASON, default=None)
    min_effect: float | None = logged(C.LOG_FEDVECA_MIN_A, keep_none=True)
    alpha_bound: float | None = logged(C.LOG_FEDVECA_ALPHA_BOUND, keep_none=True)
    eta_tau_k_l_upper: float | None = logged(C.LOG_FEDVECA_ETA_TAU_K_L_UPPER, keep_none=True)


@dataclass(frozen=True)
class FedVecaSection(Section):
    """FedVeca's step sizes (Alg. 1-2, eqs. 8, 15); per-client dicts keyed by client key."""

    tau_sent: Mapping[str, int] | None = logged(C.LOG_FEDVECA_TAU_SENT)
    estimate: bool | None = logged(C.LOG_FEDVECA_ESTIMATE)
    tau: Mapping[str, int] | None = logged(C.LOG_FEDVECA_TAU)
    tau_k: float | None = logged(C.LOG_FEDVECA_TAU_K)
    tau_next: Mapping[str, int] | None = logged(C.LOG_FEDVECA_TAU_NEXT)
    tau_k_next: float | None = logged(C.LOG_FEDVECA_TAU_K_NEXT)
    tau_table: Mapping[str, int] | None = logged(C.LOG_FEDVECA_TAU_TABLE)
    gnorm2: float | None = logged(C.LOG_FEDVECA_GNORM2)
    smoothness_latest: float | None = logged(C.LOG_FEDVECA_L_LATEST, keep_none=True)
    smoothness: float | None = logged(C.LOG_FEDVECA_L, keep_none=True)
    eta_tau_k_l: float | None = logged(C.LOG_FEDVECA_ETA_TAU_K_L, keep_none=True)


class AdaptiveSteps(Algorithm):
    """FedVeca's algorithm (:class:`FedVeca`): each client's tau and the estimates it asks
    for beside the model, the gradient and the estimates checked, eq. (5), (8) and (15)."""

    name = "FedVeca"
    contract = Contract(helper=FEDVECA_HELPER, metrics=(C.LOCAL_STEPS_TAKEN,),
                        arrays=(C.GRAD,))

    def __init__(self, tau_init: int = 20, tau_max: int = 50, alpha: float = 0.95,
                 beta_mode: str = "same-batch", grad_subsample: int = 0,
                 lr: float = 0.01) -> None:
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
        self.tau_init, self.tau_max, self.alpha = int(tau_init), int(tau_max), float(alpha)
        self.beta_mode = vm.normalise_beta_mode(beta_mode)
        self.grad_subsample, self.lr = int(grad_subsample), float(lr)
        # cross-round state (state_dict / load_state_dict)
        self.taus: dict[str, int] = {}
        self.smoothness_max: float | None = None  # L, running max (Alg. 1 line 16)
        self.smoothness_pending: float | None = None  # L_k, folded into L in round k + 1
        self.gnorm2_prev: float | None = None  # ||grad F(w_k)||^2, sent in round k + 1
        self.prev_model: agg.NDArrays | None = None  # w_k (floating arrays)
        self.prev_grad: agg.NDArrays | None = None  # grad F(w_k)
        self.warned_solver = False

    def send(self, plan: RoundPlan) -> Outgoing:
        """Each node's ``local-steps`` (its tau, or the part of it that fits
        ``round_deadline``) and the FedVeca keys; the taus sent go to the report."""
        ignored = {k: plan.config[k] for k in (C.MOMENTUM, C.WEIGHT_DECAY, C.PROXIMAL_MU)
                   if plan.config.get(k, 0)}
        if ignored and not self.warned_solver:
            self.warned_solver = True
            log(WARNING, "FedVeca: clients run plain SGD (eq. 1); the train config's %s are "
                "ignored", ignored)
        estimating = estimates_wanted(self.gnorm2_prev)
        steps = {node: task.reduced_work if task.reduced_work is not None
                 else self.taus.get(plan.client_key(node), self.tau_init)
                 for node, task in plan.tasks.items()}
        common = {C.GNORM2_PREV: float(self.gnorm2_prev) if estimating else 0.0,
                  C.FEDVECA_ESTIMATE: estimating, C.BETA_MODE: self.beta_mode,
                  C.GRAD_SUBSAMPLE: self.grad_subsample}
        section = FedVecaSection(tau_sent={plan.client_key(n): int(t) for n, t in steps.items()},
                                 estimate=estimating)
        return Outgoing(common=common,
                        per_node={node: {C.LOCAL_STEPS: tau} for node, tau in steps.items()},
                        sections=[section])

    def check(self, plan: RoundPlan, reply: Message) -> str | None:
        """The ``grad`` ArrayRecord (keys, shapes, real bytes) and, when asked for, finite
        ``beta`` and ``delta`` >= 0."""
        content, metrics = reply.content, reply.content[C.METRICS]
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

    def update(self, r: RoundInput) -> RoundUpdate:
        """eq. (8), then eq. (5) (FedNova's rule with ||a_i||_1 = tau_i), then L and the tau
        rule (15) for the next round. Both sums stream the replies in place; a reply whose
        gradient or model holds NaN / Inf is left out of both."""
        grad, kept = global_gradient(list(r.replies))
        replies = [r.replies[k] for k in kept]
        a_norms = [agg.fednova_norm_sgd(int(m.content[C.METRICS][C.LOCAL_STEPS_TAKEN]))
                   for m in replies]
        n = [float(m.content[C.METRICS][C.NUM_EXAMPLES]) for m in replies]
        new, _, used, tau_eff = agg.fednova_update(
            r.global_arrays, [(i, r.models[k][1]) for i, k in enumerate(kept)],
            agg.coefficients_fednova(n, a_norms) if replies else None,
            on_reject=lambda i, key: r.reject(kept[i], key))
        sections = ([FedNovaSection([round(float(a_norms[i]), 4) for i in used], tau_eff)]
                    if used else [])
        accepted = [replies[i] for i in used]
        if len(used) < len(kept):  # a model had NaN / Inf: eq. (8) over the rest
            grad, _ = global_gradient(accepted)
        if accepted:
            update_step_sizes(self, r.plan, accepted, grad)
        return RoundUpdate(new, [kept[i] for i in used], sections=sections)

    def state_dict(self) -> dict:
        """The cross-round state: tau table, L, previous global gradient and model."""
        return {"taus": dict(self.taus), "smoothness-max": self.smoothness_max,
                "smoothness-pending": self.smoothness_pending, "gnorm2-prev": self.gnorm2_prev,
                "prev-model": agg.copied(self.prev_model), "prev-grad": agg.copied(self.prev_grad)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (taus within [2, tau_max])."""
        taus = {str(k): int(v) for k, v in state["taus"].items()}
        bad = {k: v for k, v in taus.items() if not vm.TAU_MIN <= v <= self.tau_max}
        if bad:
            raise ValueError(f"FedVeca state has taus outside [{vm.TAU_MIN}, {self.tau_max}]: "
                             f"{bad}")
        self.taus = taus
        self.smoothness_max = state["smoothness-max"]
        self.smoothness_pending = state["smoothness-pending"]
        self.gnorm2_prev = state["gnorm2-prev"]
        self.prev_model = agg.copied(state["prev-model"])
        self.prev_grad = agg.copied(state["prev-grad"])


def estimates_wanted(gnorm2_prev: float | None) -> bool:
    """Clients estimate beta and delta once ||grad F(w_{k-1})||^2 is known and > 0 (k >= 1)."""
    return gnorm2_prev is not None and math.isfinite(gnorm2_prev) and gnorm2_prev > 0


def global_gradient(replies: list[Message]) -> tuple[agg.NDArrays | None, list[int]]:
    """eq. (8), grad F(w_k) = sum_i p_i grad F_i(w_k), over ``replies``, and the positions it
    covers: those whose gradient has NaN / Inf are left out (one log line each)."""
    grads = [to_numpy(r.content[C.GRAD]) for r in replies]
    sizes = [float(r.content[C.METRICS][C.NUM_EXAMPLES]) for r in replies]
    result = vm.gradient_mean(grads, sizes)  # no recursion: eq. (8) in <= 3 passes
    for k, bad_key in result.rejected:
        log(WARNING, "Reply from node %d rejected: '%s' array '%s' has NaN or Inf",
            replies[k].metadata.src_node_id, C.GRAD, bad_key)
    return result.mean, list(result.kept)


class FedVecaWork:
    """FedVeca's local work for the engine (:class:`strategies.engine.work.WorkRules`):
    tau_(k,i) steps, b_i doubled while the same-batch beta estimate takes a second gradient
    per step, grad F_i(w_k) over the local set (or ``grad_subsample`` of it) beyond the
    steps; a deadline straggler needs two steps (delta_(k,i), Alg. 2 line 18)."""

    min_partial_steps = vm.TAU_MIN

    def __init__(self, algorithm: AdaptiveSteps) -> None:
        self.algorithm = algorithm

    def full_local_steps(self, key: str, info: ClientInfo, config: ConfigRecord) -> int:
        """This client's full local work: its tau (what ``round_deadline`` may cut)."""
        return self.algorithm.taus.get(key, self.algorithm.tau_init)

    def examples_per_step(self, key: str, info: ClientInfo, config: ConfigRecord,
                          plain: int) -> int:
        """b_i, doubled while the same-batch beta estimate runs."""
        a = self.algorithm
        estimate = config.get(C.FEDVECA_ESTIMATE, estimates_wanted(a.gnorm2_prev))
        same_batch = config.get(C.BETA_MODE, a.beta_mode) == "same-batch"
        return 2 * plain if estimate and same_batch else plain

    def extra_examples(self, key: str, info: ClientInfo, config: ConfigRecord) -> int:
        """grad F_i(w_k) over the local set, or ``grad_subsample`` of it (Alg. 2 line 9)."""
        n, sub = info.num_examples or 0, self.algorithm.grad_subsample
        return min(sub, n) if sub > 0 else n


def update_step_sizes(self: AdaptiveSteps, plan: RoundPlan, accepted: list[Message],
                      grad: agg.NDArrays) -> None:
    """L and the next taus of ``fedveca`` from this round's accepted replies and their eq. (8)
    gradient (Alg. 1 lines 11-21); the round's report."""
    eta = float(plan.config.get(C.LR, self.lr))  # lr_t under a schedule
    keys = [plan.client_key(r.metadata.src_node_id) for r in accepted]
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


def _finite(value: float | None) -> float | None:
    """JSON-safe: None for a missing, NaN or Inf value."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _per_client(keys: list[str], values: list[float | None]) -> dict[str, float | None]:
    return {k: _finite(v) for k, v in zip(keys, values)}


class FedVeca(RoundEngine):
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
        As :class:`~strategies.engine.round_engine.RoundEngine` (``fraction_train``, ``seed``, ``min_available_nodes``, ...).
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

    def __init__(self, *flower_args, tau_init: int = 20, tau_max: int = 50,
                 alpha: float = 0.95, beta_mode: str = "same-batch", grad_subsample: int = 0,
                 lr: float = 0.01, **kwargs) -> None:
        for name, neutral in (("straggler_fraction", 0.0), ("server_momentum", 0.0),
                              ("server_lr", 1.0)):
            if kwargs.get(name, neutral) != neutral:
                raise ValueError(f"FedVeca: {name}={kwargs[name]!r} is not supported (eq. 5 has "
                                 f"no such term; FedVeca sets each client's local steps "
                                 f"itself); leave it at {neutral}")
        if kwargs.get("weighting", "examples") != "examples":
            raise ValueError(f"FedVeca weights clients by num-examples (eq. 5); "
                             f"weighting={kwargs['weighting']!r} is not supported")
        algorithm = AdaptiveSteps(tau_init, tau_max, alpha, beta_mode, grad_subsample, lr)
        kwargs.setdefault("straggler_policy", "partial")
        kwargs.pop("server_momentum", None)
        super().__init__(*flower_args, algorithm=algorithm, work=FedVecaWork(algorithm), **kwargs)


FEDVECA_WHY = ("FedVeca's clients run plain local SGD (eq. 1) and its server step is FedNova's "
               "eq. (5) with the tau it sets itself")
KEYS = (
    Key("fedveca-tau-init", 20, "FedVeca's τ of rounds 0 and 1 ([FedVeca](strategies/fedveca.md))",
        interval=at_least(vm.TAU_MIN), note="(δ needs two local steps)", arg="tau_init"),
    Key("fedveca-tau-max", 50, "FedVeca's cap on every τ", interval=at_least(vm.TAU_MIN),
        arg="tau_max"),
    Key("fedveca-alpha", 0.95, "FedVeca's α of eq. (15)", interval=above(0.0), arg="alpha"),
    Key("fedveca-beta-mode", "same-batch",
        "FedVeca's client estimator of β: `same-batch` or `literal` (Alg. 2)",
        check=vm.normalise_beta_mode,
        note=f"{' or '.join(vm.BETA_MODES)} (same_batch = same-batch)", arg="beta_mode"),
    Key("fedveca-grad-subsample", 0, "examples for ∇F_i(w_k) (0 = the whole local set)",
        interval=at_least(0), arg="grad_subsample"),
)
register("fedveca", FedVeca, "FedVeca (Luo et al.): per-client adaptive local steps from "
         "bi-directional vectors (client helper)", keys=KEYS, reads={"lr": "lr"},
         client_side="strategies.client.fedveca",
         only=tuple((key, (value,), FEDVECA_WHY) for key, value in (
             ("weighting", "examples"), ("server-lr", 1.0), ("server-momentum", 0.0),
             ("straggler-fraction", 0.0), ("momentum", 0.0), ("weight-decay", 0.0))),
         rules=(Rule(("fedveca-tau-init", "fedveca-tau-max"),
                     lambda v: v["fedveca-tau-init"] <= v["fedveca-tau-max"],
                     "fedveca-tau-init <= fedveca-tau-max (the cap on every tau)"),))

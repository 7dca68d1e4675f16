"""The round engine: one Flower ``Strategy`` that owns a synchronous round, for every algorithm.

Round t, as Flower's two hooks (and :meth:`RoundEngine.start`'s loop, which keeps the plan
between them as a local value):

* ``configure_train``: the participation model plans the round (who is connected, online,
  selected, with how much work: :mod:`strategies.engine.participation`); each task gets the
  engine's keys (the client-state round, the sub-model width) and the algorithm's
  (:meth:`~strategies.engine.algorithm.Algorithm.send`); the messages carry w_t, or each
  client's sub-model, and the algorithm's records.
* ``aggregate_train``: every reply passes the trust gate against what its node was sent,
  the contract and the algorithm's own check (one log line for each refused reply; a round
  whose replies all lack the contract stops with a ``ClientContractError`` naming the
  helper); an over-committed round keeps its first m replies on the simulated clock; the
  algorithm makes the new model from the accepted ones
  (:meth:`~strategies.engine.algorithm.Algorithm.update`, on the one averaging kernel
  :mod:`strategies.engine.averaging`); the engine reports the round, moves the simulated
  clock, tells the selection policy, updates the client-state copies and adopts the model
  only when it is finite.

Components the engine is given (none is a base class): the
:class:`~strategies.engine.participation.Participation` model, the
:class:`~strategies.engine.submodels.SubModels` of width-heterogeneous strategies, the
:class:`~strategies.engine.client_states.ClientStates` copies of stateful clients, and the
algorithm's own work rules (:class:`~strategies.engine.work.LocalWork`), and a robust rule
(:mod:`strategies.engine.robust`: coordinate-wise median or trimmed mean of the client
updates in place of their weighted average, for an algorithm whose update is that average).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO, WARNING

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import Result

from .. import contract as C
from . import averaging as agg
from . import flower_args, packing, records, rounds, schedules, trust_gate
from . import robust as robust_aggregation
from .algorithm import Algorithm, RoundInput, RoundUpdate
from .client_states import ClientStates
from .clock import SimClock
from .event_loop import GridEventLoop
from .participation import (
    Participation,
    SelectionPolicy,
    check_choice,
    check_fraction,
    check_whole,
)
from .round_plan import RoundPlan
from .round_report import (Aggregation, DropOut, OverCommitment, ParticipationSection,
                           RoundReport)
from .submodels import SubModels
from .work import LocalWork, WorkRules
from ..selection.policy import selection_weighting

__all__ = ["QUERY_WEIGHTINGS", "RoundEngine", "WEIGHTINGS", "round_coefficients"]

WEIGHTINGS = ("examples", "uniform", "pre-erratum", "scheme-i", "scheme-ii")
QUERY_WEIGHTINGS = ("pre-erratum", "scheme-i", "scheme-ii")  # need every client's n_k


class RoundEngine(FlowerFedAvg):
    """A Flower strategy running ``algorithm`` in synchronous rounds (module docstring).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key, \
train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's FedAvg arguments, positional in Flower's order, with Flower's meaning
        (:mod:`strategies.engine.flower_args`): m = max(floor(C K), ``min_train_nodes``).
    algorithm : Algorithm, optional
        The paper's algorithm (:mod:`strategies.engine.algorithm`); default FedAvg's.
    weighting : str
        c_k of the averaging kernel: ``"examples"`` n_k / m_t over the aggregated clients
        (McMahan et al. 2017, Algorithm 1 with its erratum; default); ``"uniform"``
        1 / |S_t|; ``"pre-erratum"`` n_k / n over all clients, the unsampled ones keeping
        w_t; ``"scheme-i"`` K draws with replacement with p_k = n_k / n, plain mean;
        ``"scheme-ii"`` K of N uniformly, c_k = p_k N / K (both Li et al. 2020). The last
        three need every client's n_k, hence ``query_client_info=True``.
    server_lr : float
        eta_g in w <- w + eta_g sum_k c_k (w_k - w); 1.0 is plain averaging.
    drift_diagnostics : bool
        Log per layer the mean pairwise cosine of the client updates (Hsieh et al.,
        IID->non-IID study, Fig. 13) and the spread of their norms.
    lr_schedule : LRSchedule, str or callable, optional
        Round t sends ``lr`` = ``lr_schedule(t, lr_0)``, lr_0 the train config's ``lr``
        (:mod:`strategies.engine.schedules`); None: ``lr`` as given.
    participation : Participation, optional
        Who takes part, with how much work, on which clock; without it one is built from
        ``seed``, ``min_available_nodes``, ``min_train_nodes``, ``query_client_info``,
        ``query_timeout``, ``straggler_fraction`` / ``straggler_policy`` /
        ``straggler_unit``, ``clock``, ``round_deadline``, ``over_commitment`` and
        ``selection`` (:class:`strategies.engine.participation.Participation`).
    submodels : SubModels, optional
        Width-heterogeneous sub-models (HeteroFL, FjORD, FedRolex).
    work : WorkRules, optional
        The algorithm's own rules for a client's local work (FedVeca's adaptive tau).
    robust : RobustRule or str, optional
        A Byzantine-robust rule in place of the weighted average: ``Median()`` or
        ``TrimmedMean(beta)`` (Yin et al. 2018, Definitions 1 and 2; or their names
        ``"median"``, ``"trimmed-mean"`` with beta 0.1): w + eta_g R(w_k - w), coordinate-wise
        and unweighted, so neither ``weighting`` nor a client's num-examples counts
        (:mod:`strategies.engine.robust`). Only for an algorithm whose update is the engine's
        average (FedAvg, FedProx, FedLC, the width strategies); ``weighting`` must be
        ``"examples"`` (the default) or ``"uniform"``.

    Notes
    -----
    ``min_train_nodes`` and ``min_evaluate_nodes`` default to 1, Algorithm 1's
    m = max(floor(C K), 1) (Flower's default is 2); :meth:`summary` says so.
    """

    def __init__(
        self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0,
        min_train_nodes: int = 1, min_evaluate_nodes: int = 1, min_available_nodes: int = 2,
        weighted_by_key: str = C.NUM_EXAMPLES, arrayrecord_key: str = C.ARRAYS,
        configrecord_key: str = C.CONFIG,
        train_metrics_aggr_fn: flower_args.MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: flower_args.MetricsAggregation | None = None, *,
        algorithm: Algorithm | None = None,
        weighting: str = "examples", server_lr: float = 1.0, seed: int = 0,
        query_client_info: bool = False, query_timeout: float = 600.0,
        straggler_fraction: float = 0.0, straggler_policy: str = "drop",
        straggler_unit: str = "steps", drift_diagnostics: bool = False,
        lr_schedule: schedules.LRSchedule | schedules.Schedule | str | None = None,
        clock: SimClock | None = None, round_deadline: float | None = None,
        over_commitment: float = 0.0, selection: SelectionPolicy | None = None,
        participation: Participation | None = None, submodels: SubModels | None = None,
        work: WorkRules | None = None,
        robust: robust_aggregation.RobustRule | str | None = None,
    ) -> None:
        name = type(self).__name__
        check_fraction("fraction_evaluate", fraction_evaluate, allow_zero=True)
        check_whole("min_evaluate_nodes", min_evaluate_nodes, minimum=0)
        flower_args.check_record_keys(name, weighted_by_key, arrayrecord_key, configrecord_key)
        check_choice("weighting", weighting, WEIGHTINGS)
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        algorithm = algorithm if algorithm is not None else Algorithm()
        lr_schedule = schedules.as_schedule(lr_schedule)
        if isinstance(lr_schedule, schedules.LRSchedule) and lr_schedule.name == "cosine" \
                and lr_schedule.num_rounds is None:
            raise ValueError(f"lr_schedule 'cosine' needs num_rounds: {name} does not know the "
                             f"run's number of rounds; pass LRSchedule('cosine', num_rounds=T)")
        if participation is None:
            participation = Participation(
                fraction_train=fraction_train, seed=seed, min_available_nodes=min_available_nodes,
                min_train_nodes=min_train_nodes, query_client_info=query_client_info,
                query_timeout=query_timeout, straggler_fraction=straggler_fraction,
                straggler_policy=straggler_policy, straggler_unit=straggler_unit, clock=clock,
                round_deadline=round_deadline, over_commitment=over_commitment,
                selection=selection, owner=name)
        # a policy that fixes its own averaging (Power-of-Choice's plain mean) decides it
        weighting = selection_weighting(name, weighting, participation.selection)
        rule = robust_for(name, robust, algorithm, weighting)
        if weighting in QUERY_WEIGHTINGS and not participation.query_client_info:
            raise records.query_required(
                name, f"weighting={weighting!r} (every client's n_k)",
                "use weighting='examples' or 'uniform'")
        super().__init__(**flower_args.flower_base_args(
            participation, fraction_evaluate, min_evaluate_nodes, train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn))
        self.custom_metrics = (train_metrics_aggr_fn, evaluate_metrics_aggr_fn)  # None: ours
        self.algorithm = algorithm
        self.robust = rule
        self.participation = participation
        self.weighting = weighting
        self.server_lr = float(server_lr)
        self.drift_diagnostics = bool(drift_diagnostics)
        self.lr_schedule = lr_schedule
        self.submodels = submodels
        if submodels is not None:
            submodels.bind(participation, name)
        self.work = LocalWork(participation, algorithm.contract, work, submodels, name)
        contract = algorithm.contract
        self.client_states = ClientStates() if contract.client_state else None
        self.contract_evidence = records.ContractEvidence()  # one bad client ends no run
        self.plans: dict[int, RoundPlan] = {}  # the latest round's: configure -> aggregate_train
        self.reports: dict[int, RoundReport] = {}

    # ------------------------------------------------------------------ Flower's hooks
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              first_round: int = 1) -> Result:
        """Flower's round loop on the Grid event loop (:func:`strategies.engine.rounds.
        run_rounds`); ``first_round`` > 1 resumes a checkpoint."""
        return rounds.run_rounds(self, grid, initial_arrays, num_rounds, timeout, train_config,
                                 evaluate_config, evaluate_fn, first_round)

    def summary(self) -> None:
        """Log the configuration, including where the defaults differ from Flower's."""
        p = self.participation
        settings = describe(self.algorithm)
        log(INFO, "\t├──> %s%s", self.algorithm.name, f": {settings}" if settings else "")
        if self.submodels is not None:
            log(INFO, "\t├──> %s", self.submodels.summary_line(self.weighting))
        weighting = (self.weighting if self.robust is None else
                     f"none, {self.robust} of the client updates")
        log(INFO, "\t├──> Weighting: %s | server lr: %s | seed: %s | client-info query: %s",
            weighting, self.server_lr, p.seed, "on" if p.query_client_info else "off")
        differ = flower_args.differences_from_flower(p.min_train_nodes, self.min_evaluate_nodes)
        if differ:
            log(INFO, "\t├──> %s", differ)
        if self.lr_schedule is not None:
            log(INFO, "\t├──> Learning rate per round: %s", self.lr_schedule)
        for line in p.summary_lines():
            log(INFO, "\t├──> %s", line)
        super().summary()

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, loop: GridEventLoop, timeout: float | None
                    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Round t of :meth:`start`: plan, exchange on the Grid event loop, aggregate (the
        plan stays a local value)."""
        plan, messages = self.plan_round(server_round, arrays, config, grid)
        return self.aggregate_round(plan, loop.exchange(messages, timeout))

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Round t's train messages (module docstring)."""
        plan, messages = self.plan_round(server_round, arrays, config, grid)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Round t's new model and metrics from the replies (module docstring)."""
        plan = self.plans.get(server_round)
        if plan is None:
            raise RuntimeError(f"{type(self).__name__}: aggregate_train(server_round="
                               f"{server_round}) without configure_train for that round")
        return self.aggregate_round(plan, replies)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """Flower's weighted mean of the evaluate metrics over the replies the trust gate
        accepts (:func:`strategies.engine.trust_gate.aggregate_evaluate`)."""
        return trust_gate.aggregate_evaluate(replies, self.participation.clients,
                                             self.custom_metrics[1])

    def round_log(self, server_round: int) -> dict[str, object]:
        """Round ``server_round``'s run-log items (empty before it ran)."""
        report = self.reports.get(server_round)
        return report.log_record() if report is not None else {}

    def packing_cost(self, message: Message, num_examples: int | None) -> float:
        """A task's cost for packed mode's balance (:mod:`strategies.engine.packing`): its
        examples, times its sub-model's compute share when it is sent one."""
        if self.submodels is None:
            return packing.task_cost(message, num_examples)
        return packing.width_task_cost(self.submodels.compute_share)(message, num_examples)

    # ------------------------------------------------------------------ configure
    def plan_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                   grid: Grid) -> tuple[RoundPlan, list[Message]]:
        """Round t's plan and its train messages."""
        config[C.SERVER_ROUND] = server_round
        if self.submodels is not None:
            self.submodels.describe(records.to_numpy(arrays))
        plan = self.participation.plan_round(
            server_round, grid, arrays, self.round_config(server_round, config), self.work,
            draw_by_data_size=self.weighting == "scheme-i")
        self.reports[server_round] = plan.report
        self.plans = {server_round: plan}  # the latest round's plan (Flower's split hooks)
        engine_keys = {node: self.engine_keys(task.node_id, task.config)
                       for node, task in plan.tasks.items()}
        plan.tasks = {n: t.with_config(merged(t.config, engine_keys[n]))
                      for n, t in plan.tasks.items()}
        outgoing = self.algorithm.send(plan)
        for section in outgoing.sections:
            plan.report.add(section)
        plan.tasks = {n: t.with_config(merged(t.config, outgoing.common,
                                              outgoing.per_node.get(n, {})))
                      for n, t in plan.tasks.items()}
        messages = [Message(RecordDict({C.ARRAYS: arrays, C.CONFIG: task.config}),
                            message_type=MessageType.TRAIN, dst_node_id=node)
                    for node, task in plan.tasks.items()]
        if self.submodels is not None:
            plan.sub_models = self.submodels.attach(plan, messages)
        if self.client_states is not None:
            self.client_states.attach(plan, messages, self.participation.client_key)
        for msg in messages:
            for name, record in outgoing.records.items():
                msg.content[name] = record
        lr = plan.config.get(C.LR)
        plan.report.add(ParticipationSection(
            sampled=plan.sampled, stragglers=plan.stragglers,
            dropped=plan.sampled - len(messages),
            bytes_down=sum(records.array_bytes(m.content) for m in messages),
            lr=float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None,
            unavailable=plan.unavailable))
        return plan, messages

    def engine_keys(self, node: int, config: ConfigRecord) -> dict[str, object]:
        """The engine's per-client keys: the client-state round, the sub-model width."""
        keys: dict[str, object] = {}
        if self.submodels is not None:
            keys.update(self.submodels.task_keys(node, config, self.work))
        if self.client_states is not None:
            keys[C.STATE_ROUND] = self.client_states.state_round(
                self.participation.client_key(node))
        return keys

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """The round's config: with ``lr_schedule`` a copy whose ``lr`` is lr_t (the caller's
        record keeps lr_0 for the next rounds), else ``config`` itself."""
        if self.lr_schedule is None:
            return config
        if C.LR not in config:
            raise ValueError(f"lr_schedule needs lr_0: the train config has no '{C.LR}'; pass "
                             f"train_config=ConfigRecord({{'{C.LR}': ...}}) to start()")
        own = ConfigRecord(dict(config))
        own[C.LR] = schedules.round_lr(self.lr_schedule, server_round, float(config[C.LR]))
        return own

    # ------------------------------------------------------------------ aggregate
    def aggregate_round(self, plan: RoundPlan, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's new model and metrics from the replies to ``plan``'s messages; the
        tasks without a reply are the participation model's to remember (they sit out)."""
        replies = list(replies)
        self.participation.record_silent(plan.server_round, plan.tasks,
                                         [r.metadata.src_node_id for r in replies])
        checked = self.checked_replies(plan, self.without_dropped_out(plan, replies))
        global_arrays = records.to_numpy(plan.arrays)
        models = [(k, records.to_numpy(r.content[C.ARRAYS])) for k, r in enumerate(checked)]
        update = RoundUpdate(None, [])
        if checked:
            states = (None if self.client_states is None else
                      self.client_states.copies(checked, self.participation.client_key))
            update = self.algorithm.update(RoundInput(
                plan, global_arrays, checked, models,
                average=lambda server_lr=self.server_lr: self.average(
                    plan, global_arrays, checked, models, server_lr),
                reject=rejecter(checked), states=states, server_lr=self.server_lr,
                weights=None if self.submodels is not None else lambda used: round_coefficients(
                    self.weighting, plan, checked, self.participation).values(used)))
        accepted = [checked[k] for k in update.used]
        self.report_aggregation(plan, accepted, global_arrays,
                                [models[k][1] for k in update.used])
        if self.client_states is not None:
            self.client_states.accept(plan, accepted, update.client_states or [],
                                      self.participation.client_key)
        for section in update.sections:
            plan.report.add(section)
        return self.train_result(plan, update.model if accepted else None, accepted)

    def average(self, plan: RoundPlan, global_arrays: agg.NDArrays, replies: list[Message],
                models: list[tuple[int, agg.NDArrays]], server_lr: float | None = None
                ) -> tuple[agg.NDArrays | None, list[int]]:
        """The engine's weighted average of the replies' models (each sub-model over its
        holders) with the server step: w + eta_g sum_k c_k (w_k - w); with a robust rule
        w + eta_g R(w_k - w) instead (:meth:`robust_average`). eta_g is ``server_lr``
        (None: the engine's; 1.0: the plain average, for an algorithm's own step)."""
        server_lr = self.server_lr if server_lr is None else server_lr
        if self.robust is not None:
            return self.robust_average(plan, global_arrays, replies, models, server_lr)
        if self.submodels is not None:
            weights = ([float(r.content[C.METRICS][C.NUM_EXAMPLES]) for r in replies]
                       if self.weighting == "examples" else None)
            return self.submodels.average(plan, global_arrays, replies, models, weights,
                                          server_lr)
        coefficients = round_coefficients(self.weighting, plan, replies, self.participation)
        new, used, _ = agg.streamed_update(global_arrays, models, coefficients, server_lr,
                                           on_reject=rejecter(replies))
        return new, used

    def robust_average(self, plan: RoundPlan, global_arrays: agg.NDArrays,
                       replies: list[Message], models: list[tuple[int, agg.NDArrays]],
                       server_lr: float | None = None
                       ) -> tuple[agg.NDArrays | None, list[int]]:
        """w + eta_g R(w_k - w) over the replies whose arrays are finite (one log line per
        other), R the robust rule, each sub-model over the entries it holds
        (:func:`strategies.engine.robust.robust_update`); the round's robust section."""
        reject, used, deltas = rejecter(replies), [], []
        for k, model in models:
            bad = agg.all_finite(model)
            if bad is not None:
                reject(k, bad)
                continue
            indices = (None if self.submodels is None else
                       plan.sub_models[replies[k].metadata.src_node_id][0])
            deltas.append(robust_aggregation.ClientDelta(model, global_arrays, indices=indices))
            used.append(k)
        if not used:
            return None, []
        plan.report.add(robust_aggregation.section(self.robust, len(used),
                                                   plan.server_round, type(self).__name__))
        new = robust_aggregation.robust_update(
            global_arrays, deltas, self.robust, self.server_lr if server_lr is None else server_lr)
        return new, used

    def report_aggregation(self, plan: RoundPlan, accepted: list[Message],
                           global_arrays: agg.NDArrays, models: list[agg.NDArrays]) -> None:
        """The round's aggregation and drift sections, its time on the simulated clock, and
        the selection policy's feedback."""
        steps = [r.content[C.METRICS].get(C.LOCAL_STEPS_TAKEN) for r in accepted]
        plan.report.add(Aggregation(
            received=len(accepted), failed=len(plan.tasks) - len(accepted),
            bytes_up=sum(records.array_bytes(r.content) for r in accepted),
            local_steps=([int(s) for s in steps]
                         if steps and all(isinstance(s, (int, float)) for s in steps) else None),
            model_kept=not accepted))
        if self.drift_diagnostics and accepted:
            drift = agg.UpdateDrift(global_arrays)
            for model in models:
                drift.add(model)
            plan.report.add(drift.summary())
        clock_time = self.participation.round_time(plan, accepted, self.work)
        if clock_time is not None:
            plan.report.add(clock_time)
        self.participation.round_feedback(plan, accepted, self.work)

    def train_result(self, plan: RoundPlan, new: agg.NDArrays | None, accepted: list[Message]
                     ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's return value of ``aggregate_train``: the new model when it is finite, and
        the clients' mean metrics with the round's report numbers."""
        if new is None:
            log(WARNING, "Round %d: no usable reply, the global model is kept", plan.server_round)
            return None, None
        aggregation = plan.report.get(Aggregation)
        if not trust_gate.adoptable_model(new, plan.server_round):
            plan.report.add(Aggregation(**{**vars(aggregation), "model_kept": True}))
            return None, None
        metrics = records.mean_metrics(accepted)
        loss = metrics.get(C.TRAIN_LOSS, metrics.get(C.STOCK_TRAIN_LOSS))
        if self.custom_metrics[0] is not None:
            metrics = flower_args.flower_metrics(self.custom_metrics[0],
                                                 [r.content for r in accepted])
        if loss is not None and aggregation is not None:
            plan.report.add(Aggregation(**{**vars(aggregation), "train_loss": loss}))
        return records.to_record(new), MetricRecord({**plan.report.metric_items(), **metrics})

    # ------------------------------------------------------------------ replies
    def checked_replies(self, plan: RoundPlan, replies: Iterable[Message]) -> list[Message]:
        """The replies that pass :meth:`reply_problem`, in partition order; in an
        over-committed round the first m of them on the simulated clock.

        Raises :class:`strategies.engine.records.ClientContractError` when every reply that
        came without a client error lacks what the contract needs and the evidence is
        conclusive (:class:`strategies.engine.records.ContractEvidence`: two clients, or three
        rounds, and no reply ever met it): the ClientApp does not implement it. Otherwise
        such replies are refused one by one.
        """
        ordered = records.replies_in_order(replies, self.participation.clients)
        flower_args.log_received("aggregate_train", ordered)
        answered = [r for r in ordered if not r.has_error()]
        helper = self.algorithm.contract.helper
        gaps = [self.contract_gap(plan, r) for r in answered]
        lacking = [self.participation.client_key(r.metadata.src_node_id)
                   for r, gap in zip(answered, gaps) if gap]
        if answered and helper and self.contract_evidence.conclusive(lacking,
                                                                     met=not all(gaps)):
            raise records.contract_error(type(self).__name__, plan.server_round, len(answered),
                                         gaps[0], helper)
        usable = [r for r in ordered if self.accept_reply(plan, r)]
        if plan.close_after is None:
            return usable
        first, late = self.participation.first_replies(plan, usable, self.work)
        plan.report.add(OverCommitment(late))
        return first

    def without_dropped_out(self, plan: RoundPlan, replies: list[Message]) -> list[Message]:
        """``replies`` less those of the clients that dropped out before replying (the
        clock's ``dropout``, ``plan.dropped_out``): one log line, the round's
        :class:`~strategies.engine.round_report.DropOut` section."""
        if plan.dropped_out is None:
            return replies
        keys = [plan.client_key(n) for n in plan.tasks if n in plan.dropped_out]
        plan.report.add(DropOut.of(plan.server_round, keys))
        return [r for r in replies if r.metadata.src_node_id not in plan.dropped_out]

    def contract_gap(self, plan: RoundPlan, reply: Message) -> str | None:
        """What a reply without a client error lacks of the contract: the sub-model's shapes,
        the algorithm's keys and records, the client-state echo."""
        if self.submodels is not None:
            gap = self.submodels.gap(plan, reply)
            if gap:
                return gap
        return self.algorithm.contract.gap(reply)

    def accept_reply(self, plan: RoundPlan, reply: Message) -> bool:
        """True if the reply can be aggregated; else one log line saying why."""
        problem = self.reply_problem(plan, reply)
        if problem:
            node = reply.metadata.src_node_id
            trust_gate.log_refused("Reply", node, plan.tasks[node].partition_id
                                   if node in plan.tasks else None, problem)
            return False
        return True

    def reply_problem(self, plan: RoundPlan, reply: Message) -> str | None:
        """What is wrong with a reply, or None: the trust gate against what this node was
        sent (the model or its sub-model, the config, the size it reported), the contract,
        the algorithm's check, and the client state it started from."""
        node = reply.metadata.src_node_id
        expected = plan.sent_arrays(node)
        if expected is None:
            return "no sub-model was sent to this node this round"
        problem = trust_gate.train_reply_problem(
            reply, expected, sent=plan.sent(node),
            reported_size=self.participation.info(node).num_examples)
        if problem:
            return problem
        contract = self.algorithm.contract
        if contract.helper and (contract.metrics or contract.arrays or contract.client_state):
            gap = contract.gap(reply)
            if gap:
                return f"needs {gap}: call {contract.helper} in the ClientApp"
        problem = self.algorithm.check(plan, reply)
        if problem or self.client_states is None:
            return problem
        return self.client_states.problem(plan, reply, self.participation.client_key(node))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Cross-round state for a checkpoint (fedapp/checkpoint.py): the participation
        model's (simulated time, selection), the client-state copies, the algorithm's."""
        state = {"engine-state-version": 1, "class": type(self).__name__,
                 **self.participation.state_dict(), "algorithm": self.algorithm.state_dict()}
        if self.client_states is not None:
            state["client-states"] = self.client_states.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (checks it is this class's)."""
        if state.get("class") != type(self).__name__:
            raise ValueError(f"checkpoint holds the state of {state.get('class')!r}, "
                             f"not of {type(self).__name__}")
        if state.get("engine-state-version") != 1:
            raise ValueError(f"engine state version {state.get('engine-state-version')!r} is "
                             f"not 1; start the run afresh")
        self.participation.load_state_dict(state)
        if self.client_states is not None:
            self.client_states.load_state_dict(state["client-states"])
        self.algorithm.load_state_dict(state["algorithm"])


def merged(config: ConfigRecord, *additions) -> ConfigRecord:
    """``config`` itself when nothing is added, else a copy with the additions."""
    extra = {k: v for part in additions for k, v in part.items()}
    if not extra:
        return config
    return ConfigRecord({**config, **extra})


def rejecter(replies: list[Message]) -> Callable[[int, str], None]:
    """``on_reject(k, key)`` for the averaging kernel: one log line per non-finite reply."""
    def reject(k: int, key: str) -> None:
        log(WARNING, "Reply from node %d rejected: array '%s' has NaN or Inf",
            replies[k].metadata.src_node_id, key)
    return reject


def round_coefficients(weighting: str, plan: RoundPlan, replies: list[Message],
                       participation: Participation) -> agg.Coefficients:
    """c_k of ``weighting`` over the checked replies (:class:`RoundEngine`'s ``weighting``)."""
    nodes = [r.metadata.src_node_id for r in replies]
    n = [float(r.content[C.METRICS][C.NUM_EXAMPLES]) for r in replies]
    if weighting == "examples":
        return agg.coefficients_by_examples(n)
    if weighting == "uniform":
        return agg.coefficients_uniform(len(replies))
    if weighting == "scheme-i":
        return agg.coefficients_scheme_i([plan.tasks[node].draws for node in nodes])
    if weighting == "scheme-ii":
        shares = participation.data_shares(plan.nodes)
        index = {node: i for i, node in enumerate(plan.nodes)}
        return agg.coefficients_scheme_ii([shares[index[node]] for node in nodes],
                                          len(plan.nodes))
    clients = participation.clients
    for node, n_k in zip(nodes, n):  # pre-erratum: a reply's n_k is the latest known
        clients.setdefault(node, records.ClientInfo()).num_examples = int(n_k)
    total = agg.total_examples([participation.info(k).num_examples for k in plan.nodes])
    return agg.coefficients_pre_erratum(n, total)


ROBUST_WEIGHTINGS = ("examples", "uniform")  # both mean "no weights" under a robust rule


def robust_for(owner: str, value: robust_aggregation.RobustRule | str | None,
               algorithm: Algorithm, weighting: str) -> robust_aggregation.RobustRule | None:
    """The ``robust`` argument as a rule, refused (ValueError naming the argument, the value
    and the fix) where it cannot replace the round's aggregation: an algorithm whose update
    does more than the engine's average (its own server state or step from every reply,
    which the rule would not protect), or a weighting whose point is its weights."""
    rule = robust_aggregation.as_robust(value)
    if rule is None:
        return None
    if type(algorithm).update is not Algorithm.update and not algorithm.steps_from_average:
        raise ValueError(
            f"{owner}: robust={rule.name!r} replaces the engine's weighted average, but "
            f"{algorithm.name}'s update does more with the replies (its own server state or "
            f"step from every client's reply, which a robust rule would not protect); leave "
            f"robust=None, or use FedAvg, FedProx, FedLC, HeteroFL, FjORD or FedRolex")
    if weighting not in ROBUST_WEIGHTINGS:
        raise ValueError(
            f"{owner}: weighting={weighting!r} with robust={rule.name!r}: the {rule.name} is "
            f"unweighted (Yin et al. 2018), so the weights of {weighting!r} (unbiased only as "
            f"a weighted sum) would be dropped; use weighting='uniform' (or leave the default "
            f"'examples', which the robust rule does not use; run config: weighting), or "
            f"robust=None")
    return rule


def describe(algorithm: Algorithm) -> str:
    """The algorithm's settings for the summary: its public scalar attributes."""
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in vars(algorithm).items()
                     if not k.startswith("_") and isinstance(v, (bool, int, float, str)))

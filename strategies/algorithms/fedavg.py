"""FedAvg (McMahan et al. 2017, Algorithm 1) with the weightings of McMahan et al. and Li et al.

Algorithm 1, as the two hooks of Flower's message-API strategy:

* ``configure_train`` (round t): S_t = the participation model's selection, m = max(floor(C
  K), 1) random clients by default (:mod:`strategies.engine.participation`); send w_t to each k
  in S_t.
* ``aggregate_train``: w_{t+1} = w_t + eta_g sum_{k in S_t} c_k (w_k - w_t), c_k of the
  weighting (:mod:`strategies.engine.averaging`; eta_g = 1 with c_k = n_k / m_t is Algorithm 1).

Who takes part, with how much work and when (sampling, stragglers, the simulated clock,
availability) is the :class:`~strategies.engine.participation.Participation` component's; the
round's :class:`~strategies.engine.round_plan.RoundPlan` goes from ``configure_train`` to
``aggregate_train``, and what the round did is its typed
:class:`~strategies.engine.round_report.RoundReport` (:meth:`FedAvg.round_log`).
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from ..engine import averaging as agg
from .. import contract as C
from ..engine import flower_args, records, schedules, trust_gate
from ..engine.clock import SimClock
from ..engine.participation import (STRAGGLER_POLICIES, STRAGGLER_UNITS, ModelWork, Participation,
                            SelectionPolicy, check_choice, check_fraction, check_whole)
from ..engine.round_plan import ClientTask, RoundPlan
from ..engine.round_report import Aggregation, OverCommitment
from ..engine.round_report import Participation as ParticipationSection
from ..engine.round_report import RoundReport
from ..engine.rounds import RunsRounds

__all__ = ["FedAvg", "WEIGHTINGS", "STRAGGLER_POLICIES", "STRAGGLER_UNITS"]

WEIGHTINGS = ("examples", "uniform", "pre-erratum", "scheme-i", "scheme-ii")
QUERY_WEIGHTINGS = ("pre-erratum", "scheme-i", "scheme-ii")  # need every client's n_k


class FedAvg(RunsRounds, ModelWork, FlowerFedAvg):
    """Federated Averaging (McMahan et al. 2017, Algorithm 1) with heterogeneity options.

    Parameters
    ----------
    fraction_train : float
        C, the fraction of connected clients selected per round; m = max(floor(C K), 1).
    fraction_evaluate : float
        Fraction of clients asked to evaluate the global model (0 disables; Flower's
        default, 1.0).
    min_train_nodes, min_evaluate_nodes, min_available_nodes, weighted_by_key, \
arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's FedAvg arguments, positional in Flower's order, with Flower's meaning
        (:mod:`strategies.engine.flower_args`): m = max(floor(C K), ``min_train_nodes``); the
        record names only Flower's defaults.
    weighting : str
        ``"examples"``: c_k = n_k / m_t over the aggregated clients (Algorithm 1, erratum;
        default). ``"uniform"``: 1 / |S_t|. ``"pre-erratum"``: n_k / n over all clients,
        the unsampled ones keeping w_t. ``"scheme-i"``: K draws with replacement with
        probability p_k = n_k / n, plain mean. ``"scheme-ii"``: K of N uniformly,
        c_k = p_k N / K (both Li et al. 2020). The last three need every client's n_k,
        hence ``query_client_info=True``.
    server_lr : float
        eta_g in w <- w + eta_g sum_k c_k (w_k - w); 1.0 is plain averaging.
    drift_diagnostics : bool
        Log client drift per round: per layer the mean pairwise cosine similarity of the
        client updates (Hsieh et al., IID->non-IID study, Fig. 13) and the spread of their
        norms. Costs one more model-sized buffer and one more pass over each reply.
    lr_schedule : LRSchedule, str or callable, optional
        Per-round learning rate: round t sends ``lr`` = lr_t = ``lr_schedule(t, lr_0)``,
        lr_0 the train config's ``lr`` (:mod:`strategies.engine.schedules`: ``"exponential"`` is
        McMahan et al.'s decay, ``"inverse"`` Li et al.'s eta_t = beta / (t + gamma)). A
        name takes the default parameters; ``"cosine"`` needs
        ``LRSchedule("cosine", num_rounds=T)``. None (default): ``lr`` is sent as given.
    participation : Participation, optional
        Who takes part, with how much work, on which clock
        (:class:`strategies.engine.participation.Participation`). Without it, one is built from
        ``seed``, ``min_available_nodes`` (Flower's default, 2), ``query_client_info``,
        ``query_timeout``, ``straggler_fraction`` / ``straggler_policy`` /
        ``straggler_unit``, ``clock``, ``round_deadline``, ``over_commitment`` and
        ``selection`` (:class:`~strategies.engine.participation.RandomSelection` by default;
        :class:`~strategies.selection.oort.OortSelection`,
        :class:`~strategies.selection.power_of_choice.PowerOfChoice`,
        :class:`~strategies.selection.tifl.TiFLSelection`), which that class documents.

    Notes
    -----
    Difference from Flower's FedAvg: ``min_train_nodes`` and ``min_evaluate_nodes`` default
    to 1, since m = max(floor(C K), 1) is Algorithm 1's rule (Flower's default is 2);
    :meth:`summary` logs it.

    Contract
    --------
    Sends ``config`` with ``server-round`` plus the ``train_config`` given to ``start``
    (with ``lr`` = lr_t under ``lr_schedule``). Expects per reply an ArrayRecord ``arrays``
    with the global model's keys, shapes and dtypes and a MetricRecord ``metrics`` with
    ``num-examples`` > 0 (``train-loss`` or Flower's ``train_loss`` optional): what
    Flower's PyTorch template sends.
    """

    CLIENT_HELPER: str | None = None
    """``strategies.client`` helper a ClientApp calls to honour the contract (subclasses)."""
    def __init__(
        self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0,
        min_train_nodes: int = 1, min_evaluate_nodes: int = 1, min_available_nodes: int = 2,
        weighted_by_key: str = C.NUM_EXAMPLES, arrayrecord_key: str = C.ARRAYS,
        configrecord_key: str = C.CONFIG,
        train_metrics_aggr_fn: flower_args.MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: flower_args.MetricsAggregation | None = None, *,
        weighting: str = "examples", server_lr: float = 1.0, seed: int = 0,
        query_client_info: bool = False,
        query_timeout: float = 600.0, straggler_fraction: float = 0.0,
        straggler_policy: str = "drop", straggler_unit: str = "steps",
        drift_diagnostics: bool = False,
        lr_schedule: schedules.LRSchedule | schedules.Schedule | str | None = None,
        clock: SimClock | None = None, round_deadline: float | None = None,
        over_commitment: float = 0.0, selection: SelectionPolicy | None = None,
        participation: Participation | None = None,
    ) -> None:
        check_fraction("fraction_evaluate", fraction_evaluate, allow_zero=True)
        check_whole("min_evaluate_nodes", min_evaluate_nodes, minimum=0)
        flower_args.check_record_keys(type(self).__name__, weighted_by_key, arrayrecord_key,
                                      configrecord_key)
        check_choice("weighting", weighting, WEIGHTINGS)
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        lr_schedule = schedules.as_schedule(lr_schedule)
        if isinstance(lr_schedule, schedules.LRSchedule) and lr_schedule.name == "cosine" \
                and lr_schedule.num_rounds is None:
            raise ValueError("lr_schedule 'cosine' needs num_rounds: FedAvg does not know the "
                             "run's number of rounds; pass LRSchedule('cosine', num_rounds=T)")
        if participation is None:
            participation = Participation(
                fraction_train=fraction_train, seed=seed, min_available_nodes=min_available_nodes,
                min_train_nodes=min_train_nodes,
                query_client_info=query_client_info, query_timeout=query_timeout,
                straggler_fraction=straggler_fraction, straggler_policy=straggler_policy,
                straggler_unit=straggler_unit, clock=clock, round_deadline=round_deadline,
                over_commitment=over_commitment, selection=selection,
                owner=type(self).__name__)
        if weighting in QUERY_WEIGHTINGS and not participation.query_client_info:
            raise records.query_required(
                type(self).__name__, f"weighting={weighting!r} (every client's n_k)",
                "use weighting='examples' or 'uniform'")
        super().__init__(**flower_args.flower_base_args(
            participation, fraction_evaluate, min_evaluate_nodes, train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn))
        self.custom_metrics = (train_metrics_aggr_fn, evaluate_metrics_aggr_fn)  # None: ours
        self.participation = participation
        self.weighting = weighting
        self.server_lr = float(server_lr)
        self.drift_diagnostics = bool(drift_diagnostics)
        self.lr_schedule = lr_schedule
        self.round_plan: RoundPlan | None = None  # configure_train -> aggregate_train
        self.reports: dict[int, RoundReport] = {}

    def summary(self) -> None:
        """Log the configuration, including where the defaults differ from Flower's."""
        p = self.participation
        log(INFO, "\t├──> Weighting: %s | server lr: %s | seed: %s | client-info query: %s",
            self.weighting, self.server_lr, p.seed, "on" if p.query_client_info else "off")
        if p.min_train_nodes == 1:
            log(INFO, "\t├──> Differs from Flower's FedAvg: m = max(floor(C K), 1) clients "
                "per round (min_train_nodes 1, Flower's default 2)")
        if self.lr_schedule is not None:
            log(INFO, "\t├──> Learning rate per round: %s", self.lr_schedule)
        for line in p.summary_lines():
            log(INFO, "\t├──> %s", line)
        super().summary()

    # ------------------------------------------------------------------ train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Algorithm 1, server side of round t: select S_t and send w_t to each k in S_t."""
        config[C.SERVER_ROUND] = server_round
        plan = self.participation.plan_round(
            server_round, grid, arrays, self.round_config(server_round, config), self,
            draw_by_data_size=self.weighting == "scheme-i")
        plan.tasks = {n: t.with_config(self.task_config(plan, t)) for n, t in plan.tasks.items()}
        messages = [Message(RecordDict({C.ARRAYS: arrays, C.CONFIG: task.config}),
                            message_type=MessageType.TRAIN, dst_node_id=node)
                    for node, task in plan.tasks.items()]
        self.round_plan, self.reports[server_round] = plan, plan.report
        messages = self.prepared_messages(plan, messages)
        lr = plan.config.get(C.LR)
        plan.report.add(ParticipationSection(
            sampled=plan.sampled, stragglers=plan.stragglers,
            dropped=plan.sampled - len(messages),
            bytes_down=sum(records.array_bytes(m.content) for m in messages),
            lr=float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None,
            unavailable=plan.unavailable))
        return messages

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

    def task_config(self, plan: RoundPlan, task: ClientTask) -> ConfigRecord:
        """The ConfigRecord sent to one client: the plan's (FedAvg adds nothing)."""
        return task.config

    def prepared_messages(self, plan: RoundPlan, messages: list[Message]) -> list[Message]:
        """The round's train messages as they are pushed (subclasses attach records)."""
        return messages

    # ------------------------------------------------------------------ aggregate
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Algorithm 1, w_{t+1} = w_t + eta_g sum_k c_k (w_k - w_t) over the usable replies."""
        return self.aggregate_round(self.plan_of(server_round), replies)

    def plan_of(self, server_round: int) -> RoundPlan:
        """The plan ``configure_train`` made for ``server_round``."""
        plan = self.round_plan
        if plan is None or plan.server_round != server_round:
            raise RuntimeError(f"{type(self).__name__}: aggregate_train(server_round="
                               f"{server_round}) without configure_train for that round")
        return plan

    def aggregate_round(self, plan: RoundPlan, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's new model and metrics from the replies to ``plan``'s messages."""
        new, accepted = self.aggregate_checked(plan, self.checked_replies(plan, replies))
        return self.train_result(plan, new, accepted)

    def aggregate_checked(self, plan: RoundPlan, checked: list[Message]
                          ) -> tuple[agg.NDArrays | None, list[Message]]:
        """The update over replies that passed :meth:`checked_replies`, minus those with NaN
        / Inf in their arrays (one log line each); the round's aggregation report.

        The client models are read in place from the replies (views, no copies) into one
        accumulator (:func:`strategies.engine.averaging.streamed_update`).
        """
        global_arrays = records.to_numpy(plan.arrays)
        models = [(k, records.to_numpy(r.content[C.ARRAYS])) for k, r in enumerate(checked)]
        new, used = (None, [])
        if checked:
            new, used = self.update_model(plan, global_arrays, checked, models)
        accepted = [checked[k] for k in used]
        steps = [r.content[C.METRICS].get(C.LOCAL_STEPS_TAKEN) for r in accepted]
        plan.report.add(Aggregation(
            received=len(accepted), failed=len(plan.tasks) - len(accepted),
            bytes_up=sum(records.array_bytes(r.content) for r in accepted),
            local_steps=([int(s) for s in steps]
                         if steps and all(isinstance(s, (int, float)) for s in steps) else None),
            model_kept=not accepted))
        if self.drift_diagnostics and accepted:
            drift = agg.UpdateDrift(global_arrays)
            for k in used:
                drift.add(models[k][1])
            plan.report.add(drift.summary())
        clock_time = self.participation.round_time(plan, accepted, self)
        if clock_time is not None:
            plan.report.add(clock_time)
        self.participation.round_feedback(plan, accepted, self)  # the selection policy learns
        return (new if accepted else None), accepted

    def update_model(
        self, plan: RoundPlan, global_arrays: agg.NDArrays, replies: list[Message],
        models: list[tuple[int, agg.NDArrays]],
    ) -> tuple[agg.NDArrays | None, list[int]]:
        """The weighting's coefficients over ``replies`` and the streamed update of
        :func:`strategies.engine.averaging.streamed_update`; the new model and the indices used."""
        new, used, _ = agg.streamed_update(global_arrays, models,
                                           self.coefficients(plan, replies), self.server_lr,
                                           on_reject=self.rejecter(replies))
        return new, used

    @staticmethod
    def rejecter(replies: list[Message]):
        """``on_reject(k, key)`` for the streamed updates: one log line per non-finite reply."""
        def reject(k: int, key: str) -> None:
            log(WARNING, "Reply from node %d rejected: array '%s' has NaN or Inf",
                replies[k].metadata.src_node_id, key)
        return reject

    def coefficients(self, plan: RoundPlan, replies: list[Message]) -> agg.Coefficients:
        """c_k of the configured weighting over the checked replies."""
        nodes = [r.metadata.src_node_id for r in replies]
        n = [float(r.content[C.METRICS][C.NUM_EXAMPLES]) for r in replies]
        if self.weighting == "examples":
            return agg.coefficients_by_examples(n)
        if self.weighting == "uniform":
            return agg.coefficients_uniform(len(replies))
        if self.weighting == "scheme-i":
            return agg.coefficients_scheme_i([plan.tasks[node].draws for node in nodes])
        clients = self.participation.clients
        if self.weighting == "scheme-ii":
            shares = self.participation.data_shares(plan.nodes)
            index = {node: i for i, node in enumerate(plan.nodes)}
            return agg.coefficients_scheme_ii([shares[index[node]] for node in nodes],
                                              len(plan.nodes))
        for node, n_k in zip(nodes, n):  # pre-erratum: a reply's n_k is the latest known
            clients.setdefault(node, records.ClientInfo()).num_examples = int(n_k)
        total = agg.total_examples([self.participation.info(k).num_examples for k in plan.nodes])
        return agg.coefficients_pre_erratum(n, total)

    def train_result(self, plan: RoundPlan, new: agg.NDArrays | None, accepted: list[Message]
                     ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's return value of ``aggregate_train``: the new model and the clients' mean
        metrics with the round's report numbers."""
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

    def round_log(self, server_round: int) -> dict[str, object]:
        """Round ``server_round``'s run-log items (empty before it ran)."""
        report = self.reports.get(server_round)
        return report.log_record() if report is not None else {}

    # ------------------------------------------------------------------ replies
    def checked_replies(self, plan: RoundPlan, replies: Iterable[Message]) -> list[Message]:
        """The replies that pass :meth:`reply_problem`, in partition order; in an
        over-committed round the first m of them on the simulated clock
        (:meth:`strategies.engine.participation.Participation.first_replies`).

        Raises :class:`strategies.engine.records.ClientContractError` when every reply that came
        without a client error lacks what this strategy's contract needs
        (:meth:`contract_gap`): the ClientApp does not implement it.
        """
        ordered = records.replies_in_order(replies, self.participation.clients)
        flower_args.log_received("aggregate_train", ordered)
        answered = [r for r in ordered if not r.has_error()]
        gaps = [self.contract_gap(r) for r in answered]
        if answered and all(gaps) and self.CLIENT_HELPER:
            raise records.contract_error(type(self).__name__, plan.server_round, len(answered),
                                         gaps[0], self.CLIENT_HELPER)
        usable = [r for r in ordered if self.accept_reply(plan, r)]
        if plan.close_after is None:
            return usable
        first, late = self.participation.first_replies(plan, usable, self)
        plan.report.add(OverCommitment(late))
        return first

    def contract_gap(self, reply: Message) -> str | None:
        """What a reply without a client error lacks of this strategy's own contract, or
        None. FedAvg's contract is Flower's template: nothing beyond :meth:`reply_problem`."""
        return None

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
        """What is wrong with a reply, or None: the trust gate
        (:func:`strategies.engine.trust_gate.train_reply_problem`) against the model and config this
        node was sent and the size it reported."""
        node = reply.metadata.src_node_id
        return trust_gate.train_reply_problem(
            reply, plan.arrays, sent=plan.sent(node),
            reported_size=self.participation.info(node).num_examples)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """Flower's weighted mean of the evaluate metrics over the replies the trust gate
        accepts (:func:`strategies.engine.trust_gate.aggregate_evaluate`)."""
        return trust_gate.aggregate_evaluate(replies, self.participation.clients,
                                             self.custom_metrics[1])

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Cross-round state for a checkpoint (fedapp/checkpoint.py): the participation
        model's (the simulated time); subclasses add their own."""
        return {"fedavg-state-version": 1, "class": type(self).__name__,
                **self.participation.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (checks it is this class's)."""
        if state.get("class") != type(self).__name__:
            raise ValueError(f"checkpoint holds the state of {state.get('class')!r}, "
                             f"not of {type(self).__name__}")
        self.participation.load_state_dict(state)

"""The asynchronous engine: rounds of server model updates made from client updates that
arrive asynchronously, with its own round (:meth:`AsyncEngine.train_round`) in the one loop
of :meth:`AsyncEngine.start` (:func:`strategies.engine.rounds.run_rounds`).

A round here is one server update: the engine keeps the clients training (up to
``concurrency`` at once, a freed client gets the newest model:
:class:`~strategies.engine.async_tasks.AsyncTasks`), applies their replies in the arrival
order (:meth:`AsyncAlgorithm.apply`) until the algorithm's update can be made, then makes
it (:meth:`AsyncAlgorithm.step`). Tasks still training at the end of a round go on into the
next one. Evaluation is Flower's FedAvg's, on the replies the trust gate accepts.

Each reply passes the trust gate against the model version its task was sent
(:func:`strategies.engine.trust_gate.train_reply_problem`) and must be finite; a refused reply
frees its client and counts as failed. With the clock's ``dropout``, a task whose client
drops out mid-task (:mod:`strategies.engine.async_tasks`) counts as failed at its drop time
and its client is logged in the round's ``dropped-out``, as in a synchronous round. It
shares the participation model, the Grid event loop, the trust gate and the round report
with the synchronous engine.

Given a robust rule (:mod:`strategies.engine.robust`), a buffered algorithm's updates are held
by a :class:`~strategies.engine.robust.RobustBuffer` instead: at the step the algorithm gets
K updates that are each the rule's statistic of the K held ones, so its own step makes
x + eta_g R (FedBuff). An algorithm that applies each update as it comes (FedAsync: one value
per coordinate per step) is refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import ClassVar

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import Result

from .. import contract as C
from ..selection.policy import SelectionSection
from . import flower_args, records, rounds, trust_gate
from . import robust as robust_aggregation
from .algorithm import Contract, NDArrays
from .async_tasks import ARRIVAL_ORDERS, AsyncTask, AsyncTasks
from .clock import SimClock
from .event_loop import GridEventLoop
from .keys import Key, at_least
from .participation import Participation, SelectionPolicy, check_fraction, check_whole
from .round_report import (Aggregation, AsyncUpdate, ClockTime, DropOut, ParticipationSection,
                           RoundReport)
from .work import LocalWork

__all__ = ["ASYNC_KEYS", "Applied", "AsyncAlgorithm", "AsyncEngine", "ClientUpdate", "ServerStep"]

STATE_VERSION = 2
MAX_FAILURES_PER_TASK = 5  # failed tasks per concurrency slot before a round gives up

ASYNC_KEYS = (
    Key("async-concurrency", 20,
        "clients training at once in `fedbuff` / `fedasync` (FedBuff's concurrency); a freed "
        "client's slot goes at once to an idle online client with the newest model",
        interval=at_least(1), arg="concurrency"),
    Key("async-arrival", "simulated",
        "order in which `fedbuff` / `fedasync` apply replies: `simulated` (by simulated "
        "completion time on the device profiles, first sent first applied without them: "
        "deterministic, the same in simulation and deployment, resumable bit for bit) or "
        "`real-time` (as they arrive; not reproducible)", choices=ARRIVAL_ORDERS, arg="arrival"),
)
"""The asynchronous engine's run-config keys (its asynchronous algorithms register them)."""


@dataclass(frozen=True)
class ClientUpdate:
    """One checked client update: the client's model ``client``, trained from ``sent`` (the
    model version its task was sent), ``staleness`` versions ago, and the server's model
    ``model`` now."""

    task: AsyncTask
    sent: NDArrays
    client: NDArrays
    staleness: int
    model: NDArrays


@dataclass(frozen=True)
class Applied:
    """What applying a client update did: the server's new model (a new version; None: none
    yet) and whether the round's server update can now be made."""

    model: NDArrays | None
    ready: bool


@dataclass(frozen=True)
class ServerStep:
    """The round's server update: the model to adopt (None: kept), whether it is a new
    model version, and how many client updates it holds."""

    model: NDArrays | None
    new_version: bool
    fill: int | None = None


class AsyncAlgorithm:
    """An asynchronous algorithm, in at most five methods (FedBuff, FedAsync)."""

    name: ClassVar[str] = "FedBuff"
    contract: ClassVar[Contract] = Contract()

    def send(self) -> Mapping[str, object]:
        """Config keys every task carries beside the train config."""
        return {}

    def apply(self, update: ClientUpdate) -> Applied:
        """Take one checked client update."""
        raise NotImplementedError

    def step(self, model: NDArrays, complete: bool) -> ServerStep:
        """The round's server update from ``model``; ``complete`` is False for a round that
        ended before :meth:`apply` said ready (too many failures)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Cross-round state for a checkpoint (copied)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""


@dataclass
class RoundUpdates:
    """The client updates of one round, as they are applied."""

    staleness: list[int] = field(default_factory=list)
    metrics: list[MetricRecord] = field(default_factory=list)  # of the accepted replies
    failed: int = 0  # refused, lost and dropped-out tasks
    dropped_out: list[str] = field(default_factory=list)  # their clients' keys
    bytes_up: int = 0
    ready: bool = False


class AsyncEngine(FlowerFedAvg):
    """A Flower strategy running an :class:`AsyncAlgorithm` (module docstring).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key, \
train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's FedAvg arguments, positional in Flower's order
        (:mod:`strategies.engine.flower_args`); ``fraction_train`` stays 1.0 and
        ``min_train_nodes`` 1 (``concurrency`` replaces round sampling).
    algorithm : AsyncAlgorithm
        FedBuff's or FedAsync's.
    concurrency : int
        Most clients training at once.
    arrival : {"simulated", "real-time"}
        Apply replies in simulated completion order (deterministic, resumable bit for bit;
        :mod:`strategies.engine.async_tasks`) or as they arrive.
    seed, query_client_info, query_timeout, clock, selection
        As :class:`strategies.engine.participation.Participation`'s; ``clock`` times each
        task on the device profiles (it needs ``query_client_info``); ``selection`` picks the
        client of each freed slot (the task number as its round).
    participation : Participation, optional
        Given instead of the arguments above (no deadline, no stragglers: an asynchronous
        engine waits for no round).
    robust : RobustRule or str, optional
        ``Median()`` or ``TrimmedMean(beta)`` (Yin et al. 2018, Definitions 1 and 2) of a
        buffered algorithm's K staleness-weighted updates s(tau_k) Delta_k in place of their
        mean (module docstring); needs K = ``buffer_size`` >= 3, and floor(beta K) >= 1 for
        the trimmed mean. Not for FedAsync.
    """

    def __init__(self, fraction_train: float = 1.0,
                 fraction_evaluate: float = 1.0, min_train_nodes: int = 1,
                 min_evaluate_nodes: int = 1, min_available_nodes: int = 2,
                 weighted_by_key: str = C.NUM_EXAMPLES, arrayrecord_key: str = C.ARRAYS,
                 configrecord_key: str = C.CONFIG,
                 train_metrics_aggr_fn: flower_args.MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: flower_args.MetricsAggregation | None = None, *,
                 algorithm: AsyncAlgorithm, concurrency: int = 20, arrival: str = "simulated",
                 seed: int = 0,
                 query_client_info: bool = False, query_timeout: float = 600.0,
                 clock: SimClock | None = None, selection: SelectionPolicy | None = None,
                 participation: Participation | None = None,
                 robust: robust_aggregation.RobustRule | str | None = None) -> None:
        check_fraction("fraction_evaluate", fraction_evaluate, allow_zero=True)
        check_whole("min_evaluate_nodes", min_evaluate_nodes, minimum=0)
        name = type(self).__name__
        flower_args.check_record_keys(name, weighted_by_key, arrayrecord_key, configrecord_key)
        if fraction_train != 1.0 or min_train_nodes != 1:
            raise ValueError(f"{name} samples no round: it keeps `concurrency` clients "
                             f"training (here {concurrency}); leave fraction_train=1.0 and "
                             f"min_train_nodes=1 (got {fraction_train!r}, {min_train_nodes!r}) "
                             f"and set concurrency instead")
        if participation is None:
            participation = Participation(
                seed=seed, min_available_nodes=min_available_nodes,
                query_client_info=query_client_info, query_timeout=query_timeout,
                clock=clock, selection=selection, owner=name)
        timer = participation.timer
        if (timer is not None and timer.deadline is not None) or \
                participation.straggler_fraction > 0:
            raise ValueError(f"{name} waits for no round: give it a Participation without "
                             f"round_deadline and straggler_fraction (slow clients are simply "
                             f"stale)")
        super().__init__(**flower_args.flower_base_args(
            participation, fraction_evaluate, min_evaluate_nodes, train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn))
        self.custom_metrics = (train_metrics_aggr_fn, evaluate_metrics_aggr_fn)  # None: ours
        self.algorithm = algorithm
        self.robust_buffer = robust_buffer_for(name, robust, algorithm)
        self.warned_work = False  # the work-per-update warning, once per run
        self.participation = participation
        self.work = LocalWork(participation, algorithm.contract, owner=name)
        self.tasks = AsyncTasks(participation, concurrency, arrival, owner=name)
        self.version = 0  # server model versions made so far
        self.client_updates = 0  # client updates applied so far
        self.reports: dict[int, RoundReport] = {}

    # ------------------------------------------------------------------ Flower's hooks
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              first_round: int = 1) -> Result:
        """The asynchronous rounds (:meth:`train_round`) in the round loop of
        :func:`strategies.engine.rounds.run_rounds`; ``first_round`` > 1 resumes."""
        return rounds.run_rounds(self, grid, initial_arrays, num_rounds, timeout, train_config,
                                 evaluate_config, evaluate_fn, first_round)

    def summary(self) -> None:
        """Log the configuration."""
        tasks = self.tasks
        log(INFO, "\t├──> Asynchronous: concurrency %d, arrival order '%s', seed %s",
            tasks.concurrency, tasks.arrival, self.participation.seed)
        settings = ", ".join(f"{k.replace('_', ' ')} {v}"
                             for k, v in vars(self.algorithm).items()
                             if not k.startswith("_") and isinstance(v, (bool, int, float, str)))
        lines = [f"{self.algorithm.name}: {settings}", *self.participation.summary_lines()]
        differ = flower_args.differences_from_flower(self.participation.min_train_nodes,
                                                     self.min_evaluate_nodes)
        lines += [differ] if differ else []
        if self.robust_buffer is not None:
            lines.append(f"Robust aggregation: {self.robust_buffer.rule} of the buffer's "
                         f"staleness-weighted updates (unweighted: num-examples not used)")
        for line in lines:
            log(INFO, "\t├──> %s", line)
        super().summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Not a round of Flower's loop: an asynchronous engine runs its own rounds."""
        raise RuntimeError(f"{type(self).__name__} makes its server updates from client updates "
                           f"as they arrive, not in Flower's configure_train / aggregate_train "
                           f"rounds: run it with its own start(grid, initial_arrays, ...)")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Not a round of Flower's loop (:meth:`configure_train`)."""
        return self.configure_train(server_round, ArrayRecord(), ConfigRecord(), None)

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

    # ------------------------------------------------------------------ a round
    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, loop: GridEventLoop, timeout: float | None
                    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """One server update (module docstring): the new model (None: kept) and metrics."""
        config[C.SERVER_ROUND] = server_round
        for key, value in self.algorithm.send().items():
            config[key] = value
        if not self.warned_work:  # once: how much work a "round" is here
            self.warned_work = True
            warning = flower_args.work_per_update_warning(
                type(self).__name__, self.updates_per_step(), self.tasks.concurrency,
                len(self.participation.connected(grid)))
            if warning:
                log(WARNING, "%s", warning)
        current = {"model": arrays}
        updates = RoundUpdates()
        report = self.reports[server_round] = RoundReport(server_round)
        sent, down, start = self.tasks.sent, self.tasks.bytes_down, self.tasks.now
        self.tasks.selections = []

        def on_reply(task: AsyncTask, reply: Message) -> None:
            self.on_reply(task, reply, current, updates)

        def on_lost(task: AsyncTask) -> None:
            updates.failed += 1

        def on_dropped(task: AsyncTask) -> None:
            updates.failed += 1
            updates.dropped_out.append(records.client_key(self.participation.clients,
                                                          task.node_id))

        self.tasks.run(grid, lambda: (self.version, current["model"]), config, self.work,
                       on_reply, on_lost, on_dropped, lambda: self.round_over(updates),
                       timeout)
        held = self.release_robust(records.to_numpy(current["model"]), updates.ready, report)
        step = self.algorithm.step(records.to_numpy(current["model"]), updates.ready)
        fill = held if held is not None else (
            step.fill if step.fill is not None else len(updates.staleness))
        new = None if step.model is None else records.to_record(step.model)
        if step.new_version and new is not None:
            self.version += 1
        if new is not None and not trust_gate.adoptable_model(records.to_numpy(new),
                                                              server_round):
            new = None
        lr = config.get(C.LR)
        report.add(ParticipationSection(
            sampled=self.tasks.sent - sent, bytes_down=self.tasks.bytes_down - down,
            lr=float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None))
        flower_args.log_counts("aggregate_train", len(updates.metrics), updates.failed)
        metrics = records.mean_of_metrics(updates.metrics) if updates.metrics else {}
        loss = metrics.get(C.TRAIN_LOSS, metrics.get(C.STOCK_TRAIN_LOSS))
        if self.custom_metrics[0] is not None and updates.metrics:
            metrics = flower_args.flower_metrics(
                self.custom_metrics[0], [RecordDict({C.METRICS: m}) for m in updates.metrics])
        report.add(Aggregation(received=len(updates.metrics), failed=updates.failed,
                               bytes_up=updates.bytes_up, train_loss=loss,
                               model_kept=new is None))
        report.add(AsyncUpdate(staleness=list(updates.staleness),
                               concurrency=len(self.tasks.in_flight), buffer_fill=fill,
                               client_updates=self.client_updates, model_version=self.version))
        if self.tasks.selections:
            report.add(merged_selections(self.tasks.selections))
        timer = self.participation.timer
        if timer is not None and timer.clock.dropout > 0:
            report.add(DropOut.of(server_round, updates.dropped_out))
        if timer is not None:
            timer.elapsed = self.tasks.now
            report.add(ClockTime(self.tasks.now - start, self.tasks.now))
        log(INFO, "%s: round %d, server update %d from %d client update(s) (staleness %s), "
            "%d training", type(self).__name__, server_round, self.version,
            len(updates.staleness), updates.staleness, len(self.tasks.in_flight))
        if new is None:
            log(WARNING, "Round %d: no server update, the global model is kept", server_round)
            return None, None
        return new, MetricRecord({**report.metric_items(), **metrics})

    def release_robust(self, model: NDArrays, ready: bool, report: RoundReport) -> int | None:
        """With a robust rule: at a full buffer, hand the algorithm the rule's statistic of
        the held updates (K times, at staleness 0; its ``apply`` reads the models and the
        staleness only) and report it; the updates held (None without a rule)."""
        buffer = self.robust_buffer
        if buffer is None:
            return None
        held = len(buffer.held)
        if ready:
            report.add(robust_aggregation.section(buffer.rule, held, report.server_round,
                                                  type(self).__name__))
            for sent, client in buffer.release(model):
                self.algorithm.apply(ClientUpdate(None, sent, client, 0, model))
        return held

    def updates_per_step(self) -> int:
        """Client updates per server update: FedBuff's K, FedAsync's updates per round."""
        return int(getattr(self.algorithm, "buffer_size", None)
                   or getattr(self.algorithm, "updates_per_round", 1))

    def round_over(self, updates: RoundUpdates) -> bool:
        """The server update is ready, or ``MAX_FAILURES_PER_TASK`` x ``concurrency`` tasks
        failed this round (the model is then kept)."""
        if updates.ready:
            return True
        if updates.failed >= MAX_FAILURES_PER_TASK * self.tasks.concurrency:
            log(WARNING, "%s: %d client tasks failed this round without a server update; the "
                "round ends with the model kept", type(self).__name__, updates.failed)
            return True
        return False

    def on_reply(self, task: AsyncTask, reply: Message, current: dict,
                 updates: RoundUpdates) -> None:
        """Check a reply against the model version its task was sent, then apply it."""
        node = reply.metadata.src_node_id
        sent = self.tasks.versions[task.version]
        problem = trust_gate.train_reply_problem(
            reply, sent, sent=task.config,
            reported_size=self.participation.info(node).num_examples)
        client = None
        if problem is None:
            client = records.to_numpy(reply.content[C.ARRAYS])
            bad = trust_gate.non_finite_key(client)
            problem = f"array '{bad}' has NaN or Inf" if bad else None
        if problem is not None:
            trust_gate.log_refused("Reply", node, task.partition_id, problem)
            updates.failed += 1
            return
        staleness = self.version - task.version
        if self.robust_buffer is not None:
            applied = Applied(None, self.robust_buffer.hold(records.to_numpy(sent), client,
                                                            staleness))
        else:
            applied = self.algorithm.apply(ClientUpdate(
                task, records.to_numpy(sent), client, staleness,
                records.to_numpy(current["model"])))
        if applied.model is not None:
            current["model"] = records.to_record(applied.model)
            self.version += 1
        updates.ready = applied.ready
        self.client_updates += 1
        updates.staleness.append(staleness)
        updates.metrics.append(reply.content[C.METRICS])
        updates.bytes_up += records.array_bytes(reply.content)
        timed = self.participation.timer is not None
        self.participation.feedback(task.number + 1, [
            (node, reply, task.done_at - task.sent_at if timed else None)])

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The model version and update counters, the tasks in flight with the versions
        they were sent (:meth:`strategies.engine.async_tasks.AsyncTasks.state_dict`), the
        simulated time and the algorithm's own state."""
        state = {"async-engine-version": STATE_VERSION, "class": type(self).__name__,
                 "version": self.version, "client-updates": self.client_updates,
                 "tasks": self.tasks.state_dict(), "algorithm": self.algorithm.state_dict(),
                 **self.participation.state_dict()}
        if self.robust_buffer is not None:
            state["robust-buffer"] = self.robust_buffer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (checks it is this class's)."""
        if state.get("class") != type(self).__name__:
            raise ValueError(f"checkpoint holds the state of {state.get('class')!r}, "
                             f"not of {type(self).__name__}")
        if state.get("async-engine-version") != STATE_VERSION:
            raise ValueError(f"asynchronous engine state version "
                             f"{state.get('async-engine-version')!r} is not {STATE_VERSION}; "
                             f"start the run afresh")
        self.version = int(state["version"])
        self.client_updates = int(state["client-updates"])
        self.tasks.load_state_dict(state["tasks"])
        self.algorithm.load_state_dict(state["algorithm"])
        self.participation.load_state_dict(state)
        if self.robust_buffer is not None:
            self.robust_buffer.load_state_dict(state.get("robust-buffer", {}))


def robust_buffer_for(owner: str, value: robust_aggregation.RobustRule | str | None,
                      algorithm: AsyncAlgorithm) -> robust_aggregation.RobustBuffer | None:
    """The ``robust`` argument as a buffer of K updates, refused (ValueError naming the
    argument, the value and the fix) without a buffer of at least 3 updates per step, or
    for a trimmed mean that trims none of them."""
    rule = robust_aggregation.as_robust(value)
    if rule is None:
        return None
    size = getattr(algorithm, "buffer_size", None)
    if size is None:
        raise ValueError(
            f"{owner}: robust={rule.name!r} needs a buffer of K client updates per server step "
            f"to take the {rule.name} of; {algorithm.name} applies each client update as it "
            f"arrives (one value per coordinate, whose {rule.name} is itself); leave "
            f"robust=None, or use FedBuff(buffer_size=K, robust=...) with K >= "
            f"{robust_aggregation.MIN_VALUES}")
    if size < robust_aggregation.MIN_VALUES:
        raise ValueError(
            f"{owner}: robust={rule.name!r} with buffer_size={size}: fewer than "
            f"{robust_aggregation.MIN_VALUES} updates per step outvote no one (the median of "
            f"two is their mean); use buffer_size >= {robust_aggregation.MIN_VALUES}")
    if rule.trimmed(size) == 0:
        larger = f" or buffer_size >= {math.ceil(1 / rule.beta)}" if rule.beta > 0 else ""
        raise ValueError(
            f"{owner}: robust={rule.name!r} with beta={rule.beta!r} and buffer_size={size} "
            f"trims floor(beta K) = 0 updates at each end, i.e. is the plain mean; use "
            f"TrimmedMean(beta >= {1 / size:.3g}){larger} (run config: robust-trim, "
            f"fedbuff-buffer-size)")
    return robust_aggregation.RobustBuffer(rule, size, algorithm.staleness)


def merged_selections(sections: list[SelectionSection]) -> SelectionSection:
    """One section for the tasks a round sent: the clients chosen in order, the candidates
    and query counts summed, the last task's policy state (epsilon, T, tier credits)."""
    last = sections[-1]
    queries = [s.query_messages for s in sections if s.query_messages is not None]
    return dataclasses.replace(
        last, candidates=sum(s.candidates for s in sections),
        chosen=[key for s in sections for key in s.chosen],
        scores={k: v for s in sections for k, v in (s.scores or {}).items()} or None,
        losses={k: v for s in sections for k, v in (s.losses or {}).items()} or None,
        explored=sum(s.explored for s in sections) if last.explored is not None else None,
        query_messages=sum(queries) if queries else None,
        query_bytes=sum(s.query_bytes or 0 for s in sections) if queries else None,
        query_seconds=(sum(s.query_seconds or 0.0 for s in sections)
                       if any(s.query_seconds is not None for s in sections) else None))

"""What FedBuff and FedAsync share: rounds of Flower's loop as server model updates, made from
client updates that arrive asynchronously (:class:`~strategies.engine.async_tasks.AsyncTasks`).

A round here is one server update: ``configure_train`` keeps the clients training (up to
``concurrency`` at once, a freed client gets the newest model), applies their replies in
the arrival order until the algorithm's update is made (:meth:`AsyncStrategy.apply` and
:meth:`AsyncStrategy.update_ready`, then :meth:`AsyncStrategy.server_update`), and sends no
message for the loop; ``aggregate_train`` returns the new model. Tasks still training at the
end of a round go on into the next one, so the strategy runs under Flower's own
``Strategy.start`` as under :func:`strategies.engine.rounds.run_rounds`. Evaluation is Flower's
FedAvg's, on the replies the trust gate accepts.

Each reply passes the trust gate against the model version its task was sent
(:func:`strategies.engine.trust_gate.train_reply_problem`) and must be finite; a refused reply
frees its client and counts as failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from .. import contract as C
from . import flower_args, records, trust_gate
from .averaging import NDArrays
from .async_tasks import AsyncTask, AsyncTasks
from .clock import SimClock
from .participation import (ModelWork, Participation, SelectionPolicy, check_fraction,
                            check_whole)
from ..selection.policy import SelectionSection
from .round_report import Aggregation, AsyncUpdate, ClockTime
from .round_report import Participation as ParticipationSection
from .round_report import RoundReport
from .rounds import RunsRounds

__all__ = ["AsyncStrategy"]

STATE_VERSION = 1
MAX_FAILURES_PER_TASK = 5  # failed tasks per concurrency slot before a round gives up


@dataclass
class RoundUpdates:
    """The client updates of one round, as they are applied."""

    staleness: list[int] = field(default_factory=list)
    metrics: list[MetricRecord] = field(default_factory=list)  # of the accepted replies
    failed: int = 0
    bytes_up: int = 0


class AsyncStrategy(RunsRounds, ModelWork, FlowerFedAvg):
    """Base of the asynchronous strategies (module docstring).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key, \
train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's FedAvg arguments, positional in Flower's order
        (:mod:`strategies.engine.flower_args`); ``fraction_train`` stays 1.0 and
        ``min_train_nodes`` 1 (``concurrency`` replaces round sampling).
    concurrency : int
        Most clients training at once.
    arrival : {"simulated", "real-time"}
        Apply replies in simulated completion order (deterministic, resumable bit for bit;
        :mod:`strategies.engine.async_tasks`) or as they arrive.
    seed, query_client_info, query_timeout, clock, selection
        As :class:`strategies.engine.participation.Participation`'s; ``clock`` times each task
        on the device profiles (it needs ``query_client_info``); ``selection`` picks the
        client of each freed slot (the task number as its round).
    participation : Participation, optional
        Given instead of the arguments above (no deadline, no stragglers: an asynchronous
        strategy waits for no round).
    """

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0,
                 min_train_nodes: int = 1, min_evaluate_nodes: int = 1,
                 min_available_nodes: int = 2, weighted_by_key: str = C.NUM_EXAMPLES,
                 arrayrecord_key: str = C.ARRAYS, configrecord_key: str = C.CONFIG,
                 train_metrics_aggr_fn: flower_args.MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: flower_args.MetricsAggregation | None = None, *,
                 concurrency: int = 20, arrival: str = "simulated", seed: int = 0,
                 query_client_info: bool = False, query_timeout: float = 600.0,
                 clock: SimClock | None = None, selection: SelectionPolicy | None = None,
                 participation: Participation | None = None) -> None:
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
        self.participation = participation
        self.tasks = AsyncTasks(participation, concurrency, arrival, owner=name)
        self.version = 0  # server model versions made so far
        self.client_updates = 0  # client updates applied so far
        self.model: ArrayRecord | None = None
        self.timeout: float | None = None
        self.reports: dict[int, RoundReport] = {}
        self.outcome: tuple[int, ArrayRecord | None, MetricRecord | None] | None = None
        self.updates = RoundUpdates()

    # ------------------------------------------------------------------ the algorithm
    def apply(self, task: AsyncTask, sent: NDArrays, client: NDArrays, staleness: int) -> None:
        """Take one checked client update (the client's model ``client``, trained from
        ``sent``, ``staleness`` versions ago)."""
        raise NotImplementedError

    def update_ready(self) -> bool:
        """True once the round's server update can be made."""
        raise NotImplementedError

    def server_update(self, server_round: int) -> ArrayRecord | None:
        """The round's new model (None: kept), after :meth:`update_ready`."""
        raise NotImplementedError

    def partial_update(self) -> ArrayRecord | None:
        """The model of a round that ended before its server update (too many failures):
        None, the model is kept (FedBuff's buffer waits for the next round)."""
        return None

    def buffer_fill(self) -> int:
        """Client updates in the server update just made."""
        return len(self.updates.staleness)

    def algorithm_lines(self) -> list[str]:
        """The algorithm's settings for :meth:`summary`."""
        return []

    # ------------------------------------------------------------------ Flower's hooks
    def summary(self) -> None:
        """Log the configuration."""
        tasks = self.tasks
        log(INFO, "\t├──> Asynchronous: concurrency %d, arrival order '%s', seed %s",
            tasks.concurrency, tasks.arrival, self.participation.seed)
        for line in [*self.algorithm_lines(), *self.participation.summary_lines()]:
            log(INFO, "\t├──> %s", line)
        super().summary()

    def start_run(self, num_rounds: int, timeout: float | None) -> None:
        """The seconds a round waits before giving up the tasks in flight."""
        self.timeout = timeout

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """One server update (module docstring); no message is left for the round loop."""
        config[C.SERVER_ROUND] = server_round
        self.model, self.updates = arrays, RoundUpdates()
        report = self.reports[server_round] = RoundReport(server_round)
        sent, down, start = self.tasks.sent, self.tasks.bytes_down, self.tasks.now
        self.tasks.selections = []
        self.tasks.run(grid, lambda: (self.version, self.model), config, self, self.on_reply,
                       self.on_lost, self.round_over, self.timeout)
        fill = self.buffer_fill()
        new = self.server_update(server_round) if self.update_ready() else \
            self.partial_update()
        if new is not None and not trust_gate.adoptable_model(records.to_numpy(new),
                                                              server_round):
            new = None
        if new is not None:
            self.model = new
        u = self.updates
        lr = config.get(C.LR)
        report.add(ParticipationSection(
            sampled=self.tasks.sent - sent, bytes_down=self.tasks.bytes_down - down,
            lr=float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None))
        flower_args.log_counts("aggregate_train", len(u.metrics), u.failed)
        metrics = records.mean_of_metrics(u.metrics) if u.metrics else {}
        loss = metrics.get(C.TRAIN_LOSS, metrics.get(C.STOCK_TRAIN_LOSS))
        if self.custom_metrics[0] is not None and u.metrics:
            metrics = flower_args.flower_metrics(
                self.custom_metrics[0], [RecordDict({C.METRICS: m}) for m in u.metrics])
        report.add(Aggregation(received=len(u.metrics), failed=u.failed, bytes_up=u.bytes_up,
                               train_loss=loss, model_kept=new is None))
        report.add(AsyncUpdate(staleness=list(u.staleness), concurrency=len(self.tasks.in_flight),
                               buffer_fill=fill,
                               client_updates=self.client_updates, model_version=self.version))
        if self.tasks.selections:
            report.add(merged_selections(self.tasks.selections))
        timer = self.participation.timer
        if timer is not None:
            timer.elapsed = self.tasks.now
            report.add(ClockTime(self.tasks.now - start, self.tasks.now))
        log(INFO, "%s: round %d, server update %d from %d client update(s) (staleness %s), "
            "%d training", type(self).__name__, server_round, self.version, len(u.staleness),
            u.staleness, len(self.tasks.in_flight))
        self.outcome = (server_round, new,
                        MetricRecord({**report.metric_items(), **metrics}) if new else None)
        return []

    def round_over(self) -> bool:
        """The server update is ready, or ``MAX_FAILURES_PER_TASK`` x ``concurrency`` tasks
        failed this round (the model is then kept)."""
        if self.update_ready():
            return True
        if self.updates.failed >= MAX_FAILURES_PER_TASK * self.tasks.concurrency:
            log(WARNING, "%s: %d client tasks failed this round without a server update; the "
                "round ends with the model kept", type(self).__name__, self.updates.failed)
            return True
        return False

    def on_lost(self, task: AsyncTask) -> None:
        """A task given up: it counts as failed."""
        self.updates.failed += 1

    def on_reply(self, task: AsyncTask, reply: Message) -> None:
        """Check a reply against the model version its task was sent, then :meth:`apply`."""
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
            self.updates.failed += 1
            return
        staleness = self.version - task.version
        self.apply(task, records.to_numpy(sent), client, staleness)
        self.client_updates += 1
        self.updates.staleness.append(staleness)
        self.updates.metrics.append(reply.content[C.METRICS])
        self.updates.bytes_up += records.array_bytes(reply.content)
        timed = self.participation.timer is not None
        self.participation.feedback(task.number + 1, [
            (node, reply, task.done_at - task.sent_at if timed else None)])

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The model and metrics of the server update :meth:`configure_train` made."""
        outcome = self.outcome
        if outcome is None or outcome[0] != server_round:
            raise RuntimeError(f"{type(self).__name__}: aggregate_train(server_round="
                               f"{server_round}) without configure_train for that round")
        if list(replies):
            raise ValueError(f"{type(self).__name__}: configure_train sends no message for the "
                             f"round loop, so aggregate_train takes no replies")
        self.outcome = None
        if outcome[1] is None:
            log(WARNING, "Round %d: no server update, the global model is kept", server_round)
        return outcome[1], outcome[2]

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

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The model version and update counters, the tasks in flight with the versions
        they were sent (:meth:`strategies.engine.async_tasks.AsyncTasks.state_dict`), the simulated
        time and the algorithm's own state (:meth:`algorithm_state`)."""
        return {"async-strategy-version": STATE_VERSION, "class": type(self).__name__,
                "version": self.version, "client-updates": self.client_updates,
                "tasks": self.tasks.state_dict(), "algorithm": self.algorithm_state(),
                **self.participation.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (checks it is this class's)."""
        if state.get("class") != type(self).__name__:
            raise ValueError(f"checkpoint holds the state of {state.get('class')!r}, "
                             f"not of {type(self).__name__}")
        self.version = int(state["version"])
        self.client_updates = int(state["client-updates"])
        self.tasks.load_state_dict(state["tasks"])
        self.load_algorithm_state(state["algorithm"])
        self.participation.load_state_dict(state)

    def algorithm_state(self) -> dict:
        """The algorithm's own cross-round state (none by default)."""
        return {}

    def load_algorithm_state(self, state: dict) -> None:
        """Restore :meth:`algorithm_state`."""


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

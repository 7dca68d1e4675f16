"""The participation model: who takes part in a round, with how much work, and when the
replies come on the simulated clock. One component, given to any strategy.

Per round (:meth:`Participation.plan_round`):

1. the connected nodes, new ones asked for their facts (the client-info query:
   partition id, n_k, label counts; :mod:`strategies.engine.records`);
2. who is online (device availability, :mod:`strategies.engine.devices`, with a clock),
   less the clients whose last task timed out (:mod:`strategies.engine.silent_clients`);
3. who is selected: the :class:`SelectionPolicy` (:class:`RandomSelection`: m = max(floor(C
   K), 1) uniformly without replacement, McMahan et al. 2017 Algorithm 1, or m draws with
   replacement by data size, Li et al. 2020 Scheme I), or an
   :class:`~strategies.selection.policy.InformedSelection` (Oort, Power-of-Choice, TiFL) given
   the candidates' facts, a loss query, and after the round the accepted replies'
   outcomes (:meth:`Participation.feedback`), every self-reported number bounded against
   the fleet and every client held to twice its fair share
   (:class:`~strategies.selection.fleet_guard.FleetGuard`);
4. how much work each selected client gets: the strategy's full local work tau_i, cut for
   stragglers, random ones (Li et al. 2020, FedProx, Sec. 5.2) or those whose work does
   not fit the round's deadline on the clock (:func:`strategies.engine.clock.steps_within`);
   ``straggler_policy`` "drop" sends them nothing (FedAvg), "partial" their reduced work;
5. with a clock whose ``dropout`` is > 0, which of the clients sent work drop out before
   replying (:meth:`strategies.engine.clock.RoundTimer.dropout_point`): the engine discards
   their replies (``RoundPlan.dropped_out``);
6. after the round, its simulated seconds (:meth:`Participation.round_time`, eq. 1 of
   :mod:`strategies.engine.clock`), a dropped client's at the fraction of its t_i where it
   dropped.

The engine describes each client's work through :class:`ClientWork`
(:class:`strategies.engine.work.LocalWork`) and the plan is a typed
:class:`~strategies.engine.round_plan.RoundPlan`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from .. import contract as C
from . import records, sampling, trust_gate
from .averaging import data_shares
from .clock import RoundTimer, SimClock
from .records import ClientInfo
from .round_plan import ClientTask, RoundPlan
from .round_report import ClockTime
from .silent_clients import SilentClients
from ..selection.fleet_guard import FleetGuard
from ..selection.policy import SelectionSection, Candidate, InformedSelection, Outcome, reported_loss

__all__ = ["ClientWork", "ModelShare", "Participation", "RandomSelection", "SelectionPolicy",
           "STRAGGLER_POLICIES", "STRAGGLER_UNITS", "check_choice", "check_fraction",
           "check_whole"]

STRAGGLER_POLICIES = ("drop", "partial")
STRAGGLER_UNITS = ("steps", "epochs")


class ClientWork(Protocol):
    """What a strategy tells the participation model about one client's local work."""

    min_partial_steps: int
    """Fewest local steps a deadline straggler is sent; fewer fit: it gets no work."""

    def full_local_steps(self, node_id: int, config: ConfigRecord) -> int:
        """tau_i of a client that is not a straggler."""

    def examples_per_step(self, node_id: int, config: ConfigRecord) -> int:
        """b_i, examples per local step (eq. 1 of :mod:`strategies.engine.clock`)."""

    def extra_examples(self, node_id: int, config: ConfigRecord) -> int:
        """e_i, examples of forward-backward passes beyond the local steps."""

    def expected_bytes(self, arrays: ArrayRecord) -> tuple[int, int]:
        """Bytes down and up per client, as planned."""

    def model_share(self, node_id: int, config: ConfigRecord, down: int, up: int
                    ) -> ModelShare:
        """The model a client trains, as the clock charges it: the full one (``down`` /
        ``up`` the planned bytes), or its own sub-model (width-heterogeneous strategies)."""


@dataclasses.dataclass(frozen=True)
class ModelShare:
    """One client's model on the clock: ``compute``, its training cost per example over the
    full model's (c_i = compute c in eq. (1) of :mod:`strategies.engine.clock`), and the bytes it
    moves down and up."""

    compute: float
    bytes_down: int
    bytes_up: int


class SelectionPolicy(Protocol):
    """Who trains this round, among the online clients (in partition order)."""

    def select(self, server_round: int, candidates: Sequence[int], num_sampled: int | None,
               fraction: float, probabilities: np.ndarray | None) -> dict[int, int]:
        """Candidate position -> number of draws of the selected clients."""


class RandomSelection:
    """m uniformly without replacement, or m draws with replacement with probability p_k
    (``probabilities``): :func:`strategies.engine.sampling.sample_round` with
    ``default_rng([seed, round])``."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def select(self, server_round: int, candidates: Sequence[int], num_sampled: int | None,
               fraction: float, probabilities: np.ndarray | None) -> dict[int, int]:
        return sampling.sample_round(self.seed, server_round, len(candidates), fraction,
                                     probabilities, num_sampled=num_sampled)


class Participation:
    """Availability, selection, work plan and simulated clock of a run (module docstring).

    Parameters
    ----------
    fraction_train : float
        C: m = max(floor(C K), 1) of the K connected clients per round.
    seed : int
        Seeds selection (``default_rng([seed, round])``) and stragglers
        (``default_rng([seed, round, 1])``).
    min_available_nodes : int
        Wait until this many nodes are connected before selecting.
    min_train_nodes : int
        m is at least this many (Flower's argument; 1 is Algorithm 1's rule), at most the
        online clients.
    query_client_info : bool
        Ask new nodes for their partition id, n_k and label counts (a ``query`` message;
        the ClientApp registers ``strategies.client.info.client_info_reply``).
    query_timeout : float
        Seconds to wait for the query's replies.
    straggler_fraction, straggler_policy, straggler_unit
        Random stragglers (Li et al. 2020, Sec. 5.2): floor(f m) of the m selected clients
        can do only 1..tau_i steps (or 1..E epochs with ``"epochs"``); ``"drop"`` sends them
        nothing, ``"partial"`` their reduced work.
    clock : SimClock, optional
        Simulated time on a heterogeneous fleet (needs the query: profiles are keyed by
        partition id); offline devices are not selected.
    round_deadline : float, optional
        D, simulated seconds per round (needs ``clock``): the alternative to
        ``straggler_fraction``.
    over_commitment : float
        o >= 0: select ceil((1 + o) m) clients and close the round at the first m usable
        replies on the simulated clock (as FedScale and Oort do; needs ``clock``); the
        others' replies are late and left out.
    selection : SelectionPolicy, optional
        Who trains among the online clients (default :class:`RandomSelection`).
    owner : str
        The strategy's name, for messages.
    """

    def __init__(self, *, fraction_train: float = 1.0, seed: int = 0,
                 min_available_nodes: int = 2, min_train_nodes: int = 1,
                 query_client_info: bool = False,
                 query_timeout: float = 600.0, straggler_fraction: float = 0.0,
                 straggler_policy: str = "drop", straggler_unit: str = "steps",
                 clock: SimClock | None = None, round_deadline: float | None = None,
                 over_commitment: float = 0.0, selection: SelectionPolicy | None = None,
                 owner: str = "FedAvg", selection_guard: FleetGuard | None = None) -> None:
        check_fraction("fraction_train", fraction_train, allow_zero=False)
        check_whole("seed", seed, minimum=0)
        check_whole("min_available_nodes", min_available_nodes, minimum=1)
        check_whole("min_train_nodes", min_train_nodes, minimum=1)
        if not (isinstance(query_timeout, (int, float)) and query_timeout > 0):
            raise ValueError(f"query_timeout must be > 0 seconds (how long a client-info query "
                             f"waits for replies), got {query_timeout!r}")
        check_fraction("straggler_fraction", straggler_fraction, allow_zero=True)
        check_choice("straggler_unit", straggler_unit, STRAGGLER_UNITS)
        check_choice("straggler_policy", straggler_policy, STRAGGLER_POLICIES)
        self.timer = clock_timer(owner, clock, seed, round_deadline, query_client_info)
        if round_deadline is not None and straggler_fraction > 0:
            raise ValueError(f"round_deadline={round_deadline} and straggler_fraction="
                             f"{straggler_fraction} are alternatives (the deadline makes the "
                             f"stragglers); set straggler_fraction=0 or round_deadline=None")
        if not (isinstance(over_commitment, (int, float)) and not isinstance(over_commitment, bool)
                and 0 <= over_commitment <= 10):
            raise ValueError(f"over_commitment must be a number in [0, 10] (0.3: 30% more "
                             f"clients than needed), got {over_commitment!r}")
        if over_commitment > 0 and self.timer is None:
            raise ValueError(f"over_commitment={over_commitment} closes a round at its first "
                             f"replies on the simulated clock: pass clock=SimClock(...) too")
        self.over_commitment = float(over_commitment)
        self.fraction_train = float(fraction_train)
        self.seed = int(seed)
        self.min_available_nodes = int(min_available_nodes)
        self.min_train_nodes = int(min_train_nodes)
        self.query_client_info = bool(query_client_info)
        self.query_timeout = float(query_timeout)
        self.straggler_fraction = float(straggler_fraction)
        self.straggler_policy = straggler_policy
        self.straggler_unit = straggler_unit
        self.selection = selection if selection is not None else RandomSelection(seed)
        if getattr(self.selection, "needs_clock", False) and self.timer is None:
            raise ValueError(f"selection {getattr(self.selection, 'name', self.selection)!r} "
                             f"needs the clients' times on the simulated clock: pass "
                             f"clock=SimClock(...) (run config: device-profiles)")
        self.guard = selection_guard if selection_guard is not None else FleetGuard()
        self.owner = owner
        self.clients: dict[int, ClientInfo] = {}
        self._warned_query = False
        self._sat_out: set[int] = set()  # nodes without a partition id the clock left out
        self.silent = SilentClients()  # clients whose task timed out sit out a while

    # ------------------------------------------------------------------ clients
    def summary_lines(self) -> list[str]:
        """What :meth:`strategies.FedAvg.summary` logs of the participation."""
        lines = []
        if self.straggler_fraction > 0:
            lines.append(f"Stragglers: {100 * self.straggler_fraction:.0f}% per round, "
                         f"policy '{self.straggler_policy}'")
        if self.timer is not None:
            lines.append(f"Simulated clock: {type(self.timer.clock.fleet).__name__}, deadline "
                         f"{self.timer.deadline or 'none'}, policy '{self.straggler_policy}'")
        if self.over_commitment > 0:
            lines.append(f"Over-commitment: {100 * self.over_commitment:g}% more clients "
                         f"selected, the round closes at the first m replies")
        return lines

    def connected(self, grid: Grid) -> list[int]:
        """Connected nodes (at least ``min_available_nodes``); new ones are queried when
        ``query_client_info`` is on (:func:`strategies.engine.records.update_clients`), their claims
        checked against ``partition_map`` when one is set (the ServerApp's ``partition-map``)."""
        nodes, self._warned_query = records.update_clients(
            grid, self.clients, min_nodes=self.min_available_nodes,
            query=self.query_client_info, timeout=self.query_timeout, owner=self.owner,
            warned=self._warned_query, partition_map=getattr(self, "partition_map", None))
        nodes = records.bound_nodes(nodes, self.clients)  # a node its key does not allow
        if self.timer is None:
            return nodes
        # the clock keys profiles by partition id: nodes whose answer was refused, or that
        # the query did not reach (asked again next round), sit out
        timed = self.timed_nodes(records.usable_nodes(nodes, self.clients))
        self.timer.bind_sizes({info.partition_id: info.num_examples
                               for info in self.clients.values()
                               if info.partition_id is not None and info.num_examples})
        return timed

    def timed_nodes(self, nodes: list[int]) -> list[int]:
        """The ``nodes`` the clock can time: those with a partition id. The others (their
        client-info query failed; the ServerApp log has each reply's error) sit out, with
        one WARNING per node; when no node has one, the error naming the query helper."""
        known = [n for n in nodes if self.info(n).partition_id is not None]
        if nodes and not known:
            self.partition_of(nodes[0])  # raises, naming records.QUERY_HELPER
        new = [n for n in nodes if self.info(n).partition_id is None and n not in self._sat_out]
        if new:
            log(WARNING, "%s: %d node(s) reported no '%s' (their client-info query failed): "
                "the simulated clock cannot time them, so they sit out: %s", self.owner,
                len(new), C.PARTITION_ID, ", ".join(map(str, new)))
            self._sat_out.update(new)
        return known

    def ordered(self, node_ids: Sequence[int]) -> list[int]:
        """Nodes sorted by reported partition id; nodes without one after, by node id."""
        return records.partition_order(node_ids, self.clients)

    def info(self, node_id: int) -> ClientInfo:
        """What the query told of a node (empty facts if nothing)."""
        return self.clients.get(node_id, ClientInfo())

    def partition_of(self, node_id: int) -> int:
        """The node's partition id (the clock's profiles are keyed by it)."""
        return records.clock_partition_id(self.owner, self.clients, node_id)

    def client_key(self, node_id: int) -> str:
        """A client's key in cross-round tables: its partition id, else ``node-<id>``."""
        return records.client_key(self.clients, node_id)

    def data_shares(self, node_ids: Sequence[int]) -> np.ndarray:
        """p_k = n_k / n over the given nodes (uniform, with a warning, if a size is unknown)."""
        shares = data_shares([self.info(n).num_examples for n in node_ids])
        if shares is None:
            log(WARNING, "Some clients did not report num-examples: p_k taken as uniform")
            return np.full(len(node_ids), 1.0 / len(node_ids))
        return shares

    # ------------------------------------------------------------------ the plan
    def plan_round(self, server_round: int, grid: Grid, arrays: ArrayRecord,
                   config: ConfigRecord, work: ClientWork, *,
                   draw_by_data_size: bool = False) -> RoundPlan:
        """Round ``server_round``'s plan (module docstring, steps 1-4): the tasks' configs are
        ``config`` with a straggler's reduced work."""
        nodes = self.ordered(self.connected(grid))
        online, m = self.without_silent(server_round, *self.online_nodes(server_round, nodes))
        close_after = None
        if self.over_commitment > 0 and m:
            close_after, m = m, min(math.ceil((1 + self.over_commitment) * m), len(online))
        picks: dict[int, int] = {}
        section = None
        if online:
            probabilities = self.data_shares(online) if draw_by_data_size else None
            picks, section = self.select_among(server_round, grid, online, m, probabilities,
                                               arrays, config, work)
            if section is not None and section.query_seconds:
                self.timer.delay_start(section.query_seconds)  # the loss query came first
        draws = {online[k]: d for k, d in picks.items()}
        down, up = work.expected_bytes(arrays)
        reduced = self.stragglers(server_round, draws, config, work, down, up)
        if self.straggler_policy == "drop":
            sent = {n: d for n, d in draws.items() if n not in reduced}
        else:  # partial work; a client that fits no step by the deadline is not sent any
            sent = {n: d for n, d in draws.items() if reduced.get(n, 1) > 0}
        in_epochs = self.work_in_epochs(config)
        tasks = {n: ClientTask(n, self.info(n).partition_id,
                               reduced_config(config, reduced.get(n), in_epochs), d,
                               reduced.get(n))
                 for n, d in sent.items()}
        log(INFO, "configure_train: sampled %d of %d nodes (%d stragglers, policy %s)",
            len(draws), len(nodes), len(reduced), self.straggler_policy)
        plan = RoundPlan(
            server_round, arrays, config, tuple(nodes), tasks, sampled=len(draws),
            straggler_work=reduced,
            unavailable=len(nodes) - len(online) if self.timer is not None else None,
            deadline_dropped=len(draws) - len(sent) if self.timer is not None else 0,
            bytes_down=down, bytes_up=up, close_after=close_after,
            dropped_out=self.dropouts(tasks))
        if section is not None:
            plan.report.add(section)
        return plan

    def dropouts(self, tasks: Mapping[int, ClientTask]) -> dict[int, float] | None:
        """The clients of ``tasks`` that drop out of the round -> the fraction of their t_i
        at which they drop (:meth:`strategies.engine.clock.RoundTimer.dropout_point`); None
        without a clock or with dropout 0."""
        if self.timer is None or self.timer.clock.dropout <= 0:
            return None
        points = {n: self.timer.dropout_point(self.partition_of(n)) for n in tasks}
        return {n: f for n, f in points.items() if f is not None}

    # ------------------------------------------------------------------ selection
    def select_among(self, server_round: int, grid: Grid, online: list[int], m: int | None,
                     probabilities: np.ndarray | None, arrays: ArrayRecord,
                     config: ConfigRecord, work: ClientWork
                     ) -> tuple[dict[int, int], SelectionSection | None]:
        """Position in ``online`` -> draws of the selected clients, and the policy's run-log
        section (None for a plain :class:`SelectionPolicy`): an
        :class:`~strategies.selection.policy.InformedSelection` is given the candidates' facts
        (:meth:`candidate`) and, if it asks, the loss query (:meth:`query_losses`), whose
        simulated duration (the slowest queried client's download and evaluation) the
        section carries as ``query_seconds`` for the caller to put before the work."""
        policy = self.selection
        if not isinstance(policy, InformedSelection):
            return policy.select(server_round, online, m, self.fraction_train,
                                 probabilities), None
        if m is None:
            m = sampling.num_to_sample(self.fraction_train, len(online))
        down, up = work.expected_bytes(arrays)
        candidates = self.guard.candidates(
            [self.candidate(n, config, work, down, up) for n in online])
        keys = [c.key for c in candidates]
        allowed = self.guard.eligible(keys, m)  # within their fair share
        shown = [candidates[k] for k in allowed]
        asked = {"messages": 0, "bytes": 0, "nodes": []}

        def query(positions):
            losses = self.query_losses(server_round, grid, [online[allowed[k]] for k in positions],
                                       positions, arrays, asked)
            return self.guard.answers({k: shown[k].key for k in positions}, losses)

        choice = policy.choose(server_round, shown, m, query if policy.queries_losses else None)
        picks = {allowed[k]: d for k, d in choice.picks.items()}
        self.guard.record(keys, [keys[k] for k in picks], m)
        section = choice.section
        if policy.queries_losses:
            seconds = None
            if self.timer is not None and asked["nodes"]:  # the query runs before training
                seconds = max(self.timer.evaluation_seconds(  # n_i unknown: its download
                    self.partition_of(n), self.info(n).num_examples or 0, arrays.count_bytes(),
                    draw=server_round) for n in asked["nodes"])
            section = dataclasses.replace(section, query_messages=asked["messages"],
                                          query_bytes=asked["bytes"], query_seconds=seconds)
        return picks, section

    def candidate(self, node: int, config: ConfigRecord, work: ClientWork, down: int,
                  up: int) -> Candidate:
        """What a policy sees of an online node: key, n_k, t_i of its full work (eq. 1)."""
        seconds = None
        if self.timer is not None:
            share = work.model_share(node, config, down, up)
            seconds = self.timer.client_seconds(
                self.partition_of(node), work.full_local_steps(node, config),
                work.examples_per_step(node, config), share.bytes_down, share.bytes_up,
                work.extra_examples(node, config), share.compute, expected=True)
        return Candidate(self.client_key(node), self.info(node).num_examples, seconds)

    def query_losses(self, server_round: int, grid: Grid, nodes: list[int],
                     positions: list[int], arrays: ArrayRecord, asked: dict
                     ) -> dict[int, float | None]:
        """Power-of-Choice's query: the global model to ``nodes`` as Flower ``evaluate``
        messages; position -> the loss of each reply the trust gate accepts
        (``eval-loss`` or Flower's ``eval_loss``), None otherwise. Counts messages and
        array bytes in ``asked``."""
        config = ConfigRecord({C.SERVER_ROUND: server_round})
        messages = [Message(RecordDict({C.ARRAYS: arrays, C.CONFIG: config}),
                            message_type=MessageType.EVALUATE, dst_node_id=n) for n in nodes]
        asked["messages"] += len(messages)
        asked["nodes"] += nodes
        asked["bytes"] += len(messages) * arrays.count_bytes()
        by_node = dict(zip(nodes, positions))
        losses: dict[int, float | None] = {k: None for k in positions}
        for reply in grid.send_and_receive(messages, timeout=self.query_timeout):
            node = reply.metadata.src_node_id
            if node not in by_node or reply.has_error():
                continue
            problem = trust_gate.evaluate_reply_problem(reply, self.info(node).num_examples)
            if problem:
                trust_gate.log_refused("Loss query reply", node, self.info(node).partition_id,
                                       problem)
                continue
            metrics = next(iter(reply.content.metric_records.values()))
            losses[by_node[node]] = reported_loss(metrics, (C.EVAL_LOSS, "eval_loss"))
        return losses

    def feedback(self, server_round: int, replies: Sequence[tuple[int, Message,
                                                                  float | None]]) -> None:
        """Tell an :class:`~strategies.selection.policy.InformedSelection` the accepted replies of
        round ``server_round`` as (node, reply, its clock time or None); nothing for a plain
        policy."""
        policy = self.selection
        if not isinstance(policy, InformedSelection) or not replies:
            return
        outcomes = []
        for node, reply, seconds in replies:
            metrics = reply.content[C.METRICS]
            n = metrics.get(C.NUM_EXAMPLES)
            outcomes.append(Outcome(self.client_key(node), reported_loss(metrics),
                                    int(n) if isinstance(n, int) else None, seconds))
        policy.feedback(server_round, self.guard.outcomes(outcomes))

    def round_feedback(self, plan: RoundPlan, accepted: Sequence[Message],
                       work: ClientWork) -> None:
        """:meth:`feedback` of a synchronous round: the accepted replies with their t_i."""
        if not isinstance(self.selection, InformedSelection):
            return
        self.feedback(plan.server_round, [
            (r.metadata.src_node_id, r,
             self.client_time(plan, plan.tasks[r.metadata.src_node_id], r, work)
             if self.timer is not None and r.metadata.src_node_id in plan.tasks else None)
            for r in accepted])

    def online_nodes(self, server_round: int, ordered: list[int]) -> tuple[list[int], int | None]:
        """The nodes that can be selected this round and m: all of them and None (m =
        max(floor(C K), 1)) without a clock; with one, :meth:`strategies.engine.clock.RoundTimer.
        online_nodes`. With ``min_train_nodes`` > 1, m is at least that, at most the
        online nodes."""
        if self.timer is None:
            online, m = ordered, None
        else:
            online, m = self.timer.online_nodes(server_round, ordered,
                                                [self.partition_of(n) for n in ordered],
                                                self.fraction_train)
        if self.min_train_nodes > 1 and online:
            base = m if m is not None else sampling.num_to_sample(self.fraction_train,
                                                                   len(online))
            m = min(max(base, self.min_train_nodes), len(online))
        return online, m

    def without_silent(self, server_round: int, online: list[int], m: int | None
                       ) -> tuple[list[int], int | None]:
        """``online`` less the clients that sit this round out after a timeout
        (:class:`SilentClients`), and m (that of the whole list, at most the rest);
        unchanged when none sits out, or when the rest would be fewer than
        ``min_train_nodes``."""
        out = self.silent.sitting_out(server_round)
        kept = [n for n in online if self.client_key(n) not in out]
        if len(kept) == len(online) or len(kept) < max(self.min_train_nodes, 1):
            return online, m
        whole = m if m is not None else sampling.num_to_sample(self.fraction_train, len(online))
        need = min(max(whole, self.min_train_nodes), len(kept))
        log(INFO, "Round %d: %d client(s) whose last task timed out sit it out (%s)",
            server_round, len(online) - len(kept),
            ", ".join(sorted(self.client_key(n) for n in online if n not in set(kept))))
        return kept, need

    def record_silent(self, server_round: int, sent: Iterable[int], replied: Iterable[int]
                      ) -> None:
        """The round's tasks (nodes sent one) and the nodes that replied (errors too): the
        rest timed out (:class:`SilentClients`)."""
        replied = set(replied)
        sent = list(sent)
        self.silent.record(server_round, [self.client_key(n) for n in sent if n not in replied],
                           [self.client_key(n) for n in sent if n in replied])

    def stragglers(self, server_round: int, draws: Mapping[int, int], config: ConfigRecord,
                   work: ClientWork, down: int, up: int) -> dict[int, int]:
        """This round's stragglers among the selected nodes -> their reduced local work: the
        steps that fit ``round_deadline`` (0: not even ``work.min_partial_steps``), or
        ``straggler_fraction``'s random ones."""
        if self.timer is not None and self.timer.deadline is not None:
            cut = {}
            for node in draws:
                full = work.full_local_steps(node, config)
                share = work.model_share(node, config, down, up)
                fit = self.timer.steps_by_deadline(
                    self.partition_of(node), work.examples_per_step(node, config),
                    share.bytes_down, share.bytes_up, work.extra_examples(node, config),
                    share.compute)
                if fit < full:
                    cut[node] = fit if fit >= work.min_partial_steps else 0
            return cut
        nodes = list(draws)
        in_epochs = self.work_in_epochs(config)

        def full_work(positions: list[int]) -> list[int]:
            if in_epochs:
                return [int(config.get(C.LOCAL_EPOCHS, 1))] * len(positions)
            return [work.full_local_steps(nodes[i], config) for i in positions]

        chosen = sampling.round_stragglers(self.seed, server_round, len(nodes),
                                           self.straggler_fraction, full_work)
        return {nodes[i]: w for i, w in chosen.items()}

    def work_in_epochs(self, config: ConfigRecord) -> bool:
        """Stragglers' work counts whole epochs (``straggler_unit="epochs"`` without
        ``local-steps``; a deadline always cuts steps)."""
        return (self.straggler_unit == "epochs" and int(config.get(C.LOCAL_STEPS, 0)) == 0
                and (self.timer is None or self.timer.deadline is None))

    def full_local_steps(self, node_id: int, config: ConfigRecord) -> int:
        """tau_i of a client doing what ``config`` asks: ``local-steps`` if set, else
        floor(E n_i / B) (:func:`strategies.contract.steps_for_epochs`)."""
        steps = int(config.get(C.LOCAL_STEPS, 0))
        if steps > 0:
            return steps
        epochs = config.get(C.LOCAL_EPOCHS, 1)  # may be a fraction of an epoch
        n = self.info(node_id).num_examples
        if not n:
            return max(int(epochs), 1)
        return max(C.steps_for_epochs(n, int(config.get(C.BATCH_SIZE, 0)), epochs), 1)

    def examples_per_step(self, node_id: int, config: ConfigRecord, owner: str) -> int:
        """b_i = min(B, n_i) examples per local step; n_i for a full batch (B = 0)."""
        batch = int(config.get(C.BATCH_SIZE, 0))
        n = self.info(node_id).num_examples
        if batch > 0:
            return min(batch, n) if n else batch
        if not n:
            raise ValueError(f"{owner}: the simulated clock needs node {node_id}'s "
                             f"num-examples for a full-batch step; it answers the client-info "
                             f"query with none")
        return n

    # ------------------------------------------------------------------ the clock
    def round_time(self, plan: RoundPlan, accepted: Sequence[Message],
                   work: ClientWork) -> ClockTime | None:
        """The round on the simulated clock (None without one): eq. (1) of
        :mod:`strategies.engine.clock` per client sent work, with the steps and array bytes of its
        accepted reply, else (no usable reply) the planned ones; the deadline when it
        dropped a client."""
        if self.timer is None:
            return None
        replies = {r.metadata.src_node_id: r for r in accepted}
        tasks = plan.tasks
        if plan.close_after is not None and len(accepted) >= plan.close_after:
            tasks = {node: tasks[node] for node in replies}  # closed at the m-th reply
        dropped = plan.dropped_out or {}
        times = [self.client_time(plan, task, replies.get(node), work) * dropped.get(node, 1.0)
                 for node, task in tasks.items()]
        wait = self.timer.wait
        seconds = self.timer.finish_round(times, waited_for_deadline=plan.deadline_dropped > 0)
        log(INFO, "Simulated clock: round %d took %.4g s (%d client(s) cut by the deadline, "
            "%d not sent work, %d dropped out), %.4g s in all", plan.server_round, seconds,
            plan.stragglers if self.timer.deadline is not None else 0, plan.deadline_dropped,
            len(dropped), self.timer.elapsed)
        return ClockTime(seconds, self.timer.elapsed, wait if wait > 0 else None)

    def client_time(self, plan: RoundPlan, task: ClientTask, reply: Message | None,
                    work: ClientWork) -> float:
        """t_i of eq. (1) for one task: the steps and array bytes of its reply, else (no
        usable reply) the planned ones."""
        node = task.node_id
        steps = int(task.config.get(C.LOCAL_STEPS, 0)) or work.full_local_steps(node, task.config)
        share = work.model_share(node, task.config, plan.bytes_down, plan.bytes_up)
        up = share.bytes_up
        if reply is not None:
            taken = reply.content[C.METRICS].get(C.LOCAL_STEPS_TAKEN)
            if isinstance(taken, int) and not isinstance(taken, bool) and taken >= 1:
                steps = taken
            up = records.array_bytes(reply.content)
        return self.timer.client_seconds(
            self.partition_of(node), steps, work.examples_per_step(node, task.config),
            share.bytes_down, up, work.extra_examples(node, task.config), share.compute)

    def first_replies(self, plan: RoundPlan, usable: list[Message], work: ClientWork
                      ) -> tuple[list[Message], int]:
        """Over-commitment: the first ``plan.close_after`` = m of the ``usable`` replies by
        simulated completion time (ties: their order), in their order, and how many came
        later; all of them, 0 when the round is not over-committed."""
        m = plan.close_after
        if m is None or len(usable) <= m:
            return usable, 0
        times = [self.client_time(plan, plan.tasks[r.metadata.src_node_id], r, work)
                 for r in usable]
        first = sorted(sorted(range(len(usable)), key=lambda k: times[k])[:m])
        return [usable[k] for k in first], len(usable) - m

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The simulated time so far (with a clock): selection and stragglers are drawn from
        ``default_rng([seed, round(, 1)])`` afresh every round, and the client table is
        re-queried on resume (node ids change between runs, partition ids do not)."""
        state = {} if self.timer is None else {"sim-elapsed": self.timer.elapsed}
        if self.silent.out_until:
            state["silent-clients"] = self.silent.state_dict()
        if isinstance(self.selection, InformedSelection):
            state["selection-state"] = {"policy": self.selection.name,
                                        **self.selection.state_dict()}
            state["selection-guard"] = self.guard.state_dict()
        return state

    def load_state_dict(self, state: Mapping) -> None:
        """Restore what :meth:`state_dict` returned."""
        if self.timer is not None:
            self.timer.elapsed = float(state.get("sim-elapsed", 0.0))
        if "silent-clients" in state:
            self.silent.load_state_dict(state["silent-clients"])
        if isinstance(self.selection, InformedSelection):
            saved = state.get("selection-state")
            if not isinstance(saved, Mapping) or saved.get("policy") != self.selection.name:
                raise ValueError(f"the checkpoint holds no state of selection "
                                 f"{self.selection.name!r} (it was written with "
                                 f"{saved.get('policy') if isinstance(saved, Mapping) else 'random'!r}"
                                 f"); resume with the run's own selection")
            self.selection.load_state_dict(saved)
            if "selection-guard" in state:  # checkpoints before the guard start it afresh
                self.guard.load_state_dict(state["selection-guard"])


def refuse_dropout(owner: str, participation: Participation, why: str) -> None:
    """A ValueError naming ``owner`` when its participation's clock drops clients out
    (``dropout`` > 0), which the strategy does not model (``why``)."""
    timer = participation.timer
    if timer is not None and timer.clock.dropout > 0:
        raise ValueError(f"{owner}: the simulated clock's dropout={timer.clock.dropout} is not "
                         f"modelled here ({why}); pass SimClock(..., dropout=0) (run config: "
                         f"device-dropout = 0)")


def reduced_config(config: ConfigRecord, reduced: int | None, in_epochs: bool) -> ConfigRecord:
    """``config`` itself for full work; else a copy asking for the reduced steps / epochs."""
    if reduced is None:
        return config
    own = ConfigRecord(dict(config))
    own[C.LOCAL_EPOCHS if in_epochs else C.LOCAL_STEPS] = reduced
    return own


def clock_timer(owner: str, clock: SimClock | None, seed: int, deadline: float | None,
                query_client_info: bool) -> RoundTimer | None:
    """The :class:`~strategies.engine.clock.RoundTimer` (None without a clock), checked: the
    profiles are keyed by partition id (the client-info query), a deadline needs a clock."""
    if deadline is not None and not (isinstance(deadline, (int, float)) and deadline > 0
                                     and math.isfinite(deadline)):
        raise ValueError(f"round_deadline must be a finite number of simulated seconds > 0 "
                         f"(None: no deadline), got {deadline!r}")
    if clock is None:
        if deadline is not None:
            raise ValueError(f"round_deadline={deadline} needs a simulated clock: pass "
                             f"clock=SimClock(fleet, seconds_per_example) (strategies.engine.clock)")
        return None
    if not query_client_info:
        raise records.query_required(owner, "clock (device profiles are keyed by the clients' "
                                     f"'{C.PARTITION_ID}')", "leave clock=None")
    return RoundTimer(clock, seed, deadline)


def check_fraction(name: str, value: float, allow_zero: bool) -> None:
    """``value`` in [0, 1] (``allow_zero``) or (0, 1], else a ValueError naming ``name``."""
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value <= 1):
        allowed = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must be in {allowed}, got {value}")


def check_whole(name: str, value: int, minimum: int) -> None:
    """``value`` a whole number >= ``minimum``, else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """``value`` one of ``allowed``, else a ValueError naming ``name`` and the choices."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not known; use one of {', '.join(allowed)}")

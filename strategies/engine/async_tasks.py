"""The client tasks of an asynchronous strategy: who trains, from which model version, and
when each reply is applied. One component, given to FedBuff and FedAsync.

Up to ``concurrency`` clients train at once. Each task is a Flower train message carrying
the model version v the client starts from; when a reply is applied, its client is free
again and the freed slot goes at once to a client drawn from the online idle ones (the
participation model's :class:`~strategies.engine.participation.SelectionPolicy`, one draw per
task), who gets the newest model.

Arrival orders:

* ``"simulated"`` (default): a task sent at simulated time t completes at t + t_i, t_i of
  eq. (1) of :mod:`strategies.engine.clock` (compute, bandwidth) on the device profiles (a
  fleet that varies per round, FLASH's, draws task n's profile as round n's); replies
  are applied in that order whatever order the real replies come back in
  (:meth:`strategies.engine.event_loop.GridEventLoop.run_in_clock_order`), so a run is
  deterministic, the same in simulation and deployment, and resumes bit for bit. Without
  a clock every task takes the same time: first sent, first applied.
* ``"real-time"``: replies are applied as they arrive (for real fleets; not reproducible).

With the clock's ``dropout`` p, task n's client drops out with probability p at a uniform
fraction f of its t_i (:meth:`strategies.engine.clock.RoundTimer.dropout_point`, task number n
in place of the round): the task completes at t + f t_i, where the server notices the lost
connection, and its reply is discarded (``on_dropped``). The client is not told to sit out: a
drop is the fleet's chance, not the client's failure.

A task's config carries ``server-round`` (the round being made) and ``async-task`` = its
task number (1, 2, ...): fedhetero's clients seed their batches by the task number, so each
task draws its own batches and a re-sent task the same ones.
In-flight tasks, the model versions they were sent and the simulated time are the state
of :meth:`AsyncTasks.state_dict`; a resumed run sends the in-flight tasks again, each to
the node that now serves its partition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from .. import contract as C
from . import devices, records
from .event_loop import GridEventLoop
from .participation import ClientWork, Participation, check_choice, check_whole

if TYPE_CHECKING:
    from ..selection.policy import SelectionSection

__all__ = ["ARRIVAL_ORDERS", "AsyncTask", "AsyncTasks"]

ARRIVAL_ORDERS = ("simulated", "real-time")
STATE_VERSION = 1
MAX_IDLE_DRAWS = 1000  # availability re-draws while nobody is online and nothing trains
IDLE_STEP = 60.0  # simulated seconds between two such re-draws


@dataclass(frozen=True)
class AsyncTask:
    """One client task: sent to ``node_id`` (serving ``partition_id``) at simulated time
    ``sent_at`` with model version ``version``; completes at ``done_at`` (without a clock,
    the task number: first sent, first done); ``dropped_out``: its client drops out before
    replying, at ``done_at``."""

    number: int
    node_id: int
    partition_id: int | None
    version: int
    config: ConfigRecord
    sent_at: float
    done_at: float
    dropped_out: bool = False


class AsyncTasks:
    """In-flight tasks on the Grid event loop (module docstring).

    Parameters
    ----------
    participation : Participation
        Connected clients, their facts, availability and clock, and the selection policy.
    concurrency : int
        Most clients training at once (FedBuff's concurrency; >= 1).
    arrival : {"simulated", "real-time"}
        The order in which replies are applied.
    owner : str
        The strategy's name, for messages.
    """

    def __init__(self, participation: Participation, concurrency: int,
                 arrival: str = "simulated", owner: str = "FedBuff") -> None:
        check_whole("concurrency", concurrency, minimum=1)
        check_choice("arrival", arrival, ARRIVAL_ORDERS)
        self.participation, self.concurrency = participation, int(concurrency)
        self.arrival, self.owner = arrival, owner
        self.in_flight: dict[int, AsyncTask] = {}  # task number -> task
        self.versions: dict[int, ArrayRecord] = {}  # model versions in-flight tasks started from
        self.next_number = 0
        self.now = 0.0  # simulated seconds: the completion time of the last applied reply
        self.loop: GridEventLoop[int] | None = None
        self.to_resend: list[AsyncTask] = []  # restored from a checkpoint, not sent yet
        self.bytes_down = 0
        self.sent = 0
        self.selections: list[SelectionSection] = []  # informed policies' picks, this round
        self._warned_real_time = False

    # ------------------------------------------------------------------ the loop
    def run(self, grid: Grid, model: Callable[[], tuple[int, ArrayRecord]],
            config: ConfigRecord, work: ClientWork,
            on_reply: Callable[[AsyncTask, Message], None],
            on_lost: Callable[[AsyncTask], None], on_dropped: Callable[[AsyncTask], None],
            done: Callable[[], bool], timeout: float | None) -> None:
        """Keep ``concurrency`` tasks in flight with the newest ``model()`` (version, arrays)
        and hand each reply to ``on_reply`` in the arrival order, until ``done()``; replies
        pulled after that wait for the next call. A task without a reply ``timeout`` seconds
        after it was sent is given up (its client freed) and handed to ``on_lost``; a task
        whose client drops out (module docstring) to ``on_dropped``, its reply unread.
        Raises RuntimeError when no client can be sent a task
        and none is in flight."""
        if self.loop is None or self.loop.grid is not grid:
            self.loop = GridEventLoop(grid)
            self.in_flight = {}
        if self.arrival == "real-time" and not self._warned_real_time:
            log(WARNING, "%s: arrival='real-time': replies are applied as they arrive, so this "
                "run is not reproducible (arrival='simulated' is)", self.owner)
            self._warned_real_time = True
        def handle(number: int, reply: Message | None) -> None:
            task = self.in_flight.pop(number)
            self.now = max(self.now, task.done_at)
            self.participation.record_silent(  # a lost task's client sits out a while
                self.async_round(number), [task.node_id], [] if reply is None else [task.node_id])
            if reply is None:
                log(WARNING, "%s: task %d (node %d) had no reply in %s s: given up",
                    self.owner, number + 1, task.node_id, timeout)
                on_lost(task)
            elif task.dropped_out:
                on_dropped(task)
            else:
                on_reply(task, reply)
            self.forget_unused_versions()
            if not done():
                self.fill(grid, model, config, work)

        while not done():
            self.resend(grid)
            self.fill(grid, model, config, work)
            if not self.in_flight:
                raise RuntimeError(f"{self.owner}: no client could be sent a task (none "
                                   f"connected and idle) and none is training")
            if self.arrival == "simulated":  # a lost task counts at its place on the clock
                self.loop.run_in_clock_order(
                    done, handle, lambda n: self.in_flight[n].done_at, expire_after=timeout,
                    on_lost=lambda n: handle(n, None))
            else:
                for number in self.loop.run_until(done, handle, hold_after_done=True,
                                                  expire_after=timeout):
                    handle(number, None)

    def fill(self, grid: Grid, model: Callable[[], tuple[int, ArrayRecord]],
             config: ConfigRecord, work: ClientWork) -> None:
        """Send tasks with the newest model until ``concurrency`` are in flight or no
        online client is idle."""
        if len(self.in_flight) >= self.concurrency:
            return
        version, arrays = model()
        p = self.participation
        nodes = p.ordered(p.connected(grid))
        while len(self.in_flight) < self.concurrency:
            node, delay = self.next_client(nodes, grid, arrays, config, work)
            if node is None:
                return
            self.send(self.new_task(node, version, config, work, arrays, delay), arrays)

    def next_client(self, nodes: list[int], grid: Grid, arrays: ArrayRecord,
                    config: ConfigRecord, work: ClientWork) -> tuple[int | None, float]:
        """The client of the next task and the simulated seconds its selection's loss query
        took (Power-of-Choice; 0 otherwise): one draw of the selection policy among the online
        idle ``nodes`` (online: :func:`strategies.engine.devices.online_mask` at the simulated time),
        the task number as its round (an informed policy's section goes to
        :attr:`selections`); (None, 0) when every client trains. While nobody is online and
        nothing trains the simulated time moves on to the next availability window (or by
        ``IDLE_STEP``)."""
        p = self.participation
        busy = {task.node_id for task in self.in_flight.values()}
        idle = [n for n in nodes if n not in busy]
        for attempt in range(MAX_IDLE_DRAWS):
            online = self.online(idle, attempt)
            if online:  # less the clients whose last task was lost (while others are online)
                online, _ = p.without_silent(self.async_round(self.next_number), online, 1)
                picks, section = p.select_among(self.next_number + 1, grid, online, 1, None,
                                                arrays, config, work)
                if section is not None:
                    self.selections.append(section)
                return online[min(picks)], (section.query_seconds or 0.0) if section else 0.0
            if self.in_flight or not idle:
                return None, 0.0
            timer = p.timer
            wait = devices.wait_for_window([timer.clock.profile(p.partition_of(n))
                                            for n in idle], self.now)
            self.now += wait if wait > 0 else IDLE_STEP
        raise RuntimeError(f"{self.owner}: none of {len(idle)} idle clients came online in "
                           f"{MAX_IDLE_DRAWS} availability draws; check the device profiles' "
                           f"availability and windows")

    def async_round(self, number: int) -> int:
        """Task ``number``'s "round" for :class:`strategies.engine.silent_clients.SilentClients`:
        ``concurrency`` tasks make one (a lost task's client sits out the next
        ``concurrency`` draws, then twice as many, ...)."""
        return number // self.concurrency + 1

    def online(self, idle: list[int], attempt: int) -> list[int]:
        """The ``idle`` nodes online at the simulated time (all of them without a clock)."""
        timer = self.participation.timer
        if timer is None:
            return idle
        pids = [self.participation.partition_of(n) for n in idle]
        profiles = [timer.clock.profile(pid) for pid in pids]
        draw = self.next_number * MAX_IDLE_DRAWS + attempt
        mask = devices.online_mask(profiles, pids, timer.seed, draw, self.now)
        return [n for n, up in zip(idle, mask) if up]

    def new_task(self, node: int, version: int, config: ConfigRecord, work: ClientWork,
                 arrays: ArrayRecord, delay: float = 0.0) -> AsyncTask:
        """Task number ``next_number`` for ``node``: ``config`` with ``async-task`` = the
        task number, completing ``delay`` (its selection's loss query) + t_i (eq. 1) after
        now, or + f t_i if its client drops out at fraction f (module docstring)."""
        number = self.next_number
        self.next_number += 1
        own = ConfigRecord(dict(config))
        own[C.ASYNC_TASK] = number + 1
        done_at, fraction = float(number), None
        timer = self.participation.timer
        if timer is not None:
            down, up = work.expected_bytes(arrays)
            pid = self.participation.partition_of(node)
            fraction = timer.dropout_point(pid, draw=number + 1)
            done_at = self.now + delay + (1.0 if fraction is None else fraction) * \
                timer.client_seconds(pid, work.full_local_steps(node, own),
                                     work.examples_per_step(node, own), down, up,
                                     work.extra_examples(node, own), draw=number + 1)
        return AsyncTask(number, node, self.participation.info(node).partition_id, version,
                         own, self.now, done_at, dropped_out=fraction is not None)

    def send(self, task: AsyncTask, arrays: ArrayRecord) -> None:
        """Push ``task`` with ``arrays`` (model version ``task.version``)."""
        self.versions.setdefault(task.version, arrays)
        message = Message(RecordDict({C.ARRAYS: arrays, C.CONFIG: task.config}),
                          message_type=MessageType.TRAIN, dst_node_id=task.node_id)
        self.in_flight[task.number] = task
        refused = self.loop.push([message], [task.number])
        if refused:
            # the link did not take it: the client is not training; try it again next fill
            del self.in_flight[task.number]
            log(WARNING, "%s: the link refused task %d for node %d", self.owner,
                task.number + 1, task.node_id)
            return
        self.sent += 1
        self.bytes_down += arrays.count_bytes()

    def resend(self, grid: Grid) -> None:
        """Send the tasks restored from a checkpoint again, each to the node that now
        serves its partition (same config, same model version: the same reply)."""
        if not self.to_resend:
            return
        p = self.participation
        by_partition = {p.info(n).partition_id: n for n in p.connected(grid)}
        for task in self.to_resend:
            node = by_partition.get(task.partition_id)
            if node is None or task.version not in self.versions:
                log(WARNING, "%s: in-flight task %d of partition %s cannot be sent again (no "
                    "node serves it now); its client is free", self.owner, task.number + 1,
                    task.partition_id)
                continue
            self.send(AsyncTask(task.number, node, task.partition_id, task.version,
                                task.config, task.sent_at, task.done_at, task.dropped_out),
                      self.versions[task.version])
        log(INFO, "%s: %d in-flight task(s) of the checkpoint sent again", self.owner,
            len(self.to_resend))
        self.to_resend = []

    def forget_unused_versions(self) -> None:
        """Drop the model versions no in-flight task started from."""
        used = {task.version for task in self.in_flight.values()}
        used.update(task.version for task in self.to_resend)
        for version in [v for v in self.versions if v not in used]:
            del self.versions[version]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """In-flight tasks (by partition id: node ids change between runs), the model
        versions they started from, the task counter and the simulated time."""
        tasks = [*self.to_resend, *self.in_flight.values()]
        if any(t.partition_id is None for t in tasks):
            log(WARNING, "%s: in-flight tasks of nodes without a partition id cannot be sent "
                "again on resume (turn the client-info query on)", self.owner)
        return {
            "async-state-version": STATE_VERSION,
            "next-number": self.next_number,
            "now": self.now,
            "tasks": [{"number": t.number, "partition-id": t.partition_id,
                       "version": t.version, "config": dict(t.config),
                       "sent-at": t.sent_at, "done-at": t.done_at,
                       "dropped-out": t.dropped_out}
                      for t in sorted(tasks, key=lambda t: t.number)
                      if t.partition_id is not None],
            "versions": {int(v): {k: np.array(a.numpy(), copy=True) for k, a in arrays.items()}
                         for v, arrays in self.versions.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; the tasks are sent again at the next :meth:`run`."""
        if state.get("async-state-version") != STATE_VERSION:
            raise ValueError(f"{self.owner}: the checkpoint's asynchronous state has version "
                             f"{state.get('async-state-version')!r}, not {STATE_VERSION}")
        self.next_number = int(state["next-number"])
        self.now = float(state["now"])
        self.versions = {int(v): records.to_record(arrays)
                         for v, arrays in state["versions"].items()}
        for t in state["tasks"]:
            if not isinstance(t.get("dropped-out", False), bool):
                raise ValueError(f"{self.owner}: the checkpoint's in-flight task "
                                 f"{t.get('number')!r} has dropped-out = "
                                 f"{t['dropped-out']!r}, not true or false; start the run afresh")
        self.to_resend = [AsyncTask(int(t["number"]), -1, int(t["partition-id"]),
                                    int(t["version"]), ConfigRecord(dict(t["config"])),
                                    float(t["sent-at"]), float(t["done-at"]),
                                    t.get("dropped-out", False))
                          for t in state["tasks"]]
        self.in_flight, self.loop = {}, None

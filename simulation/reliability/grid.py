"""A fast in-process Grid for fault-injection runs: the ServerApp calls the ClientApp directly.

Like Flower's simulation engine it keeps one :class:`Context` per node (node config
``partition-id`` / ``num-partitions``, ``state`` across rounds) and turns an exception
in the ClientApp into an error reply. Time is virtual: during each ClientApp call the
Grid installs a :class:`VirtualClock` as the fault sleeper
(:func:`fedapp.faults.use_sleeper`), so a "late" client advances the clock instead of
sleeping, and a reply whose virtual time exceeds the timeout of ``send_and_receive``
never arrives, as on a real link where the server stopped waiting. Both Grid styles
are served: ``send_and_receive`` (the FedAvg family) and ``push_messages`` /
``pull_messages`` (DynamicFL; a late reply stays pending until the strategy's own
deadline passes). Replies come back in message order, so a run is reproducible.

``kill_after_round=r`` raises :class:`SimulatedKill` when a train message of round
r + 1 is sent: the server process "dies" after round r, for resume tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from fedapp import faults
from strategies import contract as C


class SimulatedKill(BaseException):
    """The server was 'killed' (BaseException: no strategy code catches it)."""


class VirtualClock:
    """Seconds a ClientApp call 'slept'; its ``sleep`` is the fault sleeper."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def sleep(self, seconds: float) -> None:
        """Advance the clock instead of sleeping."""
        self.seconds += seconds


class FaultGrid(Grid):
    """In-process Grid with virtual time (late replies are lost) and an optional kill."""

    def __init__(self, client_app, num_nodes: int, run_config: dict, *,
                 node_ids: list[int] | None = None, kill_after_round: int | None = None,
                 reply_hook=None) -> None:
        self.client_app = client_app
        self.node_ids = node_ids or [1000 + 7919 * i for i in range(num_nodes)]
        self.contexts = {
            node: Context(run_id=1, node_id=node,
                          node_config={"partition-id": i, "num-partitions": num_nodes},
                          state=RecordDict(), run_config=dict(run_config))
            for i, node in enumerate(self.node_ids)
        }
        self.kill_after_round = kill_after_round
        self.reply_hook = reply_hook  # (message, reply, context) -> reply: e.g. corrupt replies
        self.calls: list[tuple[int, str]] = []
        self.late: list[tuple[int, int]] = []  # (node, round) of replies after the timeout
        self.pending: dict[str, Message] = {}
        self._next_id = 0
        TaskIdentity.run_id = 1
        TaskIdentity.node_id = 0
        TaskIdentity.task_id = 1

    # Grid's abstract interface --------------------------------------------------
    def set_run(self, run) -> None:  # pragma: no cover - not used in-process
        pass

    @property
    def run(self):  # pragma: no cover
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content=content, message_type=message_type, dst_node_id=dst_node_id,
                       group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    # one ClientApp call -------------------------------------------------------
    def deliver(self, msg: Message, timeout: float | None = None) -> Message | None:
        """The reply, or None when it would arrive after ``timeout`` (virtual seconds)."""
        node = msg.metadata.dst_node_id
        kind = msg.metadata.message_type
        config = config_of(msg)
        server_round = int(config.get(C.SERVER_ROUND, 0))
        killed = self.kill_after_round is not None and server_round > self.kill_after_round
        if kind == "train" and killed:
            raise SimulatedKill(f"server killed during round {server_round}")
        self.calls.append((node, kind))
        clock = VirtualClock()
        with faults.use_sleeper(clock.sleep):
            try:
                reply = self.client_app(msg, self.contexts[node])
            except Exception as exc:  # noqa: BLE001 - a failing ClientApp becomes an error reply
                reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
        if timeout is not None and clock.seconds > timeout:
            self.late.append((node, server_round))
            return None
        if self.reply_hook is not None:
            reply = self.reply_hook(msg, reply, self.contexts[node])
        return reply

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        replies = [self.deliver(msg, timeout) for msg in messages]
        return [r for r in replies if r is not None]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            self._next_id += 1
            # no public setter: Flower's own InMemoryGrid sets the id the same way
            msg.metadata.__dict__["_message_id"] = f"m{self._next_id:08d}"
            self.pending[msg.metadata.message_id] = msg
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Runs the asked-for pending messages now; a late one never answers (its sender's
        deadline decides), as the virtual reply time is past any round timeout."""
        replies = []
        for message_id in sorted(i for i in message_ids if i in self.pending):
            msg = self.pending.pop(message_id)
            reply = self.deliver(msg, timeout=faults_timeout(msg))
            if reply is not None:
                replies.append(reply)
        return replies


def config_of(msg: Message):
    """The message's ConfigRecord; of a packed message (strategies.engine.packing), its first
    virtual client's."""
    for name in (C.CONFIG, f"{C.PACKED_CONTENT}0:{C.CONFIG}"):
        if name in msg.content:
            return msg.content[name]
    return {}


def faults_timeout(msg: Message) -> float | None:
    """The push/pull path has no timeout argument: a late fault sleeps round-timeout + margin,
    so any positive sleep beyond the margin marks it late."""
    del msg
    return faults.LATE_MARGIN / 2


def run_inprocess(
    run_config: dict, num_nodes: int = 3, *, client_app=None, run_id: int = 7, **grid_kwargs
):
    """Run the ServerApp against ``num_nodes`` in-process ClientApps; returns (grid, run
    directory): the directory this run created under ``run_config['output-dir']`` (an
    absolute folder; runs already there are left as they are)."""
    from fedapp.client_app import app as default_client_app  # noqa: PLC0415
    from fedapp.server_app import app as server_app  # noqa: PLC0415

    grid = FaultGrid(client_app or default_client_app, num_nodes, run_config, **grid_kwargs)
    context = Context(
        run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=dict(run_config)
    )
    out = Path(run_config["output-dir"])
    before = set(out.iterdir()) if out.is_dir() else set()
    try:
        server_app(grid, context)
    finally:
        runs = sorted(set(out.iterdir()) - before, key=lambda p: p.stat().st_mtime_ns) \
            if out.is_dir() else []
        grid.run_dir = runs[-1] if runs else None
    return grid, grid.run_dir

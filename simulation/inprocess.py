"""A fast in-process Grid for fault-injection runs: the ServerApp calls the ClientApp directly.

Like Flower's simulation engine it keeps one :class:`Context` per node (node config
``partition-id`` / ``num-partitions``, ``state`` across rounds) and turns an exception
in the ClientApp into an error reply. Time is virtual: the ClientApp's
:func:`fedapp.faults.sleep` (a "late" client) advances a per-call clock instead of
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

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from fedapp import faults
from strategies import contract as C


class SimulatedKill(BaseException):
    """The server was 'killed' (BaseException: no strategy code catches it)."""


class FaultGrid(Grid):
    """In-process Grid with virtual time (late replies are lost) and an optional kill."""

    def __init__(self, client_app, num_nodes: int, run_config: dict, *, node_ids: list[int] | None = None,
                 kill_after_round: int | None = None, reply_hook=None) -> None:
        self.client_app = client_app
        self.node_ids = node_ids or [1000 + 7919 * i for i in range(num_nodes)]
        self.contexts = {
            node: Context(run_id=1, node_id=node, node_config={"partition-id": i, "num-partitions": num_nodes},
                          state=RecordDict(), run_config=dict(run_config))
            for i, node in enumerate(self.node_ids)
        }
        self.kill_after_round = kill_after_round
        self.reply_hook = reply_hook  # (message, reply, context) -> reply: e.g. corrupt replies
        self.calls: list[tuple[int, str]] = []
        self.late: list[tuple[int, int]] = []  # (node, round) of replies that came after the timeout
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
        return Message(content=content, message_type=message_type, dst_node_id=dst_node_id, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    # one ClientApp call -------------------------------------------------------
    def _call(self, msg: Message, timeout: float | None) -> Message | None:
        """The reply, or None when it would arrive after ``timeout`` (virtual seconds)."""
        node = msg.metadata.dst_node_id
        kind = msg.metadata.message_type
        server_round = int(msg.content[C.CONFIG].get(C.SERVER_ROUND, 0)) if C.CONFIG in msg.content else 0
        if kind == "train" and self.kill_after_round is not None and server_round > self.kill_after_round:
            raise SimulatedKill(f"server killed during round {server_round}")
        self.calls.append((node, kind))
        clock = [0.0]
        real_sleep = faults.sleep
        faults.sleep = lambda seconds: clock.__setitem__(0, clock[0] + seconds)
        try:
            reply = self.client_app(msg, self.contexts[node])
        except Exception as exc:  # noqa: BLE001 - a failing ClientApp becomes an error reply
            reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
        finally:
            faults.sleep = real_sleep
        if timeout is not None and clock[0] > timeout:
            self.late.append((node, server_round))
            return None
        if self.reply_hook is not None:
            reply = self.reply_hook(msg, reply, self.contexts[node])
        return reply

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        replies = [self._call(msg, timeout) for msg in messages]
        return [r for r in replies if r is not None]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            self._next_id += 1
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
            reply = self._call(msg, timeout=faults_timeout(msg))
            if reply is not None:
                replies.append(reply)
        return replies


def faults_timeout(msg: Message) -> float | None:
    """The push/pull path has no timeout argument: a late fault sleeps round-timeout + margin,
    so any positive sleep beyond the margin marks it late."""
    del msg
    return faults.LATE_MARGIN / 2


def run_inprocess(run_config: dict, num_nodes: int = 3, *, client_app=None, run_id: int = 7, **grid_kwargs):
    """Run the ServerApp against ``num_nodes`` in-process ClientApps; returns (grid, run directory).

    ``run_config['output-dir']`` must be a fresh absolute folder (its single run directory
    is returned).
    """
    from pathlib import Path  # noqa: PLC0415

    from fedapp.client_app import app as default_client_app  # noqa: PLC0415
    from fedapp.server_app import app as server_app  # noqa: PLC0415

    grid = FaultGrid(client_app or default_client_app, num_nodes, run_config, **grid_kwargs)
    context = Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=dict(run_config))
    try:
        server_app(grid, context)
    finally:
        out = Path(run_config["output-dir"])
        runs = sorted(out.iterdir()) if out.is_dir() else []
        grid.run_dir = runs[-1] if runs else None
    return grid, grid.run_dir


# ----------------------------------------------------------------- malformed replies
def _replace(reply: Message, msg: Message, *, arrays=None, metrics=None, drop: tuple[str, ...] = ()) -> Message:
    """A copy of ``reply`` (same records) with some records replaced or dropped."""
    from flwr.app import ArrayRecord, MetricRecord  # noqa: PLC0415

    content = RecordDict()
    for name, rec in reply.content.items():
        if name in drop:
            continue
        if name == C.ARRAYS and arrays is not None:
            rec = ArrayRecord(arrays)
        elif name == C.METRICS and metrics is not None:
            rec = MetricRecord(metrics)
        content[name] = rec
    return Message(content, reply_to=msg)


def _arrays(reply: Message) -> dict:
    return {k: v.numpy().copy() for k, v in reply.content[C.ARRAYS].items()}


def _metrics(reply: Message) -> dict:
    return dict(reply.content[C.METRICS].items())


def _poison(reply, msg, value):
    arrays = _arrays(reply)
    key = next(k for k, v in arrays.items() if v.dtype.kind == "f")
    arrays[key].flat[0] = value
    return _replace(reply, msg, arrays={k: _np_array(v) for k, v in arrays.items()})


def _np_array(value):
    from flwr.app import Array  # noqa: PLC0415
    return Array(value)


def _with_metric(reply, msg, key, value=None, remove=False):
    metrics = _metrics(reply)
    if remove:
        metrics.pop(key, None)
    else:
        metrics[key] = value
    return _replace(reply, msg, metrics=metrics)


def _rekey(reply, msg, how):
    arrays = _arrays(reply)
    first = next(iter(arrays))
    if how == "wrong-key":
        arrays = {("renamed." + k if k == first else k): v for k, v in arrays.items()}
    elif how == "extra-key":
        arrays["unexpected"] = arrays[first][:1].copy()
    elif how == "wrong-shape":
        arrays[first] = arrays[first].reshape(-1)[:-1].copy()
    elif how == "wrong-dtype":
        arrays[first] = arrays[first].astype("float64")
    return _replace(reply, msg, arrays={k: _np_array(v) for k, v in arrays.items()})


def _strip_strategy_metrics(reply, msg):
    metrics = {k: v for k, v in _metrics(reply).items() if k not in (C.LOCAL_STEPS_TAKEN, C.BETA, C.DELTA)}
    return _replace(reply, msg, metrics=metrics, drop=(C.GRAD,))


CORRUPTIONS = {
    "num-examples-missing": lambda r, m: _with_metric(r, m, C.NUM_EXAMPLES, remove=True),
    "num-examples-zero": lambda r, m: _with_metric(r, m, C.NUM_EXAMPLES, 0),
    "num-examples-negative": lambda r, m: _with_metric(r, m, C.NUM_EXAMPLES, -5),
    "num-examples-fraction": lambda r, m: _with_metric(r, m, C.NUM_EXAMPLES, 2.5),
    "nan-array": lambda r, m: _poison(r, m, float("nan")),
    "inf-array": lambda r, m: _poison(r, m, float("inf")),
    "nan-metric": lambda r, m: _with_metric(r, m, C.TRAIN_LOSS, float("nan")),
    "inf-metric": lambda r, m: _with_metric(r, m, C.TRAIN_LOSS, float("inf")),
    "wrong-key": lambda r, m: _rekey(r, m, "wrong-key"),
    "extra-key": lambda r, m: _rekey(r, m, "extra-key"),
    "wrong-shape": lambda r, m: _rekey(r, m, "wrong-shape"),
    "wrong-dtype": lambda r, m: _rekey(r, m, "wrong-dtype"),
    "no-arrays": lambda r, m: _replace(r, m, drop=(C.ARRAYS,)),
    "strategy-metrics-missing": _strip_strategy_metrics,  # local-steps, beta, delta, grad (FedVeca needs them)
}


def corrupting_hook(kind: str, partition_id: int, rounds: set[int] | None = None, first_only: bool = False):
    """A FaultGrid ``reply_hook`` that applies ``CORRUPTIONS[kind]`` to the train replies of one
    partition (in ``rounds``, all if None; ``first_only``: only its first reply per round)."""
    seen: set[int] = set()

    def hook(msg: Message, reply: Message, context: Context) -> Message:
        if msg.metadata.message_type != "train" or reply.has_error():
            return reply
        if int(context.node_config["partition-id"]) != partition_id:
            return reply
        server_round = int(msg.content[C.CONFIG].get(C.SERVER_ROUND, 0))
        if rounds is not None and server_round not in rounds:
            return reply
        if first_only and server_round in seen:
            return reply
        seen.add(server_round)
        return CORRUPTIONS[kind](reply, msg)

    return hook

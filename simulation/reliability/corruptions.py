"""Malformed train replies for the reliability tests and table: :data:`CORRUPTIONS` maps
a kind (missing or bad ``num-examples``, NaN/Inf arrays or metrics, wrong keys, shapes,
dtypes, missing records) to a function (reply, message) -> corrupted reply.
:data:`STRATEGY_KINDS` names the kinds that only mean something to one strategy (FedVeca's
metrics, SCAFFOLD's delta c_i, the client-state echo of SCAFFOLD, FedDyn and MOON);
:func:`kinds_for` is what a strategy's replies are put through."""

from __future__ import annotations

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from strategies import contract as C


def _replace(
    reply: Message, msg: Message, *, arrays=None, metrics=None, drop: tuple[str, ...] = ()
) -> Message:
    """A copy of ``reply`` (same records) with some records replaced or dropped."""
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
    metrics = {
        k: v for k, v in _metrics(reply).items() if k not in (C.LOCAL_STEPS_TAKEN, C.BETA, C.DELTA)
    }
    return _replace(reply, msg, metrics=metrics, drop=(C.GRAD,))


def _delta_c(reply, msg, how):
    if C.SCAFFOLD_DELTA_C not in reply.content:
        return reply
    delta = {k: v.numpy().copy() for k, v in reply.content[C.SCAFFOLD_DELTA_C].items()}
    first = next(iter(delta))
    if how == "missing":
        return _replace(reply, msg, drop=(C.SCAFFOLD_DELTA_C,))
    if how == "nan":
        delta[first].flat[0] = float("nan")
    elif how == "wrong-shape":
        delta[first] = delta[first].reshape(-1)[:-1].copy()
    content = RecordDict(dict(reply.content.items()))
    content[C.SCAFFOLD_DELTA_C] = ArrayRecord({k: _np_array(v) for k, v in delta.items()})
    return Message(content, reply_to=msg)


def _without_state_echo(reply, msg):
    if C.STATE_DIGEST not in _metrics(reply):
        return reply
    metrics = {k: v for k, v in _metrics(reply).items()
               if k not in (C.STATE_ROUND_USED, C.STATE_DIGEST)}
    return _replace(reply, msg, metrics=metrics)


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
    # local-steps, beta, delta, grad (FedVeca needs them)
    "strategy-metrics-missing": _strip_strategy_metrics,
    # SCAFFOLD: delta c_i missing, NaN, mis-shaped; a client that started from another state
    # than the server's copy (SCAFFOLD's c_i, FedDyn's linear term, MOON's previous model)
    "scaffold-delta-c-missing": lambda r, m: _delta_c(r, m, "missing"),
    "scaffold-delta-c-nan": lambda r, m: _delta_c(r, m, "nan"),
    "scaffold-delta-c-wrong-shape": lambda r, m: _delta_c(r, m, "wrong-shape"),
    "client-state-round-wrong": lambda r, m: (
        _with_metric(r, m, C.STATE_ROUND_USED, 99) if C.STATE_DIGEST in _metrics(r) else r),
    # FedDyn, MOON: a reply without the state-round / state-digest echo (a stock client's)
    "client-state-echo-missing": _without_state_echo,
}

# kinds that only corrupt one strategy's replies (the others pass them unchanged)
STRATEGY_KINDS: dict[str, tuple[str, ...]] = {
    "fedveca": ("strategy-metrics-missing",),
    "scaffold": ("scaffold-delta-c-missing", "scaffold-delta-c-nan",
                 "scaffold-delta-c-wrong-shape", "client-state-round-wrong"),
    "feddyn": ("client-state-round-wrong", "client-state-echo-missing"),
    "moon": ("client-state-round-wrong", "client-state-echo-missing"),
}
GENERIC_KINDS = tuple(sorted(set(CORRUPTIONS) - {k for ks in STRATEGY_KINDS.values()
                                                  for k in ks}))


def kinds_for(strategy: str | None) -> list[str]:
    """The corruption kinds a strategy's replies are put through: the generic ones, then
    its own."""
    return [*GENERIC_KINDS, *STRATEGY_KINDS.get(strategy or "", ())]


def corrupting_hook(
    kind: str, partition_id: int, rounds: set[int] | None = None, first_only: bool = False
):
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


def malformed_hook(num_nodes: int, strategy: str | None = None):
    """A FaultGrid ``reply_hook``: in round t, partition (t mod N) sends the (t mod K)-th
    kind of malformed reply (the K kinds of :func:`kinds_for` ``strategy``)."""
    kinds = kinds_for(strategy)
    seen = set()

    def hook(msg: Message, reply: Message, context: Context) -> Message:
        if msg.metadata.message_type != "train" or reply.has_error():
            return reply
        t = int(msg.content[C.CONFIG][C.SERVER_ROUND])
        if context.node_config["partition-id"] != t % num_nodes or t in seen:
            return reply
        seen.add(t)
        return CORRUPTIONS[kinds[t % len(kinds)]](reply, msg)

    return hook

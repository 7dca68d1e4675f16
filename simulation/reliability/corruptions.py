"""Malformed train replies for the reliability tests, the faults table and the trust-gate
matrix: :data:`CORRUPTIONS` maps a kind (missing or bad ``num-examples``, NaN/Inf arrays
or metrics, wrong keys, shapes, dtypes, missing records, and crafted ``.npy`` payloads
whose bytes disagree with their declared shape and dtype: :data:`PAYLOAD_KINDS`) to a
function (reply, message) -> corrupted reply. :data:`STRATEGY_KINDS` names the kinds that
only mean something to one strategy (FedVeca's metrics and gradient, SCAFFOLD's delta c_i,
the client-state echo of SCAFFOLD, FedDyn and MOON); :func:`kinds_for` is what a
strategy's replies are put through by the reliability suites (the classes they always
had); :data:`GATE_KINDS` adds the trust gate's classes."""

from __future__ import annotations

import io

import numpy as np
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


# ------------------------------------------------------------------ crafted .npy payloads
def _npy(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=False)
    return buffer.getvalue()


def _header(descr: str, shape: tuple, pad_to: int = 0) -> bytes:
    """An .npy 1.0 header for ``descr`` / ``shape``, padded with spaces to ``pad_to`` bytes."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    body = text.ljust(max(pad_to, len(text) + 1) - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body.encode("latin1")


def _payload(how: str, value: np.ndarray) -> Array:
    """An Array that declares ``value``'s dtype and shape but carries crafted bytes."""
    dtype, shape = str(value.dtype), tuple(value.shape)
    good = _npy(value)
    stype = "numpy.ndarray"
    if how == "other-bytes":  # another array's bytes: the layer plus one element, 1-D
        data = _npy(np.concatenate([value.reshape(-1), value.reshape(-1)[:1]]))
    elif how == "one-element":  # broadcast silently into the layer before the gate
        data = _npy(value.reshape(-1)[:1].copy())
    elif how == "truncated":
        data = good[:-4]
    elif how == "trailing-bytes":
        data = good + b"\0\0\0\0"
    elif how == "wrong-stype":
        data, stype = good, "torch.Tensor"
    elif how == "bad-magic":
        data = b"\x93NUMPZ" + good[6:]
    elif how == "long-header":  # a valid header padded to 60,000 bytes
        data = _header(value.dtype.str, shape, pad_to=60_000) + value.tobytes()
    elif how == "object-dtype":  # a pickle header: Flower's np.load would refuse, numpy views
        data = _header("|O", shape) + b"\0" * (8 * value.size)
    elif how == "dtype-mismatch":  # float64 bytes under a float32 declaration
        data = _npy(value.astype(np.float64))
    elif how == "shape-mismatch":  # the same byte count, flattened
        data = _npy(np.ascontiguousarray(value.reshape(-1)))
    else:
        raise ValueError(f"unknown payload corruption {how!r}")
    return Array(dtype=dtype, shape=shape, stype=stype, data=data)


PAYLOADS = ("other-bytes", "one-element", "truncated", "trailing-bytes", "wrong-stype",
            "bad-magic", "long-header", "object-dtype", "dtype-mismatch", "shape-mismatch")


def _target_key(record: ArrayRecord) -> str:
    """The array a payload corruption replaces: the second floating array (not the first
    in order: the broadcast of a 1-element payload went unnoticed there), else the first."""
    floating = [k for k, a in record.items() if np.dtype(a.dtype).kind == "f"
                and len(a.shape) >= (2 if len(a.shape) else 0)]
    floating = floating or [k for k, a in record.items() if np.dtype(a.dtype).kind == "f"]
    return floating[1] if len(floating) > 1 else floating[0]


def _craft(reply: Message, msg: Message, how: str, name: str = C.ARRAYS) -> Message:
    """``reply`` with one array of ArrayRecord ``name`` replaced by a crafted payload."""
    if name not in reply.content.array_records:
        return reply
    record = reply.content[name]
    key = _target_key(record)
    arrays = dict(record.items())
    arrays[key] = _payload(how, record[key].numpy())
    content = RecordDict(dict(reply.content.items()))
    content[name] = ArrayRecord(arrays)
    return Message(content, reply_to=msg)


def _scale(reply: Message, msg: Message, name: str, value: float) -> Message:
    """``reply`` with every element of one floating array of record ``name`` set to
    ``value`` (a huge finite value: finite, but its square overflows float32)."""
    if name not in reply.content.array_records:
        return reply
    record = reply.content[name]
    key = _target_key(record)
    arrays = {k: a for k, a in record.items()}
    arrays[key] = Array(np.full(tuple(record[key].shape), value, dtype=record[key].dtype))
    content = RecordDict(dict(reply.content.items()))
    content[name] = ArrayRecord(arrays)
    return Message(content, reply_to=msg)


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

# the trust gate's classes (strategies/engine/trust_gate.py; docs/reliability.md)
GATE_CORRUPTIONS = {
    **{f"npy-{how}": (lambda r, m, how=how: _craft(r, m, how)) for how in PAYLOADS},
    "huge-finite-array": lambda r, m: _scale(r, m, C.ARRAYS, 1e30),
    "num-examples-float-huge": lambda r, m: _with_metric(r, m, C.NUM_EXAMPLES, 1e300),
    "num-examples-huge": lambda r, m: _with_metric(r, m, C.NUM_EXAMPLES, 10**12),
    "local-steps-huge": lambda r, m: _with_metric(r, m, C.LOCAL_STEPS_TAKEN, 10**12),
    "local-steps-zero": lambda r, m: _with_metric(r, m, C.LOCAL_STEPS_TAKEN, 0),
    "local-steps-fraction": lambda r, m: _with_metric(r, m, C.LOCAL_STEPS_TAKEN, 1.5),
    "a-norm-huge": lambda r, m: _with_metric(r, m, C.A_NORM, 1e12),
    "a-norm-zero": lambda r, m: _with_metric(r, m, C.A_NORM, 0.0),
    "metrics-missing": lambda r, m: _replace(r, m, drop=(C.METRICS,)),
    # SCAFFOLD: delta c_i = 1e30 (finite: the norm bound), a 1-element or truncated payload
    "scaffold-delta-c-huge": lambda r, m: _scale(r, m, C.SCAFFOLD_DELTA_C, 1e30),
    # finite and of a plausible norm for an array, far beyond what option II gives this reply
    "scaffold-delta-c-inflated": lambda r, m: _scale(r, m, C.SCAFFOLD_DELTA_C, 1e4),
    "scaffold-delta-c-one-element": lambda r, m: _craft(r, m, "one-element",
                                                         C.SCAFFOLD_DELTA_C),
    "scaffold-delta-c-truncated": lambda r, m: _craft(r, m, "truncated", C.SCAFFOLD_DELTA_C),
    # FedVeca: grad F_i as a 1-element or truncated payload, NaN, or 3e38 (finite float32
    # whose num-examples-weighted sum overflows: the recursion of global_gradient)
    "grad-one-element": lambda r, m: _craft(r, m, "one-element", C.GRAD),
    "grad-truncated": lambda r, m: _craft(r, m, "truncated", C.GRAD),
    "grad-nan": lambda r, m: _scale(r, m, C.GRAD, float("nan")),
    "grad-overflow": lambda r, m: _scale(r, m, C.GRAD, 3e38),
    "beta-negative": lambda r, m: (_with_metric(r, m, C.BETA, -1.0)
                                   if C.BETA in _metrics(r) else r),
    # SCAFFOLD, FedDyn, MOON: the client-state echo as a float (Flower's MetricRecord has no
    # bool: a bool never arrives; 1.0 == 1 passed the old check)
    "client-state-round-float": lambda r, m: (
        _with_metric(r, m, C.STATE_ROUND_USED, float(_metrics(r)[C.STATE_ROUND_USED]))
        if C.STATE_DIGEST in _metrics(r) else r),
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
CORRUPTIONS.update(GATE_CORRUPTIONS)  # after GENERIC_KINDS: the reliability suites' classes


# the trust gate's classes: every strategy's replies, then the strategies' own ones
GATE_KINDS: tuple[str, ...] = tuple(k for k in GATE_CORRUPTIONS if not k.startswith(
    ("scaffold-", "grad-", "beta-", "client-state-")))
GATE_STRATEGY_KINDS: dict[str, tuple[str, ...]] = {
    "fedveca": ("grad-one-element", "grad-truncated", "grad-nan", "grad-overflow",
                "beta-negative"),
    "scaffold": ("scaffold-delta-c-huge", "scaffold-delta-c-inflated",
                 "scaffold-delta-c-one-element",
                 "scaffold-delta-c-truncated", "client-state-round-float"),
    "feddyn": ("client-state-round-float",),
    "moon": ("client-state-round-float",),
}


# Flower's FedOpt classes send float64 from round 2 on (their update is float64) while the
# clients answer float32, so behind the gate any floating dtype is accepted where a floating
# one was sent (strategies.algorithms.flower_optimizers): a float64 reply is not malformed for them
FLOWER_STRATEGIES = ("fedavgm", "fedadam", "fedyogi", "fedadagrad")
NOT_MALFORMED_FOR_FLOWER = ("wrong-dtype",)


def gate_kinds_for(strategy: str) -> list[str]:
    """Every malformed-reply class the trust-gate matrix puts a strategy's replies through:
    the reliability classes (:func:`kinds_for`), the gate's generic ones, its own."""
    kinds = [*kinds_for(strategy), *GATE_KINDS, *GATE_STRATEGY_KINDS.get(strategy, ())]
    if strategy in FLOWER_STRATEGIES:
        kinds = [k for k in kinds if k not in NOT_MALFORMED_FOR_FLOWER]
    return kinds


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

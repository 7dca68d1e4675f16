"""The trust gate: every client reply is checked against what the server sent before any
math reads it. Pure functions and small typed results; flwr and numpy only.

A reply that fails costs only itself: the strategy leaves it out and logs one WARNING
naming the node, its partition (when known) and the field (:func:`refusal_line`). What
is checked (docs/reliability.md lists it with the attacks it stops):

* **Arrays** (:func:`read_array`, :func:`arrays_problem`): the real ``.npy`` bytes of every
  received ``Array``, not its declared ``shape`` / ``dtype``: stype numpy, the magic and
  version, a header of at most :data:`MAX_NPY_HEADER` bytes read by numpy's own reader,
  a dtype that is not ``object`` and equals the expected one, header shape == expected
  shape == declared shape, and exactly header + prod(shape) * itemsize bytes. The result
  is a read-only view of the reply's bytes (no copy). Floating arrays must have a finite
  L2 norm of at most :data:`MAX_NORM` (their float32 sum of squares does not overflow:
  NaN, Inf and the "huge finite" values that would overflow the aggregate are refused).
* **Scalars** (:func:`train_metrics_problem`): ``num-examples`` a positive integer, at
  most what the client reported to the client-info query (else :data:`MAX_NUM_EXAMPLES`);
  ``local-steps`` an integer in 1..the steps sent (:func:`steps_bound`); ``a-norm`` in
  (0, tau / (1 - rho)] (:func:`a_norm_bound`, Wang et al. 2020); every metric finite.
* **Client-info query replies** (:func:`client_facts`, :func:`facts_conflict`): partition id
  an integer in [0, :data:`MAX_PARTITION_ID`] and unique among the connected nodes,
  num-examples in 1..:data:`MAX_NUM_EXAMPLES`, label counts non-negative integers of one
  length for all nodes, comm-budget finite > 0.
* **Node identity** (with a partition map, :mod:`strategies.engine.node_identity`): the partition
  id a node claims must be the one its registered public key may serve
  (:func:`strategies.engine.records.enter_clients`); a node refused so is never selected and its
  evaluate replies are refused.
* **Evaluate replies** (:func:`aggregate_evaluate`): Flower's weighted mean of the metrics
  over the replies that pass the same scalar checks.
* **Adopted state** (:func:`non_finite_key`, :func:`finite_or_previous`): a new global
  model, server momentum, SCAFFOLD's c or FedDyn's h with NaN / Inf is not adopted.
"""

from __future__ import annotations

import functools
import io
import math
import numbers
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SType
from flwr.common.logger import log

from .. import contract as C
from . import flower_args

# ------------------------------------------------------------------ documented caps
MAX_NPY_HEADER = 4096
"""Bytes of an ``.npy`` header (after magic, version and length). ``np.save`` pads its
header to a multiple of 64 bytes; for a numeric dtype and up to 64 dimensions of 20
digits each it stays below 1,500 bytes. A longer header is not one numpy wrote."""

MAX_NORM = float(np.sqrt(np.finfo(np.float32).max))
"""||v||_2 of a floating array may be at most sqrt(float32 max) ~ 1.84e19: above it the
float32 sum of squares (weight decay, drift diagnostics, FedVeca's ||grad F||^2) is Inf,
and a num-examples-weighted sum of such arrays overflows. No model that trained in
float32 without overflowing has such a layer."""

MAX_INTEGER_ARRAY = 2**53
"""|v| of an integer array (BatchNorm's ``num_batches_tracked``): averaged in float64,
which holds integers exactly up to 2^53."""

MAX_NUM_EXAMPLES = 1 << 22
"""4,194,304: the most examples one client may report (query or reply) when it reported
no size before. Above any single client's data in these experiments (all of ImageNet-1k's
train split is 1.28 M); it bounds DynamicFL's L of Eq. 4 and every num-examples weight."""

MAX_PARTITION_ID = (1 << 24) - 1
"""16,777,215: the largest partition id (they key client state, the tau table and the
simulated clock's device profiles); federations here have at most 10^4 clients."""

MAX_LABELS = 1 << 16
"""65,536: the longest label histogram a client may report."""

MAX_LOCAL_STEPS = 1 << 24
"""The most local steps a reply may report when the server sent no step count (no
``local-steps`` and no ``local-epochs`` in its config)."""


class Refused(ValueError):
    """A received value the gate refuses: ``field`` names it (quoted, e.g. ``'arrays' array
    'fc.weight'``), ``str()`` is the field and why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}")
        self.field = field


def array_label(name: str, key: str) -> str:
    """How a refusal names array ``key`` of ArrayRecord ``name``: 'arrays' array 'fc.weight'."""
    return f"'{name}' array '{key}'" if name else f"array '{key}'"


# ------------------------------------------------------------------ log lines
def partition_of(clients: Mapping[int, object], node: int) -> int | None:
    """The partition id a node reported (None when it reported none or was refused)."""
    return getattr(clients.get(node), "partition_id", None)


def refusal_line(what: str, node: int, partition: int | None, problem: str) -> str:
    """'Reply from node 7 (partition 2) rejected: ...': the one WARNING of a refused reply."""
    where = f" (partition {partition})" if partition is not None else ""
    return f"{what} from node {node}{where} rejected: {problem}"


def log_refused(what: str, node: int, partition: int | None, problem: str) -> None:
    """Log :func:`refusal_line` as one WARNING."""
    log(WARNING, "%s", refusal_line(what, node, partition, problem))


# ------------------------------------------------------------------ arrays
@dataclass(frozen=True)
class ArraySpec:
    """What an array must be: its shape and dtype (from the server's own record)."""

    shape: tuple[int, ...]
    dtype: np.dtype


def spec_of(value: object) -> ArraySpec:
    """The spec of a server-side array: a flwr ``Array``, a numpy array or an ArraySpec."""
    if isinstance(value, ArraySpec):
        return value
    return ArraySpec(tuple(int(d) for d in value.shape), np.dtype(value.dtype))


def specs_of(arrays: Mapping[str, object]) -> dict[str, ArraySpec]:
    """{key: spec} of a server-side record or dict of arrays."""
    return {key: spec_of(value) for key, value in arrays.items()}


@functools.lru_cache(maxsize=4096)
def _parse_header(prefix: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int] | str:
    """(shape, fortran order, dtype, data offset) of an ``.npy`` 1.0 / 2.0 header read by
    numpy's own reader, or what is wrong with it. Cached: a round's replies repeat the same
    few headers."""
    header = io.BytesIO(prefix)
    try:
        version = np.lib.format.read_magic(header)
    except ValueError:
        return "is not .npy data (bad magic)"
    reader = {(1, 0): np.lib.format.read_array_header_1_0,
              (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if reader is None:
        return f"has .npy version {version[0]}.{version[1]}, not 1.0 or 2.0"
    try:
        shape, fortran_order, dtype = reader(header, max_header_size=MAX_NPY_HEADER + 16)
    except (ValueError, SyntaxError, TypeError) as exc:
        return f"has an .npy header numpy cannot read ({str(exc).splitlines()[0][:120]})"
    return tuple(int(d) for d in shape), bool(fortran_order), dtype, header.tell()


def npy_view(data: bytes | bytearray | memoryview, field: str) -> np.ndarray:
    """The array an ``.npy`` payload holds, as a read-only view of ``data`` (no copy).

    Raises :class:`Refused` unless ``data`` is exactly one ``.npy`` 1.0 / 2.0 array: magic,
    version, a header of at most :data:`MAX_NPY_HEADER` bytes that numpy's reader accepts,
    a dtype without Python objects, and exactly header + prod(shape) * itemsize bytes.
    """
    size = len(data)
    if size < 10:
        raise Refused(field, f"has {size} bytes: too short for an .npy header (truncated)")
    if data[:6] != b"\x93NUMPY":
        raise Refused(field, "is not .npy data (bad magic)")
    major, minor = data[6], data[7]
    if minor != 0 or major not in (1, 2):
        raise Refused(field, f"has .npy version {major}.{minor}, not 1.0 or 2.0")
    start = 10 if major == 1 else 12
    if size < start:
        raise Refused(field, f"has {size} bytes: too short for an .npy header (truncated)")
    length = int.from_bytes(data[8:start], "little")
    if length > MAX_NPY_HEADER:
        raise Refused(field, f"has an .npy header of {length} bytes; at most {MAX_NPY_HEADER} "
                             f"are allowed (np.save writes < 1,500)")
    end = start + length
    if size < end:
        raise Refused(field, f"has {size} bytes, fewer than its {end}-byte .npy header "
                             f"(truncated)")
    parsed = _parse_header(bytes(data[:end]))
    if isinstance(parsed, str):
        raise Refused(field, parsed)
    shape, fortran_order, dtype, offset = parsed
    if dtype.hasobject:
        raise Refused(field, f"has dtype {dtype} (Python objects: a pickle), which is never "
                             f"accepted")
    count = math.prod(shape)
    expected_size = offset + count * dtype.itemsize
    if size != expected_size:
        kind = "truncated" if size < expected_size else "trailing bytes"
        raise Refused(field, f"has {size} bytes; its header {dtype}{shape} needs exactly "
                             f"{expected_size} ({kind})")
    view = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    if len(shape) != 1:
        view = view.reshape(shape, order="F" if fortran_order else "C")
    view.flags.writeable = False
    return view


@functools.lru_cache(maxsize=1024)
def _declared_dtype(name: object) -> np.dtype | None:
    """numpy's dtype of a declared dtype name, None if numpy has none (cached: a round's
    replies declare the same few)."""
    try:
        return np.dtype(name)
    except TypeError:
        return None


def read_array(array: Array, expected: ArraySpec | None, field: str) -> np.ndarray:
    """The real content of a received ``Array`` checked against ``expected`` (None: only
    the payload and its declared metadata), as a read-only view of its bytes.

    Raises :class:`Refused`: another stype than numpy, a payload :func:`npy_view` refuses,
    a dtype or shape in the bytes that differs from the declared one or the expected one.
    """
    if array.stype != SType.NUMPY:
        raise Refused(field, f"has stype {array.stype!r}; only {SType.NUMPY!r} is accepted")
    view = npy_view(array.data, field)
    declared_shape = tuple(array.shape)
    try:
        declared_dtype = _declared_dtype(array.dtype)
    except TypeError:  # unhashable: not a dtype name
        declared_dtype = None
    if declared_dtype is None:
        raise Refused(field, f"declares dtype {array.dtype!r}, which is not a numpy dtype")
    if view.shape != declared_shape or view.dtype != declared_dtype:
        raise Refused(field, f"declares {declared_dtype}{declared_shape} but its bytes hold "
                             f"{view.dtype}{view.shape}")
    if expected is not None and (view.shape != expected.shape or view.dtype != expected.dtype):
        raise Refused(field, f"is {view.dtype}{view.shape}, expected "
                             f"{expected.dtype}{expected.shape}")
    return view


def value_problem(view: np.ndarray) -> str | None:
    """None if the array's values are acceptable, else why: a floating array with NaN / Inf
    or an L2 norm above :data:`MAX_NORM`; an integer array beyond +-:data:`MAX_INTEGER_ARRAY`.

    One summing pass: the float32 sum of squares is finite exactly when the norm is at most
    MAX_NORM and no element is NaN / Inf."""
    kind = view.dtype.kind
    if kind == "f":
        flat = view.ravel(order="K")  # a view of the bytes in memory order (no copy)
        with np.errstate(over="ignore", invalid="ignore"):
            squares = float(np.dot(flat, flat))  # BLAS: in the array's own dtype
        if view.dtype == np.float64:
            ok = squares <= MAX_NORM * MAX_NORM
        else:
            ok = math.isfinite(squares)
        if ok:
            return None
        if not np.isfinite(view).all():
            return "has NaN or Inf"
        return f"has an L2 norm above {MAX_NORM:.3g} (huge finite values)"
    if kind in "iu" and view.size:
        if int(np.max(np.abs(view.astype(np.float64)))) > MAX_INTEGER_ARRAY:
            return "has integers beyond +-2^53 (huge values)"
    if kind not in "biuf":
        return f"has dtype {view.dtype}, not a number"
    return None


def read_record(name: str, record: ArrayRecord, expected: Mapping[str, object],
                values: bool = True) -> dict[str, np.ndarray]:
    """Every array of received ArrayRecord ``name`` read by :func:`read_array` against
    ``expected`` (a server-side record or dict of arrays) and, with ``values``, checked by
    :func:`value_problem`: {key: read-only view}. Raises :class:`Refused`."""
    specs = specs_of(expected)
    keys = set(record.keys())
    if keys != set(specs):
        missing, extra = sorted(set(specs) - keys), sorted(keys - set(specs))
        raise Refused(f"'{name}'", f"keys differ from the expected ones (missing {missing}, "
                            f"unexpected {extra})")
    views = {}
    for key in specs:
        label = array_label(name, key)
        view = read_array(record[key], specs[key], label)
        if values:
            problem = value_problem(view)
            if problem:
                raise Refused(label, problem)
        views[key] = view
    return views


def arrays_problem(name: str, record: ArrayRecord, expected: Mapping[str, object]
                   ) -> str | None:
    """What makes received ArrayRecord ``name`` unusable (:func:`read_record`), or None."""
    try:
        read_record(name, record, expected)
    except Refused as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------ scalars
def is_integer(value: object) -> bool:
    """A real integer value (an int, or a float with an integer value); never a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return math.isfinite(value) and float(value) == int(value)


def integer_problem(name: str, value: object, low: int, high: int, why_high: str
                    ) -> str | None:
    """None if ``value`` is an integer in [low, high], else what is wrong (naming ``name``)."""
    if not is_integer(value):
        return f"'{name}' must be an integer in {low}..{high}, got {value!r}"
    if value < low:
        return f"'{name}' must be an integer >= {low}, got {value!r}"
    if value > high:
        return f"'{name}' = {value!r} is above {high}, {why_high}"
    return None


def size_bound(reported: int | None) -> tuple[int, str]:
    """The most examples a reply may claim, and why: the client's own query answer, else
    :data:`MAX_NUM_EXAMPLES`."""
    if reported:
        return int(reported), "the size it reported to the client-info query"
    return MAX_NUM_EXAMPLES, "the cap trust_gate.MAX_NUM_EXAMPLES"


def steps_bound(sent: Mapping[str, object] | None, num_examples: int | None) -> int:
    """The most local steps a client may report for the config it was sent.

    ``local-steps`` > 0 when sent; else the ``local-epochs`` E over ``batch-size`` B: at most
    ceil(E ceil(n / B)) steps (a DataLoader without drop_last; n the client's size), ceil(E)
    for a full batch (B = 0); :data:`MAX_LOCAL_STEPS` when neither was sent.
    """
    sent = sent or {}
    steps = sent.get(C.LOCAL_STEPS, 0)
    if is_integer(steps) and steps > 0:
        return int(steps)
    epochs = sent.get(C.LOCAL_EPOCHS)
    if not (isinstance(epochs, numbers.Real) and not isinstance(epochs, bool)
            and math.isfinite(epochs) and epochs > 0):
        return MAX_LOCAL_STEPS
    batch = sent.get(C.BATCH_SIZE, 0)
    batch = int(batch) if is_integer(batch) and batch > 0 else 0
    n = int(num_examples or MAX_NUM_EXAMPLES)
    per_epoch = -(-n // batch) if batch > 0 else 1
    return min(max(math.ceil(float(epochs) * per_epoch), 1), MAX_LOCAL_STEPS)


def a_norm_bound(tau: int, rho: float) -> float:
    """The largest ||a_i||_1 of tau local steps of SGD with momentum rho in [0, 1).

    FedNova (Wang et al., NeurIPS 2020, Sec. 4: the local update is -eta G_i a_i, eq. (5)
    form, with a_i^j = (1 - rho^(tau - j)) / (1 - rho) for momentum SGD) gives
    ||a_i||_1 = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho) <= tau / (1 - rho); plain
    SGD (rho = 0) has ||a_i||_1 = tau, proximal SGD (1 - (1 - eta mu)^tau) / (eta mu) <= tau.
    The gate accepts 0 < ||a_i||_1 <= tau / (1 - rho).
    """
    return float(tau) / (1.0 - rho)


def sent_momentum(sent: Mapping[str, object] | None) -> float:
    """rho sent to the client (0 when none or not a number in [0, 1))."""
    rho = (sent or {}).get(C.MOMENTUM, 0.0)
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not 0 <= rho < 1:
        return 0.0
    return float(rho)


def metrics_finite_problem(metrics: Mapping[str, object]) -> str | None:
    """A metric that is NaN / Inf (scalar or in a list), or None."""
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            return f"metric '{key}' is NaN or Inf ({value!r})"
    return None


def train_metrics_problem(metrics: Mapping[str, object], *, sent: Mapping[str, object] | None,
                          reported_size: int | None) -> str | None:
    """What is wrong with a train reply's MetricRecord, or None: ``num-examples`` a positive
    integer within :func:`size_bound`; ``local-steps`` (when present) an integer in
    1..:func:`steps_bound`; ``a-norm`` (when present) in (0, :func:`a_norm_bound`]; every
    metric finite."""
    n = metrics.get(C.NUM_EXAMPLES)
    if n is None:
        return f"'{C.NUM_EXAMPLES}' is missing (a positive integer is needed)"
    if is_integer(n) and n == 0:
        return f"'{C.NUM_EXAMPLES}' is 0 (an empty partition?): nothing to aggregate, skipped"
    high, why = size_bound(reported_size)
    problem = integer_problem(C.NUM_EXAMPLES, n, 1, high, why)
    if problem:
        return problem
    problem = metrics_finite_problem(metrics)
    if problem:
        return problem
    most = steps_bound(sent, int(n))
    steps = metrics.get(C.LOCAL_STEPS_TAKEN)
    if steps is not None:
        problem = integer_problem(C.LOCAL_STEPS_TAKEN, steps, 1, most,
                                  "the local steps the server sent this client")
        if problem:
            return problem
    a_norm = metrics.get(C.A_NORM)
    if a_norm is not None:
        tau = int(steps) if steps is not None else most
        rho = sent_momentum(sent)
        high_a = a_norm_bound(tau, rho)
        if (isinstance(a_norm, bool) or not isinstance(a_norm, numbers.Real)
                or not 0 < a_norm <= high_a):
            return (f"'{C.A_NORM}' must be in (0, tau / (1 - rho)] = (0, {high_a:g}] for "
                    f"tau = {tau} steps and momentum rho = {rho:g} (FedNova, Wang et al. 2020), "
                    f"got {a_norm!r}")
    return None


def train_reply_problem(reply: Message, expected: Mapping[str, object], *,
                        sent: Mapping[str, object] | None, reported_size: int | None
                        ) -> str | None:
    """What makes a train reply unusable, or None: a client error, no ArrayRecord
    ``arrays`` or MetricRecord ``metrics``, :func:`train_metrics_problem`, or ``arrays`` that
    :func:`read_record` refuses against the global model ``expected``."""
    if reply.has_error():
        return f"client error: {reply.error.reason}"
    content = reply.content
    if not (isinstance(content.get(C.ARRAYS), ArrayRecord)
            and isinstance(content.get(C.METRICS), MetricRecord)):
        return f"needs an ArrayRecord '{C.ARRAYS}' and a MetricRecord '{C.METRICS}'"
    problem = train_metrics_problem(content[C.METRICS], sent=sent, reported_size=reported_size)
    if problem:
        return problem
    return arrays_problem(C.ARRAYS, content[C.ARRAYS], expected)


# ------------------------------------------------------------------ client-info query
@dataclass(frozen=True)
class ClientFacts:
    """What a client-info query reply says, checked (None: not reported)."""

    partition_id: int | None = None
    num_examples: int | None = None
    label_counts: list[int] | None = None
    comm_budget: float | None = None


@dataclass(frozen=True)
class FactRefusal:
    """A refused field of a client-info reply: the node's whole answer is dropped."""

    field: str
    value: object
    reason: str
    fix: str = ""  # '': the node's --node-config / data, or what its @app.query() reports

    def line(self, node: int) -> str:
        """The one WARNING: node, field, value, and the fix."""
        value = repr(self.value)
        if len(value) > 80:
            value = value[:77] + "..."
        fix = self.fix or ("fix the node's --node-config / data, or what its ClientApp's "
                           "@app.query() reports")
        return (f"Client-info reply from node {node} refused: '{self.field}' = {value} "
                f"{self.reason}; the node is treated as one that did not answer. "
                f"{fix[0].upper()}{fix[1:]}")


def client_facts(metrics: Mapping[str, object]) -> ClientFacts | FactRefusal:
    """The checked facts of one client-info reply's MetricRecord, or the first refused field:
    partition id an integer in [0, MAX_PARTITION_ID]; num-examples in 0..MAX_NUM_EXAMPLES (0:
    an empty partition, an honest fact; its train replies are skipped); label counts a list of at most MAX_LABELS integers in 0..MAX_NUM_EXAMPLES; comm-budget a
    finite number > 0."""
    pid = metrics.get(C.PARTITION_ID)
    if pid is not None and not (is_integer(pid) and 0 <= pid <= MAX_PARTITION_ID):
        return FactRefusal(C.PARTITION_ID, pid,
                           f"is not an integer in 0..{MAX_PARTITION_ID}")
    n = metrics.get(C.NUM_EXAMPLES)
    if n is not None and not (is_integer(n) and 0 <= n <= MAX_NUM_EXAMPLES):
        return FactRefusal(C.NUM_EXAMPLES, n, f"is not an integer in 0..{MAX_NUM_EXAMPLES} "
                                              f"(trust_gate.MAX_NUM_EXAMPLES)")
    counts = metrics.get(C.LABEL_COUNTS)
    if counts is not None and not (
            isinstance(counts, list) and 0 < len(counts) <= MAX_LABELS
            and all(is_integer(c) and 0 <= c <= MAX_NUM_EXAMPLES for c in counts)):
        return FactRefusal(C.LABEL_COUNTS, counts,
                           f"is not a list of 1..{MAX_LABELS} integers in "
                           f"0..{MAX_NUM_EXAMPLES}")
    budget = metrics.get(C.COMM_BUDGET)
    if budget is not None and not (isinstance(budget, numbers.Real)
                                   and not isinstance(budget, bool)
                                   and math.isfinite(budget) and budget > 0):
        return FactRefusal(C.COMM_BUDGET, budget, "is not a finite number of bytes > 0")
    return ClientFacts(
        partition_id=None if pid is None else int(pid),
        num_examples=None if n is None else int(n),
        label_counts=None if counts is None else [int(c) for c in counts],
        comm_budget=None if budget is None else float(budget))


def facts_conflict(facts: ClientFacts, others: Iterable[object]) -> FactRefusal | None:
    """Whether ``facts`` contradict what other connected nodes already reported (``others``:
    objects with ``partition_id`` and ``label_counts``): a partition id another node holds
    (the second claimant is refused: partition ids key client state and the clock), or label
    counts of another length than the other nodes'."""
    others = list(others)
    if facts.partition_id is not None and any(
            getattr(o, "partition_id", None) == facts.partition_id for o in others):
        return FactRefusal(C.PARTITION_ID, facts.partition_id,
                           "is already claimed by another connected node")
    if facts.label_counts is not None:
        lengths = {len(o.label_counts) for o in others
                   if getattr(o, "label_counts", None) is not None}
        if lengths and len(facts.label_counts) not in lengths:
            return FactRefusal(C.LABEL_COUNTS, facts.label_counts,
                               f"has {len(facts.label_counts)} classes, the other nodes' "
                               f"{sorted(lengths)[0]}")
    return None


# ------------------------------------------------------------------ evaluate replies
def evaluate_reply_problem(reply: Message, reported_size: int | None) -> str | None:
    """What makes an evaluate reply unusable, or None: exactly one MetricRecord, with
    ``num-examples`` a positive integer within :func:`size_bound`, every metric a finite
    number or list of numbers."""
    records = reply.content.metric_records
    if len(records) != 1:
        return f"needs exactly one MetricRecord, got {len(records)}"
    metrics = next(iter(records.values()))
    n = metrics.get(C.NUM_EXAMPLES)
    high, why = size_bound(reported_size)
    problem = integer_problem(C.NUM_EXAMPLES, n, 1, high, why)
    return problem or metrics_finite_problem(metrics)


def aggregate_evaluate(replies: Iterable[Message], clients: Mapping[int, object] | None = None,
                       aggregate: Callable[[list[RecordDict], str], MetricRecord] | None = None
                       ) -> MetricRecord | None:
    """Flower's ``aggregate_evaluate`` (the ``num-examples``-weighted mean of every metric,
    ``aggregate_metricrecords``, or the strategy's ``evaluate_metrics_aggr_fn`` given as
    ``aggregate``) over the replies the gate accepts.

    A reply is refused (one WARNING naming node, partition and field) when
    :func:`evaluate_reply_problem` says so or when its metric keys differ from those most
    replies share (Flower raises for mixed keys). None when no reply is left.
    """
    clients = clients or {}
    replies = list(replies)
    good = [r for r in replies if not r.has_error()]
    flower_args.log_received("aggregate_evaluate", replies)
    usable = []
    for reply in good:
        node = reply.metadata.src_node_id
        problem = evaluate_reply_problem(reply, getattr(clients.get(node), "num_examples", None))
        if getattr(clients.get(node), "unbound", False):  # Flower's sampling may ask it
            problem = "its key does not allow the partition it claimed (node identity)"
        if problem:
            log_refused("Evaluate reply", node, partition_of(clients, node), problem)
        else:
            usable.append(reply)
    kept = same_metric_keys(usable, "Evaluate reply", clients)
    if not kept:
        return None
    if aggregate is not None:
        return flower_args.flower_metrics(aggregate, [r.content for r in kept])
    return weighted_metrics([next(iter(r.content.metric_records.values())) for r in kept])


def same_metric_keys(replies: Sequence[Message], what: str,
                     clients: Mapping[int, object] | None = None) -> list[Message]:
    """The replies whose (only) MetricRecord has the key set most replies share (ties: the
    first such set in reply order); each other reply is refused with one WARNING (Flower's
    metric aggregation raises for mixed keys)."""
    if not replies:
        return []
    clients = clients or {}
    key_sets = [frozenset(next(iter(r.content.metric_records.values())).keys())
                for r in replies]
    common = Counter(key_sets).most_common(1)[0][0]
    kept = []
    for reply, keys in zip(replies, key_sets):
        if keys == common:
            kept.append(reply)
            continue
        node = reply.metadata.src_node_id
        log_refused(what, node, partition_of(clients, node),
                    f"metric keys differ from the other replies' (missing "
                    f"{sorted(common - keys)}, unexpected {sorted(keys - common)})")
    return kept


def weighted_metrics(records: Sequence[MetricRecord]) -> MetricRecord:
    """Flower's ``aggregate_metricrecords``: sum_k (n_k / n) m_k per key (lists elementwise),
    ``num-examples`` left out; the same float operations in the same order."""
    weights = [float(m[C.NUM_EXAMPLES]) for m in records]
    total = sum(weights)
    out = MetricRecord()
    for record, weight in zip(records, [w / total for w in weights]):
        for key, value in record.items():
            if key == C.NUM_EXAMPLES:
                continue
            if key not in out:
                out[key] = [v * weight for v in value] if isinstance(value, list) else \
                    value * weight
            elif isinstance(value, list):
                out[key] = [c + v * weight for c, v in zip(out[key], value)]
            else:
                out[key] = out[key] + value * weight
    return out


# ------------------------------------------------------------------ adopted state
def non_finite_key(arrays: Mapping[str, np.ndarray] | None) -> str | None:
    """The first key of a floating array with NaN / Inf, or None (integer arrays pass)."""
    for key, value in (arrays or {}).items():
        value = np.asarray(value)
        if np.issubdtype(value.dtype, np.floating):
            with np.errstate(over="ignore", invalid="ignore"):
                total = np.sum(value)
            if not np.isfinite(total) and not np.isfinite(value).all():
                return key
    return None


def finite_or_previous(new: Mapping[str, np.ndarray] | None, previous, what: str,
                       server_round: int):
    """``new`` when it is finite, else ``previous``, with one WARNING saying why."""
    bad = non_finite_key(new)
    if bad is None:
        return new
    log(WARNING, "Round %d: %s is not finite (array '%s' has NaN or Inf); the previous one is "
        "kept", server_round, what, bad)
    return previous


def adoptable_model(new: Mapping[str, np.ndarray] | None, server_round: int) -> bool:
    """True if the new global model may be adopted: None (nothing new) or finite; else one
    WARNING: the previous model is kept."""
    bad = non_finite_key(new)
    if bad is None:
        return True
    log(WARNING, "Round %d: the new global model is not finite (array '%s' has NaN or Inf); "
        "the previous model is kept", server_round, bad)
    return False


def record_views(record: ArrayRecord) -> dict[str, np.ndarray]:
    """{key: read-only view} of a record the server itself wrote (no expected specs)."""
    return {key: read_array(array, None, array_label("", key)) for key, array in record.items()}

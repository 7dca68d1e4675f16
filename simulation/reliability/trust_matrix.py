"""The trust-gate matrix: every malformed-reply class against every strategy, in process.

One run per strategy, through its public API (``strategy.start`` with the strategy the
app's registry builds from a tiny run config), the in-process :class:`FaultGrid` and the
real ClientApp (``fedapp.client_app``): in round t, partition 1's first train reply is
put through class t of :func:`simulation.reliability.corruptions.gate_kinds_for` (one
class per round; DynamicFL: its first chunk reply of the round). A class passes when the
run completes, the round's global model is finite, and a WARNING of that round names the
hostile node and the field (:data:`FIELD_WORDS`). Query replies get the same treatment in
:func:`run_query_matrix`: node k of K answers the client-info query with class k.

``python -m simulation.reliability.trust_matrix`` prints the table (classes x strategies).
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from strategies import contract as C
from strategies.engine import trust_gate

from .common import MODEL_FOR
from .corruptions import CORRUPTIONS, gate_kinds_for
from .grid import FaultGrid

MATRIX_STRATEGIES = ("fedavg", "fedprox", "fednova", "fedveca", "dynamicfl", "scaffold",
                     "feddyn", "moon", "fedavgm", "fedadam", "fedyogi", "fedadagrad")
QUERYING_STRATEGIES = MATRIX_STRATEGIES[:8]  # fedhetero's own: they ask the client-info query
HOSTILE_PARTITION = 1

TINY = {
    "dataset": "synthetic", "model": "mlp-2nn", "partition": "iid", "local-steps": 1,
    "batch-size": 10, "lr": 0.05, "eval-batch-size": 2000, "fedveca-tau-init": 2,
    "fedveca-tau-max": 3, "dynamicfl-local-steps": 2, "round-timeout": 0.3,
    "drift-diagnostics": False, "seed": 0,
}

# what the WARNING naming the hostile node must say, per class (any one of the words)
FIELD_WORDS: dict[str, tuple[str, ...]] = {
    "num-examples-missing": ("num-examples",), "num-examples-zero": ("num-examples",),
    "num-examples-negative": ("num-examples",), "num-examples-fraction": ("num-examples",),
    "num-examples-float-huge": ("num-examples",), "num-examples-huge": ("num-examples",),
    "nan-array": ("NaN or Inf",), "inf-array": ("NaN or Inf",),
    "nan-metric": ("NaN or Inf",), "inf-metric": ("NaN or Inf",),
    "wrong-key": ("keys differ",), "extra-key": ("keys differ",),
    "wrong-shape": ("expected",), "wrong-dtype": ("expected",),
    "no-arrays": ("'arrays'",), "metrics-missing": ("'metrics'",),
    "strategy-metrics-missing": ("local-steps",),
    "npy-other-bytes": ("bytes hold",), "npy-one-element": ("bytes hold",),
    "npy-truncated": ("truncated",), "npy-trailing-bytes": ("trailing bytes",),
    "npy-wrong-stype": ("stype",), "npy-bad-magic": ("magic",),
    "npy-long-header": ("header of",), "npy-object-dtype": ("Python objects",),
    "npy-dtype-mismatch": ("bytes hold",), "npy-shape-mismatch": ("bytes hold",),
    "huge-finite-array": ("L2 norm",),
    "local-steps-huge": ("local-steps",), "local-steps-zero": ("local-steps",),
    "local-steps-fraction": ("local-steps",),
    "a-norm-huge": ("a-norm",), "a-norm-zero": ("a-norm",),
    "scaffold-delta-c-missing": ("scaffold-delta-c",), "scaffold-delta-c-nan": ("NaN or Inf",),
    "scaffold-delta-c-wrong-shape": ("expected",),
    "scaffold-delta-c-huge": ("L2 norm", "option II"),
    "scaffold-delta-c-inflated": ("option II",),
    "scaffold-delta-c-one-element": ("bytes hold",), "scaffold-delta-c-truncated": ("truncated",),
    "grad-one-element": ("bytes hold",), "grad-truncated": ("truncated",),
    "grad-nan": ("NaN or Inf",), "grad-overflow": ("L2 norm",), "beta-negative": ("'beta'",),
    "client-state-round-wrong": ("started from its state",),
    "client-state-echo-missing": ("state-digest",),
    "client-state-round-float": ("state-round",),
}


@dataclass(frozen=True)
class ClassResult:
    """One malformed-reply class in one strategy's run."""

    kind: str
    server_round: int
    model_finite: bool
    named: bool
    lines: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """The model stayed finite and the bad reply was named."""
        return self.model_finite and self.named


@dataclass(frozen=True)
class MatrixRun:
    """One strategy's run: whether it completed (else the error) and each class's result."""

    strategy: str
    completed: bool
    error: str | None
    results: tuple[ClassResult, ...]

    @property
    def passed(self) -> int:
        """Classes that passed (0 when the run did not complete)."""
        return sum(r.passed for r in self.results) if self.completed else 0


class WarningLines(logging.Handler):
    """Collects the WARNING lines of the ``flwr`` logger, handed out per round."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def take(self) -> list[str]:
        """The lines since the last call."""
        lines, self.lines = self.lines, []
        return lines


def run_config(strategy: str, rounds: int, **overrides) -> dict:
    """The tiny run config of one matrix run."""
    rc = {**TINY, "strategy": strategy, "num-server-rounds": rounds, **overrides}
    if strategy == "dynamicfl":
        rc.setdefault("dynamicfl-intervals", "1-2")
    if strategy in MODEL_FOR:
        rc["model"] = MODEL_FOR[strategy]
    return rc


def initial_arrays(cfg) -> object:
    """The seeded initial model of the run config, as an ArrayRecord (as the ServerApp's
    evaluation process builds it)."""
    import torch  # noqa: PLC0415

    from strategies.engine.records import to_record  # noqa: PLC0415
    from task.data import load_dataset  # noqa: PLC0415
    from task.models import build_model  # noqa: PLC0415

    data = load_dataset(cfg.dataset, cfg.data_dir, cfg.allow_download, cfg.synthetic_alpha,
                        cfg.synthetic_beta, cfg.normalize, with_train=False)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    return to_record({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})


def per_round_hook(kinds: Sequence[str], partition: int = HOSTILE_PARTITION) -> Callable:
    """A FaultGrid reply hook: round t corrupts ``partition``'s first train reply with
    ``kinds[t - 1]``."""
    seen: set[int] = set()

    def hook(msg: Message, reply: Message, context: Context) -> Message:
        if msg.metadata.message_type != "train" or reply.has_error():
            return reply
        if int(context.node_config["partition-id"]) != partition:
            return reply
        server_round = int(msg.content[C.CONFIG][C.SERVER_ROUND])
        if server_round in seen or server_round > len(kinds):
            return reply
        seen.add(server_round)
        return CORRUPTIONS[kinds[server_round - 1]](reply, msg)

    return hook


def start(strategy_name: str, rounds: int, num_nodes: int, reply_hook: Callable,
          **overrides) -> tuple[FaultGrid, WarningLines, list[tuple[int, bool, list[str]]]]:
    """Run ``strategy_name`` for ``rounds`` rounds on ``num_nodes`` in-process ClientApps
    with ``reply_hook``; per round (round, model finite, WARNING lines). Exceptions
    propagate (the run did not complete)."""
    from fedapp.client_app import NUM_THREADS  # noqa: PLC0415
    from fedapp.client_app import app as client_app  # noqa: PLC0415
    from fedapp.config import RunConfig  # noqa: PLC0415
    from fedapp.registry import build_strategy  # noqa: PLC0415

    rc = run_config(strategy_name, rounds, **overrides)
    cfg = RunConfig.from_user_config(rc)
    strategy, train_config = build_strategy(cfg)
    random.seed(cfg.seed)  # Flower's own strategies sample with Python's random
    grid = FaultGrid(client_app, num_nodes, rc, reply_hook=reply_hook)
    for context in grid.contexts.values():  # one torch thread: tiny models, shared cores
        context.node_config[NUM_THREADS] = 1
    handler = WarningLines()
    rounds_seen: list[tuple[int, bool, list[str]]] = []

    def evaluate(server_round: int, arrays) -> MetricRecord | None:
        finite = trust_gate.non_finite_key(trust_gate.record_views(arrays)) is None
        lines = handler.take()
        if server_round > 0:
            rounds_seen.append((server_round, finite, lines))
        return None

    import torch  # noqa: PLC0415

    threads = torch.get_num_threads()  # the ClientApp sets 1 (num-threads): restored after
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        strategy.start(grid, initial_arrays(cfg), num_rounds=rounds, timeout=cfg.round_timeout,
                       train_config=ConfigRecord(train_config),
                       evaluate_config=ConfigRecord({C.SEED: cfg.seed}), evaluate_fn=evaluate)
    finally:
        logger.removeHandler(handler)
        torch.set_num_threads(threads)
    return grid, handler, rounds_seen


def run_strategy(strategy: str, kinds: Sequence[str] | None = None,
                 num_nodes: int = 2) -> MatrixRun:
    """The matrix row of one strategy (module docstring)."""
    kinds = list(kinds if kinds is not None else gate_kinds_for(strategy))
    try:
        grid, _, rounds = start(strategy, len(kinds), num_nodes, per_round_hook(kinds))
    except Exception as exc:  # noqa: BLE001 - a run that did not complete is the result
        return MatrixRun(strategy, False, f"{type(exc).__name__}: {exc}", ())
    node = grid.node_ids[HOSTILE_PARTITION]
    results = []
    for (server_round, finite, lines), kind in zip(rounds, kinds):
        named = any(f"node {node}" in line.lower()
                    and any(w in line for w in FIELD_WORDS[kind]) for line in lines)
        results.append(ClassResult(kind, server_round, finite, named, tuple(lines)))
    return MatrixRun(strategy, True, None, tuple(results))


# ------------------------------------------------------------------ client-info query
def _facts(metrics: dict, **changes) -> dict:
    return {**metrics, **changes}


QUERY_CORRUPTIONS: dict[str, Callable[[dict], dict]] = {
    "partition-id-nan": lambda m: _facts(m, **{C.PARTITION_ID: float("nan")}),
    "partition-id-inf": lambda m: _facts(m, **{C.PARTITION_ID: float("inf")}),
    "partition-id-negative": lambda m: _facts(m, **{C.PARTITION_ID: -3}),
    "partition-id-fraction": lambda m: _facts(m, **{C.PARTITION_ID: 2.5}),
    "partition-id-huge": lambda m: _facts(m, **{C.PARTITION_ID: 2**40}),
    "partition-id-duplicate": lambda m: _facts(m, **{C.PARTITION_ID: 0}),
    "num-examples-huge": lambda m: _facts(m, **{C.NUM_EXAMPLES: 10**15}),
    "num-examples-negative": lambda m: _facts(m, **{C.NUM_EXAMPLES: -10}),
    "num-examples-fraction": lambda m: _facts(m, **{C.NUM_EXAMPLES: 12.5}),
    "label-counts-scalar": lambda m: _facts(m, **{C.LABEL_COUNTS: 5}),
    "label-counts-ragged": lambda m: _facts(m, **{C.LABEL_COUNTS: [1, 2, 3]}),
    "label-counts-negative": lambda m: _facts(
        m, **{C.LABEL_COUNTS: [-1] + list(m.get(C.LABEL_COUNTS, [0, 0]))[1:]}),
    "comm-budget-inf": lambda m: _facts(m, **{C.COMM_BUDGET: float("inf")}),
    "comm-budget-negative": lambda m: _facts(m, **{C.COMM_BUDGET: -1.0}),
}
QUERY_FIELDS = {kind: kind.split("-")[0] + "-" + kind.split("-")[1]
                for kind in QUERY_CORRUPTIONS}


def query_hook(kinds: Sequence[str]) -> Callable:
    """Partition k + 1 answers the client-info query with ``kinds[k]`` (partition 0 honest:
    the duplicate claims its id)."""
    def hook(msg: Message, reply: Message, context: Context) -> Message:
        if msg.metadata.message_type != "query" or reply.has_error():
            return reply
        pid = int(context.node_config["partition-id"])
        if not 1 <= pid <= len(kinds):
            return reply
        metrics = dict(reply.content[C.METRICS].items())
        changed = QUERY_CORRUPTIONS[kinds[pid - 1]](metrics)
        content = RecordDict({C.METRICS: _metric_record(changed)})
        return Message(content, reply_to=msg)

    return hook


def _metric_record(values: dict) -> MetricRecord:
    record = MetricRecord()
    for key, value in values.items():
        record[key] = value
    return record


@dataclass(frozen=True)
class QueryRun:
    """One strategy's run with every query class on its own node."""

    strategy: str
    completed: bool
    error: str | None
    named: dict[str, bool]
    finite: bool


def run_query_matrix(strategy: str, kinds: Sequence[str] | None = None,
                     rounds: int = 2) -> QueryRun:
    """Every client-info query class at once, node k + 1 answering with class k: the run
    must complete, the model stay finite, and each hostile node be named with its field."""
    kinds = list(kinds if kinds is not None else QUERY_CORRUPTIONS)
    try:
        grid, _, seen = start(strategy, rounds, len(kinds) + 1, query_hook(kinds),
                              **{"fraction-train": 1.0})
    except Exception as exc:  # noqa: BLE001 - a run that did not complete is the result
        return QueryRun(strategy, False, f"{type(exc).__name__}: {exc}", {}, False)
    lines = [line for _, _, round_lines in seen for line in round_lines]
    named = {}
    for k, kind in enumerate(kinds):
        node = grid.node_ids[k + 1]
        named[kind] = any(f"node {node}" in line and f"'{QUERY_FIELDS[kind]}'" in line
                          for line in lines)
    return QueryRun(strategy, True, None, named, all(f for _, f, _ in seen))




# ------------------------------------------------------------------ evaluate replies
def _evaluate_metrics(reply: Message, msg: Message, **changes) -> Message:
    metrics = {**dict(reply.content[C.METRICS].items()), **changes}
    return Message(RecordDict({C.METRICS: _metric_record(metrics)}), reply_to=msg)


EVALUATE_CORRUPTIONS: dict[str, Callable[[Message, Message], Message]] = {
    "eval-num-examples-negative": lambda r, m: _evaluate_metrics(r, m, **{C.NUM_EXAMPLES: -5}),
    "eval-num-examples-huge": lambda r, m: _evaluate_metrics(r, m, **{C.NUM_EXAMPLES: 10**12}),
    "eval-nan-metric": lambda r, m: _evaluate_metrics(r, m, **{C.EVAL_LOSS: float("nan")}),
    "eval-extra-key": lambda r, m: _evaluate_metrics(r, m, unexpected=1.0),
    "eval-metrics-missing": lambda r, m: Message(RecordDict(), reply_to=m),
}
EVALUATE_FIELDS = {"eval-num-examples-negative": "num-examples",
                   "eval-num-examples-huge": "num-examples", "eval-nan-metric": "NaN or Inf",
                   "eval-extra-key": "metric keys differ",
                   "eval-metrics-missing": "MetricRecord"}


def evaluate_hook(kinds: Sequence[str], partition: int = HOSTILE_PARTITION) -> Callable:
    """Round t corrupts ``partition``'s evaluate reply with ``kinds[t - 1]``."""
    def hook(msg: Message, reply: Message, context: Context) -> Message:
        if msg.metadata.message_type != "evaluate" or reply.has_error():
            return reply
        if int(context.node_config["partition-id"]) != partition:
            return reply
        server_round = int(msg.content[C.CONFIG][C.SERVER_ROUND])
        if server_round > len(kinds):
            return reply
        return EVALUATE_CORRUPTIONS[kinds[server_round - 1]](reply, msg)

    return hook


def run_evaluate_matrix(strategy: str, kinds: Sequence[str] | None = None) -> MatrixRun:
    """Every evaluate-reply class, one per round (``fraction-evaluate`` 1): the run completes
    and each round's WARNING names the hostile node and the field."""
    kinds = list(kinds if kinds is not None else EVALUATE_CORRUPTIONS)
    try:
        grid, _, rounds = start(strategy, len(kinds), 3, evaluate_hook(kinds),
                                **{"fraction-evaluate": 1.0})
    except Exception as exc:  # noqa: BLE001 - a run that did not complete is the result
        return MatrixRun(strategy, False, f"{type(exc).__name__}: {exc}", ())
    node = grid.node_ids[HOSTILE_PARTITION]
    results = []
    for (server_round, finite, lines), kind in zip(rounds, kinds):
        named = any(f"node {node}" in line and EVALUATE_FIELDS[kind] in line for line in lines)
        results.append(ClassResult(kind, server_round, finite, named, tuple(lines)))
    return MatrixRun(strategy, True, None, tuple(results))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the matrix (classes x strategies) and the pass counts; 0 when all pass."""
    strategies = list(argv) if argv else list(MATRIX_STRATEGIES)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    total = passed = 0
    for name in strategies:
        row = run_strategy(name)
        total += len(gate_kinds_for(name))
        passed += row.passed
        failed = [r.kind for r in row.results if not r.passed]
        print(f"{name:11s} {row.passed:3d}/{len(gate_kinds_for(name)):3d} "
              f"{'completed' if row.completed else 'ABORTED: ' + str(row.error)}"
              f"{' failed: ' + ', '.join(failed) if failed else ''}", flush=True)
    print(f"train replies: {passed}/{total} class x strategy cells pass")
    return 0 if passed == total else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

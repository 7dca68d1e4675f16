"""Flower's FedAvg constructor arguments, as every fedhetero strategy takes them.

A fedhetero strategy replaces ``flwr.serverapp.strategy.FedAvg(...)`` with the same
arguments: the ten of Flower's constructor, positional in Flower's order
(:data:`FLOWER_ARGS`), with Flower's meaning:

* ``fraction_train``, ``fraction_evaluate``, ``min_available_nodes``: as Flower's;
  ``min_train_nodes``: m = max(floor(C K), ``min_train_nodes``) clients per round, at most
  the K online ones (default 1, McMahan et al. 2017, Algorithm 1; Flower's is 2);
  ``min_evaluate_nodes`` (default 1) goes to Flower's ``configure_evaluate``;
* ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn``: Flower's signature
  ``(list[RecordDict], weighted_by_key) -> MetricRecord``, called on the replies the trust
  gate accepted. Without one, the training metrics are the ``num-examples``-weighted mean
  of the scalar metrics every reply carries (Flower's ``aggregate_metricrecords`` for
  those; a metric some replies lack, or a list, is left out) plus the round's report, and
  the evaluation metrics are Flower's ``aggregate_metricrecords``. With one, its record
  replaces the clients' means and the round's report is in the run log only;
* ``weighted_by_key``, ``arrayrecord_key``, ``configrecord_key``: fedhetero's strategies
  and client helpers exchange the records under Flower's default names
  (:mod:`strategies.contract`), so only those values are taken; any other is an error that
  names the key and the fix (:func:`check_record_keys`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from logging import INFO

from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.logger import log

from .. import contract as C

__all__ = ["FLOWER_ARGS", "MetricsAggregation", "check_metrics_fn", "check_record_keys",
           "flower_base_args", "flower_metrics", "log_counts", "log_received"]

FLOWER_ARGS = ("fraction_train", "fraction_evaluate", "min_train_nodes", "min_evaluate_nodes",
               "min_available_nodes", "weighted_by_key", "arrayrecord_key", "configrecord_key",
               "train_metrics_aggr_fn", "evaluate_metrics_aggr_fn")
"""Flower 1.42's ``FedAvg.__init__`` parameters, in its order."""

MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]

_RECORD_KEYS = (("weighted_by_key", C.NUM_EXAMPLES, "the metric each client's n_k is sent under"),
                ("arrayrecord_key", C.ARRAYS, "the ArrayRecord's name in every message"),
                ("configrecord_key", C.CONFIG, "the ConfigRecord's name in every message"))


def check_record_keys(owner: str, weighted_by_key: str, arrayrecord_key: str,
                      configrecord_key: str) -> None:
    """Raise ValueError unless the three record names are Flower's defaults (module
    docstring); the message names the argument, the value and the fix."""
    given = {"weighted_by_key": weighted_by_key, "arrayrecord_key": arrayrecord_key,
             "configrecord_key": configrecord_key}
    for name, ours, what in _RECORD_KEYS:
        if given[name] != ours:
            raise ValueError(
                f"{owner}: {name}={given[name]!r} is not supported: {what} is {ours!r} for "
                f"fedhetero's strategies, trust gate and client helpers "
                f"(strategies.contract); leave {name} at Flower's default {ours!r} and have the "
                f"ClientApp use that name")


def check_metrics_fn(name: str, fn: object) -> MetricsAggregation | None:
    """``fn`` if it is None or callable, else ValueError naming ``name``."""
    if fn is not None and not callable(fn):
        raise ValueError(f"{name} must be a function (list[RecordDict], str) -> MetricRecord "
                         f"as in Flower's FedAvg, or None; got {fn!r}")
    return fn


def flower_base_args(participation: object, fraction_evaluate: float,
                     min_evaluate_nodes: int, train_metrics_aggr_fn: object,
                     evaluate_metrics_aggr_fn: object) -> dict:
    """The keyword arguments of Flower's ``FedAvg.__init__`` for a strategy whose sampling
    is ``participation``'s (its C, minimum m and minimum connected nodes), the metrics
    functions checked (:func:`check_metrics_fn`)."""
    return {"fraction_train": participation.fraction_train,
            "fraction_evaluate": fraction_evaluate,
            "min_train_nodes": participation.min_train_nodes,
            "min_evaluate_nodes": min_evaluate_nodes,
            "min_available_nodes": participation.min_available_nodes,
            "train_metrics_aggr_fn": check_metrics_fn("train_metrics_aggr_fn",
                                                      train_metrics_aggr_fn),
            "evaluate_metrics_aggr_fn": check_metrics_fn("evaluate_metrics_aggr_fn",
                                                         evaluate_metrics_aggr_fn)}


def differences_from_flower(min_train_nodes: int, min_evaluate_nodes: int) -> str | None:
    """The startup line of the defaults that differ from Flower's FedAvg (None: none)."""
    differ = []
    if min_train_nodes == 1:
        differ.append("m = max(floor(C K), 1) clients per round (min_train_nodes 1, Flower's "
                      "default 2)")
    if min_evaluate_nodes == 1:
        differ.append("min_evaluate_nodes 1 (Flower's default 2)")
    return "Differs from Flower's FedAvg: " + "; ".join(differ) if differ else None


def work_per_update_warning(owner: str, updates_per_step: int, concurrency: int,
                            nodes: int) -> str | None:
    """What a run of an asynchronous strategy does per server update ("round") on ``nodes``
    connected nodes, when it is more than FedAvg's one task per node or the concurrency
    exceeds the nodes (None otherwise)."""
    notes = []
    if concurrency > nodes:
        notes.append(f"concurrency {concurrency} exceeds the {nodes} connected nodes: at most "
                     f"{nodes} tasks train at once")
    if updates_per_step > nodes:
        notes.append(f"each server update (\"round\") waits for {updates_per_step} client "
                     f"updates, {updates_per_step / max(nodes, 1):g} per node (a FedAvg round: "
                     f"one each)")
    return f"{owner}: " + "; ".join(notes) if notes else None


def flower_metrics(fn: MetricsAggregation, contents: Sequence[RecordDict]) -> MetricRecord:
    """``fn`` (Flower's signature) over the replies' ``contents``, weighted by
    ``num-examples``; a TypeError naming the function if it returns no MetricRecord."""
    out = fn(list(contents), C.NUM_EXAMPLES)
    if not isinstance(out, MetricRecord):
        raise TypeError(f"the metrics aggregation function {getattr(fn, '__name__', fn)!r} "
                        f"returned {type(out).__name__}, not a MetricRecord (Flower's "
                        f"contract for train_metrics_aggr_fn / evaluate_metrics_aggr_fn)")
    return out


def log_received(step: str, replies: Sequence[Message]) -> None:
    """Flower's FedAvg log lines for ``step`` ("aggregate_train" / "aggregate_evaluate"):
    how many replies came with results and with errors, then each error's node and reason."""
    errors = [r for r in replies if r.has_error()]
    log(INFO, "%s: Received %s results and %s failures", step, len(replies) - len(errors),
        len(errors))
    for reply in errors:
        log(INFO, "\t> Received error in reply from node %d: %s", reply.metadata.src_node_id,
            reply.error.reason)


def log_counts(step: str, results: int, failures: int) -> None:
    """Flower's count line for ``step`` where the replies were handled one by one (an
    asynchronous strategy's round, DynamicFL's sync events)."""
    log(INFO, "%s: Received %s results and %s failures", step, results, failures)

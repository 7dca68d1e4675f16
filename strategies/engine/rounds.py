"""The round loop of every strategy here: Flower's ``Strategy.start``, on the Grid event loop,
able to start at any round.

Per round r: the training half -> ``configure_evaluate`` -> exchange on
:class:`~strategies.engine.event_loop.GridEventLoop` -> ``aggregate_evaluate`` ->
``evaluate_fn(r, arrays)``, the calls and logs of Flower's own loop. The training half is the
engine's own round (:class:`TrainsRounds`: the synchronous engine's plan, exchange and
aggregation; the asynchronous engine's server update; DynamicFL's sync events), or for any
other Flower ``Strategy`` its ``configure_train`` -> exchange -> ``aggregate_train``. Two
differences from Flower's loop:

* ``first_round`` > 1 resumes a run: ``initial_arrays`` is the model after round
  ``first_round - 1``, which is not evaluated again, and the rounds keep their numbers (the
  strategies' per-round seeds, schedules and logs are those of an uninterrupted run);
* a round's replies are let go once aggregated, before the next exchange (Flower's loop
  holds round r's train replies until round r + 1's have arrived: two rounds of
  model-sized replies at once).

It runs any Flower ``Strategy`` (Flower's own server optimisers too), so a checkpointed run
of any strategy resumes through this one function.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from logging import INFO
from typing import Protocol, runtime_checkable

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info

from .event_loop import GridEventLoop

__all__ = ["ReportsRounds", "RunAware", "TrainsRounds", "round_log", "run_rounds"]


@runtime_checkable
class RunAware(Protocol):
    """A strategy that needs the run's number of rounds and exchange timeout (DynamicFL:
    its cosine schedule's T, the timeout of each sync event)."""

    def start_run(self, num_rounds: int, timeout: float | None) -> None:
        """Called once by :func:`run_rounds` before the first round."""


@runtime_checkable
class ReportsRounds(Protocol):
    """A strategy that reports what each round did (every strategy of this package)."""

    def round_log(self, server_round: int) -> dict[str, object]:
        """Round ``server_round``'s run-log items (``strategies.contract`` keys)."""


@runtime_checkable
class TrainsRounds(Protocol):
    """An engine that runs a round's training half itself (every engine of this package)."""

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, loop: GridEventLoop, timeout: float | None
                    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Round ``server_round``'s new model (None: kept) and its training metrics."""


def round_log(strategy: object, server_round: int) -> dict[str, object]:
    """The strategy's report of ``server_round`` as run-log items; empty for a strategy that
    keeps none (Flower's own)."""
    return strategy.round_log(server_round) if isinstance(strategy, ReportsRounds) else {}


def run_rounds(
    strategy: Strategy,
    grid: Grid,
    initial_arrays: ArrayRecord,
    num_rounds: int = 3,
    timeout: float = 3600,
    train_config: ConfigRecord | None = None,
    evaluate_config: ConfigRecord | None = None,
    evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    first_round: int = 1,
) -> Result:
    """Rounds ``first_round``..``num_rounds`` of ``strategy`` (module docstring); Flower's
    ``Result``."""
    if isinstance(first_round, bool) or not isinstance(first_round, int) or first_round < 1:
        raise ValueError(f"first_round must be an integer >= 1, got {first_round!r}")
    log(INFO, "Starting %s strategy:", type(strategy).__name__)
    log_strategy_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
    if first_round > 1:
        log(INFO, "\t├──> Resuming at round %d (rounds 1..%d are in the checkpoint)",
            first_round, first_round - 1)
    strategy.summary()
    log(INFO, "")
    if isinstance(strategy, RunAware):
        strategy.start_run(num_rounds, timeout)
    train_config = ConfigRecord() if train_config is None else train_config
    evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
    loop: GridEventLoop[int] = GridEventLoop(grid)
    result = Result()
    started = time.time()
    if evaluate_fn and first_round <= 1:
        res = evaluate_fn(0, initial_arrays)
        if res is not None:  # None: the caller logs it itself (the app's round table)
            log(INFO, "Initial global evaluation results: %s", res)
            result.evaluate_metrics_serverapp[0] = res
    arrays = result.arrays = initial_arrays
    for current in range(first_round, num_rounds + 1):
        log(INFO, "")
        log(INFO, "[ROUND %s/%s]", current, num_rounds)
        if isinstance(strategy, TrainsRounds):
            new, train_metrics = strategy.train_round(current, arrays, train_config, grid,
                                                      loop, timeout)
        else:
            replies = loop.exchange(
                strategy.configure_train(current, arrays, train_config, grid), timeout)
            new, train_metrics = strategy.aggregate_train(current, replies)
            del replies  # aggregated: let the model-sized replies go before the next exchange
        if new is not None:
            arrays = result.arrays = new
        if train_metrics is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", train_metrics)
            result.train_metrics_clientapp[current] = train_metrics
        replies = loop.exchange(
            strategy.configure_evaluate(current, arrays, evaluate_config, grid), timeout)
        evaluate_metrics = strategy.aggregate_evaluate(current, replies)
        del replies
        if evaluate_metrics is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", evaluate_metrics)
            result.evaluate_metrics_clientapp[current] = evaluate_metrics
        if evaluate_fn:
            res = evaluate_fn(current, arrays)
            if res is not None:  # None: evaluated in the background, logged when it ends
                log(INFO, "Global evaluation")
                log(INFO, "\t└──> MetricRecord: %s", res)
                result.evaluate_metrics_serverapp[current] = res
    log(INFO, "")
    log(INFO, "Strategy execution finished in %.2fs", time.time() - started)
    log(INFO, "")
    log(INFO, "Final results:")
    log(INFO, "")
    for line in io.StringIO(str(result)):
        log(INFO, "\t%s", line.strip("\n"))
    log(INFO, "")
    return result

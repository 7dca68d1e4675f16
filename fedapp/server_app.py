"""ServerApp: run config -> strategy (registry), initial model, server-side evaluation, run log."""

from __future__ import annotations

import platform
import random
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from logging import ERROR, INFO, WARNING
from pathlib import Path

import flwr
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedapp.flower_logs import quiet_flower_lines
from fedapp.flower_patches import shorten_object_pulls
from strategies import contract as C
from strategies.engine import records
from strategies.engine.devices import write_trace
from strategies.engine.packing import PackedGrid
from strategies.engine.participation import Participation
from strategies.engine.rounds import round_log
from task.data import DataNotFoundError
from task.heap import unmap_large_blocks
from task.device_plot import plot_device_profiles
from task.partition import plot_label_histogram

from .checkpoint import (Checkpointer, arrays_of, check_compatible, check_model, load_checkpoint,
                         restore_rng, restore_strategy, run_rounds)
from .config import ConfigError, RunConfig
from .chance import ChanceWatch, chance_cause
from .divergence import DivergenceWatch, likely_cause
from .evaluation_process import (EvaluationProcess, EvaluationResult, EvaluationSpec,
                                 evaluation_process, peak_rss_mb)
from .grid import ServerAppGrid
from .partition_map import bind_partition_map
from .registry import Built, ModelFacts, build_strategy
from .run_log import RunLog, format_table, model_sha256, table_header, table_row
from .run_outputs import LiveOutputs, write_run_outputs
from .tracking import check_installed

app = ServerApp()
SERVER_DATA_NOTE = (" (the ServerApp evaluates every round's global model on the test set, so "
                    "the host it runs on, the SuperLink host when deployed, needs the dataset "
                    "too: docs/deployment.md)")


class ServerEvaluator:
    """``evaluate_fn`` for ``Strategy.start``: evaluation on the run's ``evaluation-split``
    (the test split, or the validation split held out of the training split) and one run-log
    record per round.

    Flower calls it once round r's update is aggregated (round 0: before training). Round
    r's record holds the strategy's round report (``round_log``), the timings and, on the rounds that are
    evaluated (``eval_every`` k: rounds 0, k, 2k, ... and always the last), the
    accuracy and loss on that split; a record of a round that is not evaluated has no
    accuracy, loss or eval-seconds. The evaluations run in the ServerApp's evaluation process
    (fedapp.evaluation_process), which holds the model and the evaluated split. With
    ``overlap`` round r's model is evaluated there on one torch thread at nice 19 while round r + 1
    trains (Ray runs the ClientApps at nice 15, so on a machine whose cores all train it
    takes its CPU from theirs: its latency is hidden, its CPU is not): the end of round
    r + 1 waits for it, so the records (and checkpoints) stay in round order, and the last
    round's evaluation is waited for.
    The records are the same as without ``overlap``, apart from the timing keys.

    ``wall-seconds`` is the round's time on the server's critical path: from the end of
    the previous round to the end of this one, where a round ends when the server can go
    on (its update aggregated, an evaluation still running waited for, and its own
    evaluation done unless it runs in the background); the last round ends when its
    record is written. ``eval-seconds`` is the evaluation's own time; ``server-max-rss-mb``
    and ``eval-max-rss-mb`` the peak memory of the ServerApp's process and of its evaluation
    process.
    """

    def __init__(self, process: EvaluationProcess, strategy, run_log: RunLog, *,
                 eval_every: int = 1, last_round: int | None = None,
                 overlap: bool = False, participation: Participation | None = None,
                 plots: bool = False) -> None:
        self.process = process
        self.strategy = strategy
        self.participation = participation  # the strategy's (None: Flower's own classes)
        self.run_log = run_log
        self.eval_every = int(eval_every)
        self.last_round = last_round
        self.records: list[dict] = []
        self.outputs = LiveOutputs(run_log.directory, plots)
        self.started = self.last = time.perf_counter()
        self.checkpointer: Checkpointer | None = None  # checkpoint-every
        self.divergence = DivergenceWatch()  # one warning when the test loss diverges
        self.at_chance = ChanceWatch(2)  # one warning when nothing is learnt (run() sets it)
        # waits for the evaluation process while round r + 1 trains, then writes round r
        self.worker = (ThreadPoolExecutor(1, thread_name_prefix="fedhetero-eval")
                       if overlap else None)
        self.pending: Future | None = None
        self.last_evaluated: ArrayRecord | None = None

    def evaluates(self, server_round: int) -> bool:
        """Round 0, every ``eval_every``-th round and the last round are evaluated."""
        return server_round % self.eval_every == 0 or server_round == self.last_round

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        self.wait()  # the previous round's evaluation: records in order, one at a time
        evaluated = self.evaluates(server_round)
        background = evaluated and self.worker is not None and server_round != self.last_round
        result = None if background or not evaluated else self.evaluate(arrays)
        now = time.perf_counter()
        record = {
            C.LOG_ROUND: server_round,
            C.LOG_WALL_SECONDS: now - self.last,
            C.LOG_ELAPSED_SECONDS: now - self.started,
            C.LOG_MODEL_SHA256: model_sha256(arrays),
        }
        record.update(round_log(self.strategy, server_round))
        self.last = now
        # what a checkpoint and the partition plot need, taken before the next round starts
        checkpoint = (self.checkpointer.snapshot(server_round, arrays, now - self.started)
                      if self.checkpointer is not None else None)
        partitions = self.partition_counts() if server_round == 1 else None
        if background:
            self.pending = self.worker.submit(
                lambda: self.finish(record, self.evaluate(arrays, True), checkpoint, partitions))
            return None
        self.finish(record, result, checkpoint, partitions)
        return (None if result is None else
                MetricRecord({C.LOG_ACCURACY: result.accuracy, C.LOG_LOSS: result.loss}))

    def evaluate(self, arrays: ArrayRecord, background: bool = False) -> EvaluationResult:
        """Loss and accuracy of ``arrays`` on the evaluated split, by the evaluation process; the
        last evaluated model is the final one (the last round is always evaluated)."""
        self.last_evaluated = arrays
        # to_numpy reads the .npy headers through the trust gate's cache, not np.load's
        # ast.literal_eval: CPython 3.11.7 can fail an AST parse that runs beside another
        # thread's ("AST constructor recursion depth mismatch", fixed in later 3.11s), and
        # this runs in the evaluation thread while the round's replies are parsed
        return self.process.evaluate(records.to_numpy(arrays), background)

    def save_final_model(self) -> Path:
        """final_model.pt: the last evaluated model, written by the evaluation process."""
        arrays = self.last_evaluated
        return self.process.save_model(records.to_numpy(arrays), self.run_log.model_path)

    def finish(self, record: dict, result: EvaluationResult | None,
               checkpoint: dict | None, partitions: list | None) -> None:
        """Complete round r's record, append it to the run log, plot, checkpoint."""
        if result is not None:
            record[C.LOG_ACCURACY] = result.accuracy
            record[C.LOG_LOSS] = result.loss
            record[C.LOG_EVAL_SECONDS] = result.seconds
            record[C.LOG_EVAL_MAX_RSS_MB] = result.peak_rss_mb
            if result.width_accuracy:
                record[C.LOG_WIDTH_ACCURACY] = {f"{r:g}": a
                                                for r, a in sorted(result.width_accuracy.items())}
        record[C.LOG_SERVER_MAX_RSS_MB] = peak_rss_mb()
        self.records.append(record)
        self.run_log.append_round(record)
        self.outputs.update()  # metrics.csv, summary.json (and the plots when due) now
        if partitions:  # round 1: the counts now, the plot after the last round (matplotlib)
            self.run_log.write_json("partitions.json", dict(partitions))
        if record[C.LOG_ROUND] == 0:
            log(INFO, "Per-round results (also in %s):", self.run_log.rounds_path)
            log(INFO, table_header())
        log(INFO, table_row(record))
        stuck = self.at_chance.check(record)
        if stuck is not None:
            log(WARNING, "%s", stuck)
        found = self.divergence.check(record)
        if found is not None:
            log(WARNING, "%s", self.divergence.warning(found))
        if checkpoint is not None:
            self.checkpointer.write(checkpoint, self.records)

    def wait(self) -> None:
        """Until the evaluation running in the background (if any) is written; its error,
        if it failed, is raised here."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the background evaluation and stop its thread."""
        try:
            self.wait()
        finally:
            if self.worker is not None:
                self.worker.shutdown(wait=True)

    def resume(self, payload: dict, source: str) -> None:
        """Continue a checkpoint's run log: its rounds 0..r, elapsed time and partition plots."""
        self.records = [dict(r) for r in payload["records"]]
        for record in self.records:
            self.run_log.append_round(record)
        self.started = time.perf_counter() - payload[C.LOG_ELAPSED_SECONDS]
        for name in ("partitions.json", "label_distribution.png", "device_profiles.csv",
                     "device_profiles.png"):
            if (Path(source) / name).is_file():
                shutil.copyfile(Path(source) / name, self.run_log.directory / name)
        log(INFO, "Resuming %s after round %d (run log continues in %s):", source, payload["round"],
            self.run_log.rounds_path)
        log(INFO, table_header())
        for record in self.records:
            log(INFO, table_row(record))

    def list_devices(self) -> None:
        """device_profiles.csv (the trace format) + device_profiles.png of the simulated clock's
        fleet, for the partitions the clients reported."""
        participation = self.participation
        timer = participation.timer if participation is not None else None
        pids = sorted({info.partition_id for info in participation.clients.values()
                       if info.partition_id is not None}) if timer is not None else []
        if timer is None or not pids:
            return
        devices = timer.clock.fleet.profiles(pids)
        write_trace(self.run_log.directory / "device_profiles.csv", devices)
        path = self.run_log.directory / "device_profiles.png"
        plot_device_profiles(devices, path, title=f"device profiles of {len(pids)} clients")
        log(INFO, "Device profiles of the simulated clock: %s", path)

    def partition_counts(self) -> list[tuple[str, list[int]]]:
        """(partition id, label counts) of every client that reported them, by partition id."""
        participation = self.participation
        clients = participation.clients if participation is not None else {}
        known = sorted((info.partition_id, list(info.label_counts))
                       for info in list(clients.values())
                       if info.partition_id is not None and info.label_counts)
        return [(str(pid), counts) for pid, counts in known]

    def plot_partitions(self) -> None:
        """partitions.json + label_distribution.png from the clients' reported label counts;
        after the last round, so that matplotlib is not in memory while the rounds run."""
        known = self.partition_counts()
        if not known:
            return
        self.run_log.write_json("partitions.json", dict(known))
        path = self.run_log.directory / "label_distribution.png"
        plot_label_histogram(np.array([counts for _, counts in known]), path,
                             title=f"label distribution of {len(known)} clients")
        log(INFO, "Label distribution of the partitions: %s", path)


def clock_facts(participation: Participation | None, cost: float | None,
                reference_gflops: float) -> dict | None:
    """What the simulated clock was calibrated with (the model's training seconds per
    example, from its FLOPs: task.devices, counted by the evaluation process), for
    config.json; None without a clock."""
    timer = participation.timer if participation is not None else None
    if timer is None:
        return None
    log(INFO, "Simulated clock: %.4g s per training example on the reference device "
        "(%g GFLOP/s)", cost, reference_gflops)
    return {"seconds-per-example": cost, "reference-gflops": reference_gflops,
            "deadline": timer.deadline}


def evaluation_facts(cfg: RunConfig, info: dict) -> dict:
    """What the run's accuracy and loss are measured on, for config.json (and a log line):
    the split's name, its examples and, for ``validation``, the share held out of the
    training split (a report can then tell tuning numbers from test numbers)."""
    facts = {"split": cfg.evaluation_split, "examples": info["evaluation-examples"]}
    if cfg.evaluation_split == "validation":
        facts["validation-fraction"] = cfg.validation_fraction
        log(INFO, "Evaluating on the validation split: %d examples held out of the training "
            "split (validation-fraction=%g), which no client trains on; the test split is not "
            "used in this run", facts["examples"], cfg.validation_fraction)
    return facts


def model_facts(info: dict) -> ModelFacts:
    """What the evaluation process measured of the model, as the registry takes it."""
    return ModelFacts(info.get("seconds-per-example"), info.get("width-spec"),
                      info.get("width-compute"))


def evaluation_spec(cfg: RunConfig, built: Built) -> EvaluationSpec:
    """What the evaluation process needs from the run config and the strategy it builds:
    the clock's reference speed (the model's cost is measured for it), the widths of a
    width strategy (each is evaluated too)."""
    participation = built.participation
    clocked = participation is not None and participation.timer is not None
    submodels = getattr(built.strategy, "submodels", None)
    return EvaluationSpec(
        dataset=cfg.dataset, data_dir=cfg.data_dir, allow_download=cfg.allow_download,
        synthetic_alpha=cfg.synthetic_alpha, synthetic_beta=cfg.synthetic_beta,
        normalize=cfg.normalize, model=cfg.model, seed=cfg.seed, device=cfg.device,
        batch_size=cfg.eval_batch_size, validation_fraction=cfg.held_out_fraction,
        reference_gflops=cfg.device_reference_gflops if clocked else None,
        width_levels=tuple(submodels.rule.levels) if submodels is not None else (),
        model_width=cfg.model_width)


def stopped_before_training(exc: Exception) -> RuntimeError:
    """The one line a user needs (logged; Flower then marks the run failed)."""
    text = f"{exc}{SERVER_DATA_NOTE if isinstance(exc, DataNotFoundError) else ''}"
    log(ERROR, "%s", text)
    return RuntimeError(f"fedhetero stopped before training: {text}")


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Validate the config and data, then run the strategy and write the run log."""
    unmap_large_blocks()  # the replies' buffers go back to the kernel when freed
    shorten_object_pulls()  # the replies' arrays: first retry after 0.05 s, not Flower's 1 s
    quiet_flower_lines()  # Flower's "Federated evaluation will be skipped" (fedapp/flower_logs.py)
    try:
        cfg = RunConfig.from_user_config(context.run_config)
        check_installed(cfg.tracking)  # tensorboard / mlflow, before any training
        built = build_strategy(cfg)  # every rule, before the model is measured
        checkpoint = load_checkpoint(cfg.resume_from) if cfg.resume_from else None  # resume-from
        if checkpoint is not None:
            check_compatible(checkpoint, cfg.to_dict())
    except (ConfigError, ValueError) as exc:
        raise stopped_before_training(exc) from None
    random.seed(cfg.seed)  # Flower's own strategies sample with Python's random (fedavgm, ...)
    try:  # the test split, the seeded initial model (and its FLOPs): in a process of its own
        process = evaluation_process(evaluation_spec(cfg, built))
    except (DataNotFoundError, ValueError) as exc:
        raise stopped_before_training(exc) from None
    try:  # the strategy for the measured model: the calibrated clock, the width spec
        built = build_strategy(cfg, model_facts(process.info))
        bind_partition_map(built, cfg.partition_map)  # node identity (partition-map)
        if checkpoint is not None:  # a planted model of other keys or shapes: refused
            check_model(checkpoint, process.info["arrays"], cfg.resume_from)
            restore_strategy(built.strategy, checkpoint)
    except (ConfigError, ValueError) as exc:
        process.close()
        raise stopped_before_training(exc) from None
    run(cfg, grid, context, built, checkpoint, process)


def packed(grid: Grid, cfg: RunConfig, strategy=None) -> Grid:
    """``grid`` itself, or with ``virtual-clients`` = N > 0 the N virtual clients on its
    SuperNodes (:class:`strategies.engine.packing.PackedGrid`), balanced by each task's examples and,
    for a width strategy, its sub-model's compute share."""
    if cfg.virtual_clients == 0:
        return grid
    log(INFO, "Packed simulation: %d virtual clients (partitions 0 .. %d) on the SuperNodes",
        cfg.virtual_clients, cfg.virtual_clients - 1)
    return PackedGrid(grid, cfg.virtual_clients, getattr(strategy, "packing_cost", None))


def run(cfg: RunConfig, grid: Grid, context: Context, built: Built, checkpoint: dict | None,
        process: EvaluationProcess) -> None:
    """The rounds, with the run log, the evaluations and the final model."""
    info = process.info
    strategy, train_config = built
    clock = clock_facts(built.participation, info["seconds-per-example"],
                        cfg.device_reference_gflops)
    config_dump = {
        "run-config": cfg.to_dict(),
        "run-id": context.run_id,
        "train-config": train_config,
        "dataset-source": info["source"],
        "evaluation": evaluation_facts(cfg, info),
        "resumed-from": ({"run-dir": cfg.resume_from, "round": checkpoint["round"]}
                         if checkpoint else None),
        "device": info["device"],
        "clock": clock,
        "versions": {"flwr": flwr.__version__, "torch": info["torch"],
                     "python": platform.python_version()},
    }
    run_log = RunLog.create(cfg.resolved_output_dir(), cfg.strategy, context.run_id, config_dump,
                            cfg.tracking, cfg.tracking_dir)
    log(INFO, "fedhetero: %s on %s (%s, %s), model %s, run directory %s",
        cfg.strategy, cfg.dataset, cfg.partition, info["source"], cfg.model, run_log.directory)
    evaluator = ServerEvaluator(process, strategy, run_log, eval_every=cfg.eval_every,
                                last_round=cfg.num_server_rounds, overlap=cfg.eval_overlap,
                                participation=built.participation, plots=cfg.run_plots)
    evaluator.checkpointer = Checkpointer(run_log.directory, cfg.checkpoint_every, strategy,
                                          cfg.to_dict())
    evaluator.at_chance = ChanceWatch(info["num-classes"],
                                      chance_cause(cfg.strategy, cfg.lr, cfg.width_scaler))
    evaluator.divergence.cause = likely_cause(
        cfg.strategy, cfg.lr, cfg.server_lr,
        cut_work=cfg.round_deadline > 0 or cfg.straggler_fraction > 0)
    initial_arrays, first_round = arrays_of(info), 1
    if checkpoint is not None:
        initial_arrays, first_round = arrays_of(checkpoint), checkpoint["round"] + 1
        evaluator.resume(checkpoint, cfg.resume_from)
        restore_rng(checkpoint["rng"])  # last: nothing may draw from the global RNGs after this
    try:
        try:
            result = run_rounds(
                strategy,
                grid=ServerAppGrid(packed(grid, cfg, strategy),  # pulls 5 ms .. 0.1 s apart
                                   silence_timeout=cfg.silence_timeout),
                initial_arrays=initial_arrays,
                num_rounds=cfg.num_server_rounds,
                first_round=first_round,
                timeout=cfg.round_timeout,
                train_config=ConfigRecord(train_config),
                evaluate_config=ConfigRecord({C.SEED: cfg.seed}),
                evaluate_fn=evaluator,
            )
        finally:
            evaluator.close()
    except Exception:
        write_run_outputs(run_log.directory, cfg.run_plots)  # the rounds logged before the error
        raise
    del result  # the final global model is the last evaluated one (the last round is evaluated)
    evaluator.plot_partitions()
    evaluator.list_devices()  # the simulated clock's fleet, when the run has one
    path = evaluator.save_final_model()
    run_log.close()
    write_run_outputs(run_log.directory, cfg.run_plots)  # metrics.csv, summary.json, plots: docs/outputs.md
    log(INFO, "Final model: %s", path)
    log(INFO, "Per-round results:\n%s", format_table(evaluator.records))

"""``bench sync-events`` (DynamicFL): seconds per sync event on the simulation engine
against the number of active clients. DynamicSGD (every client syncs after every step,
so a round of L steps is L sync events of all N clients), real ``flwr run`` with N
supernodes, C = 1; the figure is the run log's ``seconds-per-event`` of the warm rounds
(round 1, with Ray actor start and data decoding, is excluded) next to the bare torch
time of one step of all N clients in one process."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedapp.config import RunConfig
from strategies import contract as C
from task.data import PartitionSpec, client_data, load_dataset
from task.models import build_model

from ..runtime import at_least, option_type
from .common import simulation_round_seconds

HELP = "DynamicFL: seconds per sync event vs the number of active clients"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=option_type("num-supernodes"), nargs="+", default=[2, 5, 10])
    p.add_argument("--rounds", type=at_least(2), default=3)
    p.add_argument("--local-steps", type=at_least(1), default=10)
    p.add_argument("--batch-size", type=at_least(1), default=10)
    p.add_argument("--model", default="lenet-gn")
    p.add_argument("--cpus-per-client", type=option_type("client-resources-num-cpus"), default=1,
                   help="CPUs per ClientApp (the parallel workers: CPUs / this)")


def run(args) -> None:
    """seconds per sync event of DynamicSGD on the simulation engine, for each N in --clients."""
    import os  # noqa: PLC0415

    from strategies.client.dynamicfl import chunk_steps as train_chunk  # noqa: PLC0415

    print(
        f"Workload: DynamicSGD (dynamicfl-intervals='a'), Fashion-MNIST IID, {args.model}, B = "
        f"{args.batch_size}, "
        f"L = {args.local_steps} steps per round, {args.rounds} rounds, C = 1; {os.cpu_count()} "
        "CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'active N':>8} {'s/event (warm)':>15} {'min':>7} {'max':>7} "
        f"{'bare step, all N, s':>20} {'round 1 s':>10}"
    )
    rows = []
    for n in args.clients:
        workload = {
            "num-server-rounds": args.rounds,
            "strategy": "dynamicsgd",
            "partition": "iid",
            "model": args.model,
            "dynamicfl-local-steps": args.local_steps,
            "batch-size": args.batch_size,
            "lr": 0.05,
            "fraction-train": 1.0,
            "min-available-nodes": n,
            "drift-diagnostics": False,
        }
        records = simulation_round_seconds(workload, n, args.cpus_per_client, keep_records=True)
        warm = [r[C.LOG_SECONDS_PER_EVENT] for r in records if r[C.LOG_ROUND] >= 2]
        cfg = RunConfig.from_user_config(workload)
        dataset = load_dataset(cfg.dataset)
        parts = [
            client_data(dataset, PartitionSpec(scheme="iid", seed=0), pid, n) for pid in range(n)
        ]
        model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, int(args.cpus_per_client)))  # as a Ray actor gets
        start = time.perf_counter()
        for step in range(args.local_steps):
            for pid, (x, y) in enumerate(parts):
                train_chunk(
                    model,
                    x,
                    y,
                    lr=0.05,
                    batch_size=args.batch_size,
                    start_step=step,
                    num_steps=1,
                    round_steps=args.local_steps,
                    seed=pid,
                )
        bare = (time.perf_counter() - start) / args.local_steps
        torch.set_num_threads(threads)
        round1 = next(r[C.LOG_WALL_SECONDS] for r in records if r[C.LOG_ROUND] == 1)
        rows.append((n, statistics.mean(warm), min(warm), max(warm), bare, round1))
        print(
            f"{n:>8} {rows[-1][1]:>15.3f} {rows[-1][2]:>7.3f} {rows[-1][3]:>7.3f} {bare:>20.4f} "
            f"{round1:>10.1f}",
            flush=True,
        )
    if len(rows) >= 2:
        (n0, t0, *_), (n1, t1, *_) = rows[0], rows[-1]
        print(
            f"\nslope: {(t1 - t0) / (n1 - n0) * 1e3:.1f} ms per extra active client per sync event "
            f"(N = {n0} -> {n1}); intercept ~ {t0 - n0 * (t1 - t0) / (n1 - n0):.3f} s"
        )

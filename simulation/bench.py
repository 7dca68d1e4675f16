"""Benchmarks (printed as ratios measured in one run; never asserted in tests).

``python -m simulation bench`` (no sub-command): the issue's three figures in one run:
(a) ``efficiency`` on the standard workload, (b) ``aggregation`` of every strategy against
Flower's FedAvg on the same replies, (c) the ServerApp's peak memory (from (a)) and the
aggregation's peak extra memory (from (b)).

``python -m simulation bench overhead``:

(a) wall time of FedAvg rounds on Flower's simulation engine (real ``flwr run``,
    Ray backend) against the bare torch time of the same SGD steps in one process,
    as a ratio; the first round (actor start, data decoding) is reported apart;
(b) our ClientApp's per-message overhead beyond Flower's own: the time a warm
    ``@app.train`` call spends outside SGD (record <-> tensor conversion, data and
    model lookup, reply building), measured in-process.

``python -m simulation bench efficiency`` (standard workload: Fashion-MNIST, McMahan CNN,
20 clients, 5 rounds, E = 1): simulation efficiency = ideal time / our wall time, where
the ideal is the bare torch time of the same local SGD (one thread per client, as the
Ray actors get) divided by the number of parallel workers; round 1 (Ray and actor
start-up, data decoding) is excluded; plus the ServerApp's peak memory (max RSS). As a
profile, the same bare SGD also runs split over that many processes at once: the
ideal's parallelism measured (shared caches and memory bandwidth included), so the
remaining gap is the simulation's own (Ray, Flower's messaging, our ClientApp).

``python -m simulation bench aggregation``: each strategy's ``aggregate_train`` against
Flower's FedAvg on the same replies (default 100 replies of the 1,663,370-parameter
McMahan CNN): time ratio (best of interleaved repeats) and peak memory beyond the
replies, in model-sized buffers (tracemalloc).

``python -m simulation bench import``: ``import strategies`` against
``import flwr.serverapp.strategy`` in fresh interpreters (what a Flower user imports anyway).

``python -m simulation bench sync-events`` (DynamicFL): seconds per sync event on the
simulation engine against the number of active clients. DynamicSGD (every client syncs
after every step, so a round of L steps is L sync events of all N clients), real
``flwr run`` with N supernodes, C = 1; the figure is the run log's ``seconds-per-event``
of the warm rounds (round 1, with Ray actor start and data decoding, is excluded) next
to the bare torch time of one step of all N clients in one process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedapp.config import RunConfig
from fedapp.registry import train_config
from strategies import contract as C
from task.data import PartitionSpec, client_data, load_dataset
from task.models import build_model
from task.train import client_seed, local_sgd

from .runtime import run_app


def _workload(args) -> dict:
    return {
        "num-server-rounds": args.rounds, "partition": "iid", "model": args.model,
        "local-epochs": args.epochs, "batch-size": args.batch_size, "lr": 0.05,
        "dataset": "fashion-mnist", "min-available-nodes": args.clients,
    }


def bare_torch_round_seconds(workload: dict, num_clients: int, rounds: int) -> list[float]:
    """Sequential local SGD of every client, one process: seconds per round."""
    cfg = RunConfig.from_user_config(workload)
    dataset = load_dataset(cfg.dataset)
    spec = PartitionSpec(scheme=cfg.partition, seed=cfg.seed)
    parts = [client_data(dataset, spec, pid, num_clients) for pid in range(num_clients)]
    torch.manual_seed(cfg.seed)
    global_model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
    model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
    times = []
    for server_round in range(1, rounds + 1):
        start = time.perf_counter()
        for pid, (x, y) in enumerate(parts):
            model.load_state_dict(global_model.state_dict())
            local_sgd(model, x, y, lr=cfg.lr, batch_size=cfg.batch_size, epochs=cfg.local_epochs,
                      seed=client_seed(cfg.seed, server_round, pid))
        times.append(time.perf_counter() - start)
    return times


def simulation_round_seconds(workload: dict, num_clients: int, cpus_per_client: float,
                             federation: dict | None = None, keep_records: bool = False) -> list:
    """Per-round wall seconds (or the whole records) of a real ``flwr run``, from the run log."""
    federation = {
        "client-resources-num-cpus": cpus_per_client,
        **(federation or {}),
        "num-supernodes": num_clients,
    }
    with tempfile.TemporaryDirectory(prefix="fedhetero-bench-") as tmp:
        out = Path(tmp) / "runs"
        result = run_app(
            {**workload, "output-dir": str(out)},
            federation,
            flwr_home=Path(tmp) / "flwr-home",
            isolate_ports=True,
            capture=True,
            timeout=1800,
        )
        runs = list(out.glob("*/rounds.jsonl"))
        if result.returncode != 0 or not runs:
            raise RuntimeError(f"flwr run ended {result.status}:\n{result.output[-3000:]}")
        records = [json.loads(line) for line in runs[0].read_text().splitlines() if line.strip()]
    return (
        records if keep_records else [r[C.LOG_WALL_SECONDS] for r in records if r[C.LOG_ROUND] >= 1]
    )


def bare_client_seconds(
    workload: dict,
    num_clients: int,
    rounds: list[int],
    threads: int,
    clients: list[int] | None = None,
    ready=None,
) -> list[float]:
    """Per round: the summed bare-torch seconds of the local SGD of ``clients`` (default: all)
    with ``threads`` threads; ``ready`` (a barrier) is awaited once the data is loaded."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cfg = RunConfig.from_user_config(workload)
        dataset = load_dataset(cfg.dataset)
        spec = PartitionSpec(scheme=cfg.partition, seed=cfg.seed)
        pids = list(range(num_clients)) if clients is None else clients
        parts = {pid: client_data(dataset, spec, pid, num_clients) for pid in pids}
        torch.manual_seed(cfg.seed)
        start_model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
        model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
        if ready is not None:
            ready.wait()
        totals = []
        for server_round in rounds:
            total = 0.0
            for pid, (x, y) in parts.items():
                model.load_state_dict(start_model.state_dict())
                start = time.perf_counter()
                local_sgd(
                    model,
                    x,
                    y,
                    lr=cfg.lr,
                    batch_size=cfg.batch_size,
                    epochs=cfg.local_epochs,
                    seed=client_seed(cfg.seed, server_round, pid),
                )
                total += time.perf_counter() - start
            totals.append(total)
        return totals
    finally:
        torch.set_num_threads(previous)


_BARRIER = None  # set in each pool process by _init_bare_worker


def _init_bare_worker(barrier) -> None:
    global _BARRIER  # noqa: PLW0603 - the pool initializer's only way to hand the barrier over
    _BARRIER = barrier


def _bare_worker(job: tuple) -> float:
    workload, num_clients, rounds, threads, clients = job
    return sum(
        bare_client_seconds(workload, num_clients, rounds, threads, clients=clients, ready=_BARRIER)
    )


def bare_parallel_seconds(
    workload: dict, num_clients: int, rounds: list[int], threads: int, workers: int
) -> float:
    """Wall seconds of the same local SGD split over ``workers`` processes started together
    (clients dealt round-robin): the ideal's parallel half, measured, memory contention included."""
    import multiprocessing  # noqa: PLC0415

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers)
    jobs = [
        (workload, num_clients, rounds, threads, list(range(w, num_clients, workers)))
        for w in range(workers)
    ]
    with context.Pool(workers, initializer=_init_bare_worker, initargs=(barrier,)) as pool:
        return max(pool.map(_bare_worker, jobs))


def efficiency(args) -> None:
    import os  # noqa: PLC0415

    workload = {**_workload(args), "drift-diagnostics": False}
    cpus = os.cpu_count() or 1
    gpu = torch.cuda.is_available()
    workers = (
        max(1, int(cpus // args.cpus_per_client))
        if not gpu
        else max(1, int(1 / args.gpus_per_client))
    )
    print(
        f"Workload: Fashion-MNIST IID, {args.model}, {args.clients} clients, {args.rounds} "
        f"rounds, E={args.epochs}, "
        f"B={args.batch_size}; {cpus} CPUs, {'GPU' if gpu else 'no GPU'}, {workers} parallel "
        "ClientApp workers"
    )
    federation = {"client-resources-num-cpus": args.cpus_per_client}
    if gpu:
        federation["client-resources-num-gpus"] = args.gpus_per_client
    sim = simulation_round_seconds(
        workload, args.clients, args.cpus_per_client, federation, keep_records=True
    )
    warm = [r for r in sim if r[C.LOG_ROUND] >= 2]
    ours = sum(r[C.LOG_WALL_SECONDS] for r in warm)
    evals = sum(r.get(C.LOG_EVAL_SECONDS, 0.0) for r in warm)
    bare = bare_client_seconds(
        workload,
        args.clients,
        list(range(2, args.rounds + 1)),
        threads=max(1, int(args.cpus_per_client)),
    )
    ideal = sum(bare) / workers
    parallel = (
        bare_parallel_seconds(
            workload,
            args.clients,
            list(range(2, args.rounds + 1)),
            max(1, int(args.cpus_per_client)),
            workers,
        )
        if workers > 1 and not gpu
        else None
    )
    print(
        f"\n(a) simulation efficiency, rounds 2..{args.rounds} (round 1 = start-up, "
        f"{sim[1][C.LOG_WALL_SECONDS]:.1f} s, excluded)"
    )
    print(
        f"    bare torch local SGD, all clients, 1 thread each: {sum(bare):.1f} s -> ideal with "
        f"{workers} workers {ideal:.1f} s"
    )
    print(f"    our wall time (flwr run, Ray backend):            {ours:.1f} s")
    print(
        f"      of which the ServerApp's test-set evaluation:   {evals:.1f} s (10k images after "
        "every round; "
        "the ideal has none)"
    )
    print(f"      the rest (rounds: messages, ClientApps, aggregation): {ours - evals:.1f} s")
    print(f"    efficiency = ideal / ours = {ideal / ours:.2f}   (target >= 0.8)")
    print(
        f"    efficiency of the federated training alone = ideal / (ours - evaluation) = "
        f"{ideal / (ours - evals):.2f}"
    )
    if parallel is not None:
        print(
            f"    profile: the same bare torch SGD in {workers} processes at once takes "
            f"{parallel:.1f} s "
            f"({parallel / ideal:.2f}x the ideal: cores share caches and memory bandwidth);"
        )
        print(
            f"      against that measured parallel baseline, the federated rounds run at "
            f"{parallel / (ours - evals):.2f} (Ray, Flower's messaging, our ClientApp and "
            "aggregation)"
        )
    print(
        "\n(c) ServerApp peak memory (max RSS): "
        f"{max(r[C.LOG_SERVER_MAX_RSS_MB] for r in sim):.0f} MB"
    )


def client_overhead_ms(repeats: int = 30) -> tuple[float, float, float]:
    """(train call ms, SGD-only ms, overhead ms) for a warm 1-step @app.train call."""
    from flwr.app import (  # noqa: PLC0415
        ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict)
    from flwr.supercore.task_identity import TaskIdentity  # noqa: PLC0415

    from fedapp.client_app import app  # noqa: PLC0415

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    run_config = {"model": "cnn-small", "partition": "iid", "local-steps": 1}
    cfg = RunConfig.from_user_config(run_config)
    context = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0, "num-partitions": 10},
        state=RecordDict(),
        run_config=run_config,
    )
    dataset = load_dataset(cfg.dataset)
    model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
    config = ConfigRecord({**train_config(cfg), C.SERVER_ROUND: 1})
    message = Message(
        RecordDict({C.ARRAYS: ArrayRecord(model.state_dict()), C.CONFIG: config}),
        message_type=MessageType.TRAIN,
        dst_node_id=1,
    )
    x, y = client_data(dataset, PartitionSpec(scheme="iid", seed=0), 0, 10)

    def timed(fn) -> float:
        fn()  # warm
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e3

    call = timed(lambda: app(message, context))
    sgd = timed(lambda: local_sgd(model, x, y, lr=0.05, batch_size=cfg.batch_size, steps=1, seed=1))
    return call, sgd, call - sgd


def overhead(args) -> None:
    workload = _workload(args)
    print(
        f"Workload: Fashion-MNIST IID, model {args.model}, {args.clients} clients, {args.rounds} "
        "rounds, "
        f"E={args.epochs}, B={args.batch_size}; device "
        f"{'cuda' if torch.cuda.is_available() else 'cpu'}, "
        f"{torch.get_num_threads()} torch threads in this process"
    )
    sim = simulation_round_seconds(workload, args.clients, args.cpus_per_client)
    bare = bare_torch_round_seconds(workload, args.clients, args.rounds)
    warm_sim, warm_bare = statistics.mean(sim[1:]), statistics.mean(bare[1:])
    print("\n(a) FedAvg round wall time, simulation engine vs bare torch (same SGD steps)")
    print(f"    simulation, round 1 (actor start + data decoding): {sim[0]:.2f} s")
    print(f"    simulation, rounds 2..{args.rounds} mean:                {warm_sim:.2f} s")
    print(f"    bare torch, one process, rounds 2..{args.rounds} mean:   {warm_bare:.2f} s")
    print(f"    ratio simulation / bare torch (warm rounds):      {warm_sim / warm_bare:.2f}")
    call, sgd, extra = client_overhead_ms()
    print("\n(b) ClientApp per-message overhead (warm, in-process, 1 SGD step, median)")
    print(
        f"    @app.train call {call:.2f} ms, SGD alone {sgd:.2f} ms -> overhead {extra:.2f} ms "
        f"per message (target <= 20 ms)"
    )


def _replies(num_replies: int, model: str):
    """Train replies as a Flower SuperLink would hand them to aggregate_train."""
    import numpy as np  # noqa: PLC0415
    from flwr.app import (
        Array,
        ArrayRecord,
        ConfigRecord,
        Message,
        MessageType,
        MetricRecord,
        RecordDict,
    )  # noqa: PLC0415
    from flwr.supercore.task_identity import TaskIdentity  # noqa: PLC0415

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    torch.manual_seed(0)
    net = build_model(model, (1, 28, 28), 10)
    global_arrays = ArrayRecord(net.state_dict())
    rng = np.random.default_rng(0)
    replies = []
    for i in range(num_replies):
        arrays = ArrayRecord(
            {
                k: Array((v.numpy() + 0.01 * rng.standard_normal(v.shape)).astype(v.numpy().dtype))
                for k, v in net.state_dict().items()
            }
        )
        instruction = Message(
            RecordDict({C.CONFIG: ConfigRecord()}),
            message_type=MessageType.TRAIN,
            dst_node_id=i + 1,
        )
        metrics = MetricRecord(
            {C.NUM_EXAMPLES: 100 + 7 * i, C.TRAIN_LOSS: 1.0, C.LOCAL_STEPS_TAKEN: 10 + i}
        )
        replies.append(
            Message(RecordDict({C.ARRAYS: arrays, C.METRICS: metrics}), reply_to=instruction)
        )
    return global_arrays, replies, sum(v.numel() for v in net.state_dict().values()) * 4


def aggregation(args) -> None:
    import tracemalloc  # noqa: PLC0415

    from flwr.serverapp.strategy import FedAvg as FlowerFedAvg  # noqa: PLC0415

    from flwr.app import ArrayRecord  # noqa: PLC0415

    from strategies import FedAvg, FedNova, FedProx, FedVeca  # noqa: PLC0415

    import logging  # noqa: PLC0415

    logging.getLogger("flwr").setLevel(logging.ERROR)  # no per-call log lines between the timings
    global_arrays, replies, model_bytes = _replies(args.replies, args.model)
    _, veca_replies, _ = _replies(args.replies, args.model)
    for reply in (
        veca_replies
    ):  # FedVeca's extra payload: grad F_i(w_k) (as large as the model), beta, delta
        reply.content[C.GRAD] = ArrayRecord(dict(reply.content[C.ARRAYS].items()))
        reply.content[C.METRICS][C.BETA], reply.content[C.METRICS][C.DELTA] = 1.0, 0.5
    replies_of = {"FedVeca": veca_replies}
    nodes = [r.metadata.src_node_id for r in replies]
    contenders = {"Flower FedAvg": FlowerFedAvg()}
    for name, strategy in {
        "FedAvg": FedAvg(),
        "FedProx": FedProx(proximal_mu=0.01),
        "FedNova": FedNova(),
        "FedVeca": FedVeca(),
    }.items():
        strategy.current_arrays, strategy.all_nodes = global_arrays, nodes
        strategy.draws = {n: 1 for n in nodes}
        contenders[name] = strategy
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, strategy in contenders.items():
            start = time.perf_counter()
            strategy.aggregate_train(1, replies_of.get(name, replies))
            times[name].append(time.perf_counter() - start)
    peaks = {}
    for name, strategy in contenders.items():
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        strategy.aggregate_train(1, replies_of.get(name, replies))
        peaks[name] = (tracemalloc.get_traced_memory()[1] - base) / model_bytes
        tracemalloc.stop()
    flower = min(times["Flower FedAvg"])
    print(
        f"Aggregation of {args.replies} replies of {args.model} ({model_bytes / 1e6:.2f} MB "
        "float32 each; "
        f"FedVeca's also carry the gradient); best of {args.repeats} interleaved repeats"
    )
    print(
        f"{'strategy':<14} {'seconds':>8} {'vs Flower FedAvg':>17} "
        f"{'peak extra memory (model sizes)':>32}"
    )
    for name in contenders:
        print(
            f"{name:<14} {min(times[name]):>8.3f} {min(times[name]) / flower:>17.2f} "
            f"{peaks[name]:>32.2f}"
        )


def import_seconds(statement: str, repeats: int) -> float:
    """Median wall seconds of ``statement`` in fresh interpreters (interpreter start excluded)."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    samples = [
        float(
            subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
        )
        for _ in range(repeats)
    ]
    return statistics.median(samples)


def import_cost(args) -> None:
    """``import strategies`` against the Flower import a strategy user has anyway."""
    baseline = "import flwr.serverapp.strategy"
    ours = "import strategies"
    times = {}
    for _ in range(2):  # interleave, in case the machine's load changes
        for statement in (baseline, ours):
            times.setdefault(statement, []).append(import_seconds(statement, args.repeats))
    base, mine = min(times[baseline]), min(times[ours])
    print(f"fresh interpreters, median of {args.repeats}, best of 2 interleaved rounds")
    print(f"  {baseline:<32} {base:.3f} s")
    print(
        f"  {ours:<32} {mine:.3f} s   ratio {mine / base:.2f} (target <= 1.0 + noise; torch is "
        "not imported)"
    )


def sync_events(args) -> None:
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench sub-commands and their options."""
    sub = parser.add_subparsers(
        dest="bench", metavar="BENCH", help="one benchmark (default: efficiency, then aggregation)"
    )
    p = sub.add_parser("overhead", help="simulation vs bare torch, and ClientApp overhead")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--model", default="cnn-small")
    p.add_argument("--cpus-per-client", type=float, default=1)
    p = sub.add_parser(
        "efficiency", help="simulation efficiency vs ideal parallel bare torch; server memory"
    )
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--model", default="cnn-mcmahan")
    p.add_argument("--cpus-per-client", type=float, default=1)
    p.add_argument("--gpus-per-client", type=float, default=0.25)
    p = sub.add_parser("aggregation", help="aggregate_train time and memory vs Flower's FedAvg")
    p.add_argument("--replies", type=int, default=100)
    p.add_argument("--model", default="cnn-mcmahan")
    p.add_argument("--repeats", type=int, default=5)
    p = sub.add_parser(
        "sync-events", help="DynamicFL: seconds per sync event vs the number of active clients"
    )
    p.add_argument("--clients", type=int, nargs="+", default=[2, 5, 10])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--model", default="lenet-gn")
    p.add_argument("--cpus-per-client", type=float, default=1)
    p = sub.add_parser("import", help="import cost of strategies vs flwr.serverapp.strategy")
    p.add_argument("--repeats", type=int, default=7)


BENCHES = {
    "overhead": overhead,
    "aggregation": aggregation,
    "efficiency": efficiency,
    "sync-events": sync_events,
    "import": import_cost,
}


def run(args: argparse.Namespace) -> int:
    """One benchmark, or the standard figures (a), (b), (c) in one run."""
    if args.bench is not None:
        BENCHES[args.bench](args)
        return 0
    for name in ("efficiency", "aggregation"):
        print(f"\n===== python -m simulation bench {name} =====", flush=True)
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        BENCHES[name](parser.parse_args([name]))
    return 0

"""What the benchmarks share: the standard workload, real ``flwr run`` round times from
the run log, and the bare torch time of the same local SGD (one process or several), on the
device the ClientApps and the ServerApp use (``device = "auto"``: CUDA when present)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

from fedapp.config import RunConfig
from fedapp.run_log import read_rounds
from strategies import contract as C
from task.data import PartitionSpec, client_data, load_dataset
from task.evaluate import evaluate
from task.heap import keep_step_memory
from task.layout import inference_layout, training_layout
from task.models import build_model
from strategies.client import client_seed, local_sgd
from task.train import resolve_device

from ..runtime import at_least, option_type, run_app


def add_workload_arguments(p, *, clients: int, rounds: int, model: str, rounds_help: str) -> None:
    """The options :func:`workload` reads (and ``--cpus-per-client``), with a bench's defaults."""
    p.add_argument("--clients", type=option_type("num-supernodes"), default=clients,
                   help="simulated clients (SuperNodes)")
    p.add_argument("--rounds", type=at_least(2), default=rounds, help=rounds_help)
    p.add_argument("--epochs", type=at_least(1), default=1, help="local epochs E")
    p.add_argument("--batch-size", type=at_least(1), default=32, help="local batch size B")
    p.add_argument("--model", default=model, help="model name (task.models)")
    p.add_argument("--cpus-per-client", type=option_type("client-resources-num-cpus"), default=1,
                   help="CPUs per ClientApp (the parallel workers: CPUs / this)")


def workload(args) -> dict:
    return {
        "num-server-rounds": args.rounds, "partition": "iid", "model": args.model,
        "local-epochs": args.epochs, "batch-size": args.batch_size, "lr": 0.05,
        "dataset": "fashion-mnist", "min-available-nodes": args.clients,
    }


def settled(device: torch.device) -> None:
    """Wait for the device's queued work, so a timer read next measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_setup(workload: dict, num_clients: int, pids: list[int]):
    """(config, device, {pid: (x, y)}, start model, working model) of a bare-torch baseline,
    on the run's device (``device = "auto"``: CUDA when present)."""
    keep_step_memory()  # as the ClientApp's process (fedapp.client_app.task_model)
    cfg = RunConfig.from_user_config(workload)
    device = resolve_device(cfg.device)
    dataset = load_dataset(cfg.dataset, cfg.data_dir)  # the folder the apps read
    spec = PartitionSpec(scheme=cfg.partition, seed=cfg.partition_data_seed)
    parts = {pid: tuple(t.to(device) for t in client_data(dataset, spec, pid, num_clients))
             for pid in pids}
    torch.manual_seed(cfg.seed)
    start_model = build_model(cfg.model, dataset.input_shape, dataset.num_classes).to(device)
    model = build_model(cfg.model, dataset.input_shape, dataset.num_classes).to(device)
    # the ClientApp's layout (fedapp.client_app.task_model): the same local SGD, float for float
    return cfg, device, parts, start_model, training_layout(model, dataset.input_shape)


def bare_torch_round_seconds(workload: dict, num_clients: int, rounds: int) -> list[float]:
    """Sequential local SGD of every client, one process: seconds per round."""
    cfg, device, parts, global_model, model = bare_setup(workload, num_clients,
                                                         list(range(num_clients)))
    times = []
    for server_round in range(1, rounds + 1):
        settled(device)
        start = time.perf_counter()
        for pid, (x, y) in parts.items():
            model.load_state_dict(global_model.state_dict())
            local_sgd(model, x, y, lr=cfg.lr, batch_size=cfg.batch_size, epochs=cfg.local_epochs,
                      seed=client_seed(cfg.seed, server_round, pid))
        times.append(time.perf_counter() - start)
    return times


def simulation_round_seconds(workload: dict, num_clients: int, cpus_per_client: int,
                             federation: dict | None = None, keep_records: bool = False,
                             observer=None) -> list:
    """Per-round wall seconds (or the whole records) of a real ``flwr run``, from the run log;
    ``observer(output_dir)``, if given, is a context manager held around the run."""
    federation = {
        "client-resources-num-cpus": cpus_per_client,
        **(federation or {}),
        "num-supernodes": num_clients,
    }
    with tempfile.TemporaryDirectory(prefix="fedhetero-bench-") as tmp:
        out = Path(tmp) / "runs"
        with observer(out) if observer is not None else contextlib.nullcontext():
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
        records = read_rounds(runs[0].parent)
    return (
        records if keep_records else [r[C.LOG_WALL_SECONDS] for r in records if r[C.LOG_ROUND] >= 1]
    )


BARE_APP = Path(__file__).resolve().parent / "bare_app"
DATA_DIR = "/usr/share/datasets/fashion-mnist"


def run_bare_app(num_clients: int, rounds: int, federation: dict, *, model: str = "cnn-small",
                 data_dir: str = DATA_DIR) -> dict:
    """One real ``flwr run`` of the bare Flower FedAvg app (``bare_app``: Flower's FedAvg, a
    template ClientApp doing one SGD step of B = 32): ``round-ends`` (rounds 0..R, seconds)
    and its ServerApp's ``max-rss-mb``."""
    with tempfile.TemporaryDirectory(prefix="fedhetero-bench-bare-") as tmp:
        times = Path(tmp) / "round_ends.json"
        result = run_app(
            {"num-server-rounds": rounds, "min-available-nodes": num_clients, "model": model,
             "data-dir": data_dir, "times-path": str(times), "lr": 0.05, "batch-size": 32},
            {**federation, "num-supernodes": num_clients},
            flwr_home=Path(tmp) / "flwr-home", isolate_ports=True, capture=True,
            timeout=3600, app_dir=BARE_APP,
        )
        if result.returncode != 0 or not times.is_file():
            raise RuntimeError(f"bare app: flwr run ended {result.status}:\n"
                               f"{result.output[-3000:]}")
        return json.loads(times.read_text())


def bare_app_peak_mb(model: str, num_clients: int, cpus_per_client: int,
                     federation: dict | None = None) -> float:
    """Peak RSS (MB) of the bare Flower app's ServerApp: 2 rounds, one SGD step per client."""
    federation = {"client-resources-num-cpus": cpus_per_client, **(federation or {})}
    return float(run_bare_app(num_clients, 2, federation, model=model)["max-rss-mb"])


def torch_import_mb() -> dict[str, float]:
    """Resident MB of a fresh Python process after ``import torch``: ``peak`` (Linux's
    VmHWM: ``ru_maxrss`` would keep this large process's mark across the child's exec),
    and of what is resident then, ``anonymous`` (the process's own) and ``file`` (pages
    of mapped files, torch's shared libraries); the split is NaN off Linux."""
    code = textwrap.dedent("""
        import json, resource, torch
        keys = {"VmHWM:": "peak", "RssAnon:": "anonymous", "RssFile:": "file"}
        kb = {"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
              "anonymous": float("nan"), "file": float("nan")}
        try:
            with open("/proc/self/status") as status:
                for fields in map(str.split, status):
                    if fields and fields[0] in keys:
                        kb[keys[fields[0]]] = int(fields[1])
        except OSError:
            pass
        print(json.dumps({name: value / 1024 for name, value in kb.items()}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def warm_up(model: torch.nn.Module, parts: dict, cfg: RunConfig) -> None:
    """Two untimed SGD steps of the first client: the process's one-time start-up (oneDNN
    primitives; on CUDA the context, cuDNN and cuBLAS handles, kernel loading) is not
    local SGD, and the simulation's round 1, which pays it in the ClientApps, is excluded
    too. The timed rounds reload the start model, so they train as without it."""
    x, y = next(iter(parts.values()))
    local_sgd(model, x[: 2 * cfg.batch_size], y[: 2 * cfg.batch_size], lr=cfg.lr,
              batch_size=cfg.batch_size, steps=2)
    settled(next(model.parameters()).device)


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
        pids = list(range(num_clients)) if clients is None else clients
        cfg, device, parts, start_model, model = bare_setup(workload, num_clients, pids)
        warm_up(model, parts, cfg)
        if ready is not None:
            ready.wait()
        totals = []
        for server_round in rounds:
            total = 0.0
            for pid, (x, y) in parts.items():
                model.load_state_dict(start_model.state_dict())
                settled(device)
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


def bare_evaluation_seconds(workload: dict, evaluations: int) -> float:
    """Seconds of ``evaluations`` test-set evaluations of the workload's model, as the
    ServerApp's background thread runs them (one torch thread, channels-last, the run's
    eval batch size, the run's device) on an otherwise idle core: the CPU (or GPU) time the
    overlapped evaluations cost."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        keep_step_memory()  # as the ServerApp's evaluation (fedapp.server_app)
        cfg = RunConfig.from_user_config(workload)
        device = resolve_device(cfg.device)
        dataset = load_dataset(cfg.dataset)
        torch.manual_seed(cfg.seed)
        model, x = inference_layout(
            build_model(cfg.model, dataset.input_shape, dataset.num_classes).to(device),
            dataset.x_test.to(device))
        y = dataset.y_test.to(device)
        evaluate(model, x, y, cfg.eval_batch_size)  # oneDNN's (or cuDNN's) first-call set-up
        settled(device)
        start = time.perf_counter()
        for _ in range(evaluations):
            evaluate(model, x, y, cfg.eval_batch_size)
        settled(device)
        return time.perf_counter() - start
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


def copied_update(model: torch.nn.Module) -> dict:
    """The model's weights copied out as NumPy arrays, as a ClientApp's reply takes them."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def bare_packed_process_seconds(workload: dict, num_clients: int, rounds: int, threads: int,
                                clients: list[int], ready=None) -> list[float]:
    """Per round 1..R: the wall seconds of one packed worker's share ``clients`` in bare
    torch with ``threads`` threads, as its ClientApp serves them one after another: per
    client the global weights loaded into the model, its local SGD (the workload's steps or
    epochs, seeded by round and client) and the update copied out. After a warm-up;
    ``ready`` (a barrier) is awaited before each round, so the workers' rounds line up."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cfg, device, parts, start_model, model = bare_setup(workload, num_clients, clients)
        warm_up(model, parts, cfg)
        global_state = start_model.state_dict()
        times = []
        for server_round in range(1, rounds + 1):
            if ready is not None:
                ready.wait()
            settled(device)
            start = time.perf_counter()
            for pid, (x, y) in parts.items():
                model.load_state_dict(global_state)
                local_sgd(model, x, y, lr=cfg.lr, batch_size=cfg.batch_size,
                          epochs=cfg.local_epochs, steps=cfg.local_steps,
                          seed=client_seed(cfg.seed, server_round, pid))
                copied_update(model)
            settled(device)
            times.append(time.perf_counter() - start)
        return times
    finally:
        torch.set_num_threads(previous)


def bare_batched_process_seconds(workload: dict, num_clients: int, rounds: int, threads: int,
                                 clients: list[int], ready=None) -> list[float]:
    """Per round 1..R: the wall seconds of one worker's share ``clients`` as one batched
    computation in bare torch, the batched bound of vectorised packed mode: the global
    weights stacked K times, per local step (the workload's ``local-steps``, the same for
    every client) the K clients' minibatches stacked, one ``vmap(grad(loss))`` over them
    and the SGD update of the stacked weights, then the K updates copied out, one transfer
    per tensor. Same data, batch order and warm-up as :func:`bare_packed_process_seconds`."""
    from torch.func import functional_call, grad, vmap  # noqa: PLC0415

    from strategies.client import batch_indices  # noqa: PLC0415

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cfg, device, parts, start_model, model = bare_setup(workload, num_clients, clients)
        if cfg.local_steps < 1:
            raise ValueError("the batched bound needs a fixed local-steps >= 1 in the workload")
        model.load_state_dict(start_model.state_dict())
        step = vmap(grad(lambda p, x, y: model.loss(functional_call(model, p, (x,)), y)))
        global_state = dict(start_model.named_parameters())
        shares = list(parts.items())
        times = []
        for server_round in range(0, rounds + 1):  # round 0: the warm-up, untimed
            if ready is not None and server_round:
                ready.wait()
            settled(device)
            start = time.perf_counter()
            stacked = {n: p.detach().unsqueeze(0).repeat(len(shares), *([1] * p.dim()))
                       for n, p in global_state.items()}
            streams = [batch_indices(len(y), cfg.batch_size, torch.Generator().manual_seed(
                client_seed(cfg.seed, server_round, pid))) for pid, (_, y) in shares]
            for _ in range(cfg.local_steps):
                idx = [next(stream).to(device) for stream in streams]
                grads = step(stacked, torch.stack([x[i] for (_, (x, _)), i in zip(shares, idx)]),
                             torch.stack([y[i] for (_, (_, y)), i in zip(shares, idx)]))
                for n, g in grads.items():
                    stacked[n].sub_(g, alpha=cfg.lr)
            _ = {n: t.cpu().numpy() for n, t in stacked.items()}  # the updates, copied out
            settled(device)
            if server_round:
                times.append(time.perf_counter() - start)
        return times
    finally:
        torch.set_num_threads(previous)


def _bare_packed_worker(job: tuple) -> list[float]:
    workload, num_clients, rounds, threads, clients, batched = job
    measure = bare_batched_process_seconds if batched else bare_packed_process_seconds
    return measure(workload, num_clients, rounds, threads, clients, ready=_BARRIER)


def bare_packed_round_seconds(workload: dict, num_clients: int, rounds: int, threads: int,
                              workers: int, *, batched: bool = False) -> list[float]:
    """Per round 1..R: the wall seconds of packed mode's limit, the clients' work in bare
    torch (:func:`bare_packed_process_seconds`; ``batched``: vectorised packed mode's,
    :func:`bare_batched_process_seconds`) dealt round-robin over ``workers`` processes
    started together (spawned, each with ``threads`` torch threads): a round takes as long
    as its slowest process."""
    import multiprocessing  # noqa: PLC0415

    workers = max(1, min(workers, num_clients))
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers)
    jobs = [(workload, num_clients, rounds, threads, list(range(w, num_clients, workers)),
             batched) for w in range(workers)]
    with context.Pool(workers, initializer=_init_bare_worker, initargs=(barrier,)) as pool:
        per_process = pool.map(_bare_packed_worker, jobs)
    return [max(seconds) for seconds in zip(*per_process)]

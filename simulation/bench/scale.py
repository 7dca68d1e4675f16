"""``bench scale``: how the per-round cost grows with the number of clients. For 10, 100
and 1,000 clients with tiny local work (one SGD step of B = 32 on an IID share of
Fashion-MNIST, the template CNN = ``cnn-small``), the per-round wall time of fedhetero's
FedAvg (our app, ``strategy=fedavg``, its defaults otherwise) next to a bare Flower app
(``simulation/bench/bare_app``: Flower's own FedAvg, a template ClientApp, nothing of
ours) on the same number of SuperNodes, both with real ``flwr run`` on the simulation
engine, one after the other in this run. Per size: the mean wall time of the warm rounds
(2 .. R-1: round 1 starts the actors and reads the data; ours evaluates the test set only
after rounds 0 and R, ``eval-every`` = R, the bare app never) and the ratio ours / bare.
The last line is ``scale ratio at <largest> clients = X.XX`` (target <= 1.1)."""

from __future__ import annotations

import argparse
import statistics

from ..runtime import option_type
from .common import DATA_DIR, run_bare_app, simulation_round_seconds

HELP = "per-round time vs number of clients: ours against a bare Flower FedAvg app"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=option_type("num-supernodes"), nargs="+",
                   default=[10, 100, 1000],
                   help="numbers of clients (SuperNodes), one pair of runs each")
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds per run (>= 3: rounds 2..R-1 are timed)")
    p.add_argument("--cpus-per-client", type=option_type("client-resources-num-cpus"), default=1,
                   help="CPUs per ClientApp (the parallel workers: CPUs / this)")
    p.add_argument("--data-dir", default=DATA_DIR,
                   help="Fashion-MNIST IDX folder (both apps read it)")


def ours_round_seconds(num_clients: int, rounds: int, cpus: float, data_dir: str) -> list[float]:
    """Wall seconds of rounds 1..R of our app (its run log)."""
    workload = {
        "strategy": "fedavg", "num-server-rounds": rounds, "partition": "iid",
        "model": "cnn-small", "local-steps": 1, "batch-size": 32, "lr": 0.05,
        "dataset": "fashion-mnist", "data-dir": data_dir, "min-available-nodes": num_clients,
        "eval-every": rounds,
    }
    return simulation_round_seconds(workload, num_clients, cpus)


def bare_round_seconds(num_clients: int, rounds: int, cpus: float, data_dir: str) -> list[float]:
    """Wall seconds of rounds 1..R of the bare Flower app (its round-end times)."""
    ends = run_bare_app(num_clients, rounds, {"client-resources-num-cpus": cpus},
                        data_dir=data_dir)["round-ends"]  # rounds 0..R
    return [b - a for a, b in zip(ends, ends[1:])]


def run(args) -> None:
    if args.rounds < 3:
        raise SystemExit("bench scale: --rounds must be >= 3 (rounds 2..R-1 are timed)")
    print(f"Per-round wall time, FedAvg, one SGD step per client (B=32, cnn-small, "
          f"Fashion-MNIST IID), {args.rounds} rounds per run, rounds 2..{args.rounds - 1} "
          f"timed; {args.cpus_per_client} CPU per ClientApp", flush=True)
    print(f"{'clients':>8} | {'fedhetero s/round':>17} | {'bare Flower s/round':>19} | "
          f"{'ratio':>5}", flush=True)
    ratio = None
    for n in args.clients:
        ours = ours_round_seconds(n, args.rounds, args.cpus_per_client, args.data_dir)
        bare = bare_round_seconds(n, args.rounds, args.cpus_per_client, args.data_dir)
        warm_ours = statistics.mean(ours[1:-1])
        warm_bare = statistics.mean(bare[1:-1])
        ratio = warm_ours / warm_bare
        print(f"{n:>8} | {warm_ours:>17.3f} | {warm_bare:>19.3f} | {ratio:>5.2f}", flush=True)
    print(f"scale ratio at {args.clients[-1]} clients = {ratio:.2f}   (target <= 1.1)")

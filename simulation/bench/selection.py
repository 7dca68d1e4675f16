"""``bench selection``: each selection policy's cost per round, pure policy calls on
synthetic clients (no Flower, no training): the candidates' sizes and clock times are
log-normal, the losses uniform; each round chooses m = ``--fraction`` x K clients and feeds
back a loss for each. Power-of-Choice's loss query is a function returning the synthetic
losses (its messages are not timed here: they are evaluate messages of the round). The cost
is the median milliseconds of ``choose`` + ``feedback`` over ``--rounds`` rounds.

Against what a round costs: with ``--round-clients K`` (default 1,000; 0 = skip) one real
``flwr run`` of the app on K SuperNodes (the selection experiment's model, local work and
fleet, ``simulation/experiments/selection_fmnist.toml``, on an IID split: Dirichlet(0.3)
cannot give 1,000 partitions of at least 10 examples; m = ``--fraction`` x the online
clients, ``selection = oort``) gives the wall time of a warm
round (rounds 2..R-1 of ``--app-rounds``, from its run log; the test-set evaluation runs
only after the last round), and each policy's cost at K clients is printed as a share of it
(target <= 5 %)."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from strategies.engine.participation import RandomSelection
from strategies.selection.policy import Candidate, Outcome
from strategies.selection.oort import OortSelection
from strategies.selection.power_of_choice import PowerOfChoice
from strategies.selection.tifl import TiFLSelection

from .common import DATA_DIR, simulation_round_seconds

HELP = "each selection policy's cost per round at 1,000 and 10,000 clients"
POLICIES = ("random", "oort", "power-of-choice", "tifl")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=int, nargs="+", default=[1000, 10000],
                   help="numbers of online clients K")
    p.add_argument("--fraction", type=float, default=0.01, help="m = fraction x K per round")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds per policy")
    p.add_argument("--round-clients", type=int, default=1000,
                   help="SuperNodes of the real flwr run whose warm round the costs are "
                        "compared with (0 = no app run)")
    p.add_argument("--app-rounds", type=int, default=4,
                   help="rounds of that run (>= 3: rounds 2..R-1 are timed)")
    p.add_argument("--data-dir", default=DATA_DIR, help="Fashion-MNIST IDX folder")


def policy(name: str, rounds: int):
    return {"random": lambda: RandomSelection(0), "oort": lambda: OortSelection(0),
            "power-of-choice": lambda: PowerOfChoice(0),
            "tifl": lambda: TiFLSelection(0, credits=-(-rounds // 5))}[name]()


def round_ms(name: str, k: int, m: int, rounds: int) -> float:
    """Median ms of one round's choice and feedback for policy ``name`` and K = ``k``."""
    rng = np.random.default_rng(0)
    sizes = rng.lognormal(5.0, 1.0, k).astype(int) + 1
    seconds = rng.lognormal(3.0, 1.0, k)
    losses = rng.uniform(0.1, 3.0, k)
    candidates = [Candidate(str(i), int(sizes[i]), float(seconds[i])) for i in range(k)]
    keys = list(range(k))
    p = policy(name, rounds)
    times = []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        if name == "random":
            p.select(r, keys, m, 1.0, None)
        else:
            choice = p.choose(r, candidates, m,
                              lambda pos: {j: float(losses[j]) for j in pos})
            p.feedback(r, [Outcome(str(j), float(losses[j]), int(sizes[j]), float(seconds[j]))
                           for j in choice.picks])
        times.append(1000.0 * (time.perf_counter() - start))
    return statistics.median(times)


def policy_costs(k: int, fraction: float, rounds: int) -> dict[str, float]:
    """Each policy's :func:`round_ms` at K = ``k``, m = max(floor(fraction k), 1)."""
    m = max(int(fraction * k), 1)
    return {n: round_ms(n, k, m, rounds) for n in POLICIES}


def app_round_seconds(k: int, fraction: float, rounds: int, data_dir: str) -> float:
    """Mean wall seconds of the warm rounds of a real ``flwr run`` on ``k`` SuperNodes with
    Oort selection and the selection experiment's workload."""
    workload = {
        "strategy": "fedavg", "selection": "oort", "num-server-rounds": rounds,
        "dataset": "fashion-mnist", "data-dir": data_dir, "partition": "iid",
        "model": "lenet-gn", "local-epochs": 1, "batch-size": 10,
        "lr": 0.05, "momentum": 0.0, "fraction-train": fraction, "min-available-nodes": k,
        "device-profiles": "lognormal", "device-sigma": 1.0, "device-availability": 0.8,
        "eval-every": rounds, "drift-diagnostics": False,
    }
    seconds = simulation_round_seconds(workload, k, 1)
    return statistics.mean(seconds[1:-1])


def run(args: argparse.Namespace) -> None:
    if args.round_clients and args.app_rounds < 3:
        raise SystemExit("bench selection: --app-rounds must be >= 3 (rounds 2..R-1 are timed)")
    results = {}
    print(f"{'clients':>8} {'m':>5}  " + "  ".join(f"{n:>16}" for n in POLICIES))
    for k in args.clients:
        results[k] = policy_costs(k, args.fraction, args.rounds)
        print(f"{k:>8} {max(int(args.fraction * k), 1):>5}  "
              + "  ".join(f"{results[k][n]:>13.3f} ms" for n in POLICIES), flush=True)
    for k in args.clients:
        print(f"selection cost per round at {k} clients: "
              + ", ".join(f"{n} {results[k][n]:.3f} ms" for n in POLICIES))
    k = args.round_clients
    if not k:
        return
    if k not in results:
        results[k] = policy_costs(k, args.fraction, args.rounds)
    print(f"Real flwr run on {k} SuperNodes (FedAvg, oort selection, m = fraction x online "
          f"clients, lenet-gn, E = 1, B = 10, IID split, log-normal fleet), "
          f"{args.app_rounds} rounds, rounds 2..{args.app_rounds - 1} timed ...", flush=True)
    round_s = app_round_seconds(k, args.fraction, args.app_rounds, args.data_dir)
    print(f"a warm round at {k} clients: {round_s:.3f} s wall")
    print(f"selection cost as a share of the round's wall time at {k} clients: "
          + ", ".join(f"{n} {100 * results[k][n] / (1000 * round_s):.2f} %" for n in POLICIES)
          + "   (target <= 5 %)")

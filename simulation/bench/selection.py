"""``bench selection``: each selection policy's cost per round, pure policy calls on
synthetic clients (no Flower, no training): the candidates' sizes and clock times are
log-normal, the losses uniform; each round chooses m = ``--fraction`` x K clients and feeds
back a loss for each. Power-of-Choice's loss query is a function returning the synthetic
losses (its messages are not timed here: they are evaluate messages of the round). The cost
is the median milliseconds of ``choose`` + ``feedback`` over ``--rounds`` rounds."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from strategies.participation import RandomSelection
from strategies.selection import Candidate, Outcome
from strategies.selection_oort import OortSelection
from strategies.selection_power_of_choice import PowerOfChoice
from strategies.selection_tifl import TiFLSelection

HELP = "each selection policy's cost per round at 1,000 and 10,000 clients"
POLICIES = ("random", "oort", "power-of-choice", "tifl")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=int, nargs="+", default=[1000, 10000],
                   help="numbers of online clients K")
    p.add_argument("--fraction", type=float, default=0.01, help="m = fraction x K per round")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds per policy")


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


def run(args: argparse.Namespace) -> None:
    results = {}
    print(f"{'clients':>8} {'m':>5}  " + "  ".join(f"{n:>16}" for n in POLICIES))
    for k in args.clients:
        m = max(int(args.fraction * k), 1)
        results[k] = {n: round_ms(n, k, m, args.rounds) for n in POLICIES}
        print(f"{k:>8} {m:>5}  " + "  ".join(f"{results[k][n]:>13.3f} ms" for n in POLICIES),
              flush=True)
    for k in args.clients:
        print(f"selection cost per round at {k} clients: "
              + ", ".join(f"{n} {results[k][n]:.3f} ms" for n in POLICIES))

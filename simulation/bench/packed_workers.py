"""``bench packed-workers``: how packed mode's round time falls as the same N virtual clients
are spread over more workers (SuperNodes), with and without a share of the GPU. Per worker
count W in ``--workers`` (and ``--cpu`` / ``--gpu``), one packed run of :mod:`.scale`'s
workload (FedAvg, one SGD step of B = 32 per client, cnn-small, Fashion-MNIST IID) with real
``flwr run``; per run one line: the warm rounds' mean (rounds 2..R-1), the milliseconds per
client per worker (warm round x W / N: flat when the workers run side by side without
getting in each other's way), each round's seconds, the run's wall time, the mean GPU
utilisation (``nvidia-smi``) and the peak summed RSS of the processes it started.

With ``--gpu`` every ClientApp gets a 1/W share of the GPU; with ``--cpu`` none, so Ray
hides the GPU from them and they train on the CPU (on a machine without CUDA only ``--cpu``
runs). ``--vectorised auto`` / ``on`` runs vectorised packed mode instead
(:mod:`fedapp.vectorised_share`). It is the diagnosis of ``bench scale``'s packed column on a
GPU (docs/results/benchmark.md): one worker alone against W side by side, on the same
machine, in one run.
"""

from __future__ import annotations

import argparse
import time

import torch

from ..runtime import at_least, option_type
from .common import DATA_DIR
from .machine_sampler import MachineSampler
from .scale import federation, packed_records, round_seconds, sampled_into, warm_mean

HELP = ("packed mode's warm round against the number of workers, with and without GPU "
        "shares: per client per worker, GPU utilisation, peak memory")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=option_type("num-supernodes"), default=1000,
                   help="virtual clients of every run")
    p.add_argument("--workers", type=at_least(1), nargs="+", default=[1, 4, 16], metavar="W",
                   help="SuperNodes serving them, one run each")
    p.add_argument("--rounds", type=int, default=4,
                   help="rounds per run (>= 3: rounds 2..R-1 are timed)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--cpu", action="store_true",
                       help="only runs without a GPU share (the default without CUDA)")
    where.add_argument("--gpu", action="store_true",
                       help="only runs with a 1/W GPU share each (needs CUDA)")
    p.add_argument("--data-dir", default=DATA_DIR, help="Fashion-MNIST IDX folder")
    p.add_argument("--vectorised", choices=("off", "auto", "on"), default="off",
                   help="the runs' vectorised-clients (default off: sequential packed mode)")


def placements(args, cuda: bool) -> list[bool]:
    """Whether each run's workers get a GPU share, in run order: without CUDA only the CPU;
    with it both (CPU first) unless ``--cpu`` or ``--gpu`` picks one."""
    if args.gpu and not cuda:
        raise SystemExit("bench packed-workers: --gpu needs CUDA, and torch sees none here")
    if args.cpu or not cuda:
        return [False]
    return [True] if args.gpu else [False, True]


def run_line(clients: int, workers: int, on_gpu: bool, seconds: list[float], wall: float,
             sampler: MachineSampler) -> str:
    """One run's line."""
    warm = warm_mean(seconds)
    util = sampler.mean_gpu_utilisation
    return (f"{clients} clients, W={workers} {'gpu' if on_gpu else 'cpu'}: warm {warm:.3f} "
            f"s/round ({1000 * warm * workers / clients:.1f} ms per client per worker); rounds "
            f"{', '.join(f'{s:.2f}' for s in seconds)}; run {wall:.0f} s; GPU utilisation "
            f"{'-' if util is None else f'{util:.0f}%'}; peak RSS {sampler.peak_rss_mb:.0f} MB")


def run(args) -> None:
    if args.rounds < 3:
        raise SystemExit("bench packed-workers: --rounds must be >= 3 (rounds 2..R-1 are timed)")
    cuda = torch.cuda.is_available()
    print(f"Packed mode, {args.clients} virtual clients, FedAvg, one SGD step per client (B=32, "
          f"cnn-small, Fashion-MNIST IID), {args.rounds} rounds per run, rounds "
          f"2..{args.rounds - 1} timed; 1 CPU per ClientApp; vectorised-clients "
          f"{args.vectorised}" + ("" if cuda else "; no GPU"),
          flush=True)
    for on_gpu in placements(args, cuda):
        for workers in args.workers:
            samplers: dict[str, MachineSampler] = {}
            started = time.monotonic()
            records = packed_records(args.clients, args.rounds, workers,
                                     federation(1, workers, on_gpu), args.data_dir,
                                     sampled_into(samplers, "run"), vectorised=args.vectorised)
            print(run_line(args.clients, min(workers, args.clients), on_gpu,
                           round_seconds(records), time.monotonic() - started,
                           samplers["run"]), flush=True)

"""``bench efficiency``: simulation efficiency = ideal / our wall time on the standard
workload (Fashion-MNIST, McMahan CNN, 20 clients, 5 rounds, E = 1, the server evaluating
the 10k test images after every round, overlapped with the next round: ``eval-overlap``),
where the ideal is the bare torch time of the same local SGD (one thread per client, as
the Ray actors get) divided by the number of parallel workers; round 1 (Ray and actor
start-up, data decoding) is excluded; plus the ServerApp's peak memory (max RSS) next to
its evaluation process's (which holds torch, the model and the test split), a bare Flower
FedAvg app's (``simulation/bench/bare_app``, same model and clients) and ``import torch``
alone. As a profile, the same bare SGD also runs split over that many processes at once:
the ideal's parallelism measured (shared caches and memory bandwidth included), so the
remaining gap is the simulation's own (Ray, Flower's messaging, our ClientApp). It also
prints the bound the server's evaluation sets when every core trains
(:func:`evaluation_bound`, from the evaluations timed alone on an idle thread: the
background ones' wall time is stretched by nice 19) and where the timed rounds' CPU went,
by kind of process (:mod:`.cpu_accounting`). ``--repeats N`` measures (a) N times and
prints the median and range. Targets (issue #19): efficiency >= 0.92, ServerApp memory
<= 700 MB."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import torch

from strategies import contract as C

from ..runtime import at_least, option_type
from .common import (add_workload_arguments, bare_app_peak_mb, bare_client_seconds,
                     bare_evaluation_seconds, bare_parallel_seconds, simulation_round_seconds,
                     torch_import_mb, workload)
from .cpu_accounting import CLIENT_ACTORS, SERVER_PROCESS, CpuSampler

HELP = "simulation efficiency vs ideal parallel bare torch; server memory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_workload_arguments(p, clients=20, rounds=5, model="cnn-mcmahan",
                           rounds_help="server rounds (round 1, the start-up, is not timed)")
    p.add_argument("--gpus-per-client", type=option_type("client-resources-num-gpus"), default=0.25,
                   help="GPU share per ClientApp where there is a GPU (workers: 1 / this)")
    p.add_argument("--eval-every", type=at_least(1), default=1, metavar="K",
                   help="the server evaluates every K-th round and the last (default 1: the "
                        "target's workload; a K above --rounds leaves only the last)")
    p.add_argument("--no-eval-overlap", dest="eval_overlap", action="store_false",
                   help="evaluate between rounds, not in the background during the next")
    p.add_argument("--repeats", type=at_least(1), default=1, metavar="N",
                   help="measure (a) N times, each a simulation then its bare baselines, and "
                        "print every repeat's efficiency with the median and range (a VM's "
                        "speed can drift between runs by more than the ratio's margins)")


@dataclass(frozen=True)
class Measurement:
    """One repeat of (a): the simulation's records and timed seconds, the bare baselines."""

    sim: list[dict]
    ours: float  # wall seconds of rounds 2..R
    evals: float  # the evaluations' wall seconds in those rounds
    evaluated: int  # evaluations in those rounds
    eval_cpu: float  # the same evaluations alone, on one idle thread
    bare: list[float]  # bare SGD seconds per client round
    ideal: float
    parallel: float | None  # the bare SGD over the workers at once (profile)

    @property
    def efficiency(self) -> float:
        return self.ideal / self.ours


def repeats_summary(measurements: list[Measurement]) -> list[str]:
    """One line per repeat and the median / range of the efficiency (and of the ratio to the
    parallel profile, where measured)."""
    lines = []
    for k, m in enumerate(measurements, 1):
        against = "" if m.parallel is None else f", against the profile {m.parallel / m.ours:.2f}"
        lines.append(f"    repeat {k}: bare SGD {sum(m.bare):.1f} s, ideal {m.ideal:.1f} s, ours "
                     f"{m.ours:.1f} s, efficiency {m.efficiency:.2f}{against}")
    effs = [m.efficiency for m in measurements]
    lines.append(f"    efficiency over {len(effs)} repeats: median {statistics.median(effs):.2f} "
                 f"(range {min(effs):.2f}-{max(effs):.2f})   (target >= 0.92)")
    profiles = [m.parallel / m.ours for m in measurements if m.parallel is not None]
    if len(profiles) == len(measurements):
        lines.append(f"    against the parallel profile: median {statistics.median(profiles):.2f} "
                     f"(range {min(profiles):.2f}-{max(profiles):.2f})")
    return lines


def measure(args, work: dict, federation: dict, workers: int, observer=None) -> Measurement:
    """The simulation (rounds 2..R timed), then the same SGD bare, serial and in parallel."""
    sim = simulation_round_seconds(
        work, args.clients, args.cpus_per_client, federation, keep_records=True,
        observer=observer,
    )
    warm = [r for r in sim if r[C.LOG_ROUND] >= 2]
    evaluated = sum(1 for r in warm if C.LOG_EVAL_SECONDS in r)
    rounds = list(range(2, args.rounds + 1))
    threads = max(1, int(args.cpus_per_client))
    bare = bare_client_seconds(work, args.clients, rounds, threads=threads)
    return Measurement(
        sim=sim,
        ours=sum(r[C.LOG_WALL_SECONDS] for r in warm),
        evals=sum(r.get(C.LOG_EVAL_SECONDS, 0.0) for r in warm),
        evaluated=evaluated,
        eval_cpu=bare_evaluation_seconds(work, evaluated),
        bare=bare,
        ideal=sum(bare) / workers,
        parallel=(bare_parallel_seconds(work, args.clients, rounds, threads, workers)
                  if workers > 1 else None),
    )


def evaluation_bound(ideal: float, eval_seconds: float, workers: int) -> float:
    """The efficiency left when the server's evaluation (``eval_seconds`` of CPU on one
    thread) takes its CPU from the same ``workers`` cores as the clients and nothing else
    costs anything: on a machine whose cores all train, overlapping hides its latency, not
    its CPU time."""
    return ideal / (ideal + eval_seconds / workers)


def print_cpu_accounting(sampler: CpuSampler, records: int, ours: float, cpus: int,
                         bare_sgd: float, eval_cpu: float) -> None:
    """Section (b): the timed rounds' CPU by kind of process, next to what the bare
    measurements say each kind needs."""
    totals = sampler.by_kind(records, ours, cpus) if sampler.available else None
    if totals is None:
        print("\n(b) where the CPU went: not measured (needs Linux's /proc, sampled during the run)")
        return
    capacity = sum(totals.values())
    needs = {CLIENT_ACTORS: f"bare SGD of the same steps {bare_sgd:.1f} s",
             SERVER_PROCESS: f"its evaluations alone {eval_cpu:.1f} s"}
    print(f"\n(b) where the CPU went in those rounds ({capacity:.1f} CPU-seconds: {cpus} CPUs "
          f"over about {ours:.1f} s; /proc, sampled twice a second)")
    for kind, seconds in totals.items():
        print(f"    {kind:<76} {seconds:6.1f} s ({seconds / capacity:4.0%})"
              + (f"; {needs[kind]}" if kind in needs else ""))


def run(args) -> None:
    import os  # noqa: PLC0415

    work = {**workload(args), "drift-diagnostics": False, "eval-every": args.eval_every,
            "eval-overlap": args.eval_overlap}
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
        f"ClientApp workers; the server evaluates "
        f"{'every round' if args.eval_every == 1 else f'every {args.eval_every} rounds and the last'}"
        f"{', overlapped with the next round' if args.eval_overlap else ', between rounds'}"
    )
    federation = {"client-resources-num-cpus": args.cpus_per_client}
    if gpu:
        federation["client-resources-num-gpus"] = args.gpus_per_client
    samplers: list[CpuSampler] = []

    def observe(output_dir):
        samplers.append(CpuSampler(output_dir))
        return samplers[-1]

    first = measure(args, work, federation, workers, observe)
    sim, ours, evals, evaluated = first.sim, first.ours, first.evals, first.evaluated
    eval_cpu, bare, ideal, parallel = first.eval_cpu, first.bare, first.ideal, first.parallel
    print(
        f"\n(a) simulation efficiency, rounds 2..{args.rounds} (round 1 = start-up, "
        f"{sim[1][C.LOG_WALL_SECONDS]:.1f} s, excluded)"
    )
    print(
        f"    bare torch local SGD, all clients, 1 thread each{' on the GPU' if gpu else ''}: "
        f"{sum(bare):.1f} s -> ideal with "
        f"{workers} workers {ideal:.1f} s"
    )
    print(f"    our wall time (flwr run, Ray backend):            {ours:.1f} s")
    print(
        f"      the ServerApp's {evaluated} test-set evaluations (10k images each) took "
        f"{evals:.1f} s of wall time"
        + (", in the background at nice 19 while the next round trained (the last between rounds);"
           if args.eval_overlap else ", between rounds;")
    )
    print(f"      the same {evaluated} evaluations alone on "
          f"{'the GPU' if gpu else 'one idle thread'}: {eval_cpu:.1f} s")
    print(f"    efficiency = ideal / ours = {first.efficiency:.2f}   (target >= 0.92)")
    print(
        f"    bound: the evaluations' CPU shared by the same {workers} workers, nothing "
        f"else added: ideal / (ideal + {eval_cpu:.1f} / {workers}) = "
        f"{evaluation_bound(ideal, eval_cpu, workers):.2f}"
    )
    if parallel is not None:
        shared = "the processes share one GPU" if gpu else "cores share caches and memory bandwidth"
        print(
            f"    profile: the same bare torch SGD in {workers} processes at once takes "
            f"{parallel:.1f} s "
            f"({parallel / ideal:.2f}x the ideal: {shared});"
        )
        print(
            f"      against that measured parallel baseline, our rounds run at "
            f"{parallel / ours:.2f} (Ray, Flower's messaging, our ClientApp, aggregation and "
            "the overlapped evaluation)"
        )
    print_cpu_accounting(samplers[0], len(sim), ours, cpus, sum(bare), eval_cpu)
    if args.repeats > 1:
        measurements = [first]
        for k in range(2, args.repeats + 1):
            print(f"\n    (a) again, repeat {k} of {args.repeats} ...", flush=True)
            measurements.append(measure(args, work, federation, workers))
        print(f"\n(a) over {args.repeats} repeats (each a simulation, then its bare baselines)")
        print("\n".join(repeats_summary(measurements)))
    peak = max(r[C.LOG_SERVER_MAX_RSS_MB] for r in sim)
    eval_peak = max(r.get(C.LOG_EVAL_MAX_RSS_MB, 0.0) for r in sim)
    bare_peak = bare_app_peak_mb(args.model, args.clients, args.cpus_per_client, federation)
    print(f"\n(c) ServerApp peak memory (max RSS): {peak:.0f} MB   (target <= 700)")
    print(f"    its evaluation process (torch, the model, the test split): {eval_peak:.0f} MB; "
          f"the sum of the two peaks {peak + eval_peak:.0f} MB")
    print(f"    a bare Flower FedAvg app, same model and {args.clients} clients (2 rounds of one "
          f"SGD step; torch and the evaluation in its ServerApp): {bare_peak:.0f} MB")
    torch_mb = torch_import_mb()
    print(f"    import torch alone, in a fresh process: {torch_mb['peak']:.0f} MB "
          f"({torch_mb['anonymous']:.0f} MB anonymous, {torch_mb['file']:.0f} MB mapped "
          f"files, torch {torch.__version__})")

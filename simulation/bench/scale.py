"""``bench scale``: how the per-round cost grows with the number of clients, and what
packing them onto a few SuperNodes buys. For 10, 100 and 1,000 clients with tiny local work
(one SGD step of B = 32 on an IID share of Fashion-MNIST, the template CNN = ``cnn-small``),
one after the other in this run, per size, the mean wall time of the warm rounds (2 .. R-1:
round 1 starts the actors and reads the data) of four ways to run the same FedAvg rounds:

* **fedhetero**: our app (``strategy=fedavg``, its defaults otherwise; it evaluates the test
  set only after rounds 0 and R, ``eval-every`` = R), one SuperNode per client;
* **bare Flower**: a bare Flower app (``simulation/bench/bare_app``: Flower's own FedAvg, a
  template ClientApp, nothing of ours, no evaluation) on as many SuperNodes;
* **packed**: our app with ``virtual-clients`` = N on W SuperNodes (``--workers``, default:
  the cores this process may use / ``--cpus-per-client``), each ClientApp running its share
  of the N clients one after another;
* **bare torch**: packed mode's limit, the same client work without Flower on the same cores:
  W processes started together, the clients dealt round-robin, torch threads =
  ``--cpus-per-client``; per client the global weights loaded into the model, the SGD step,
  the update copied out; a round lasts as long as its slowest process;
* **vectorised**: packed mode with ``vectorised-clients`` = ``"auto"``: each worker trains
  its share's clients together, one ``vmap`` step for all of them, where one measured
  batched step beats the per-client loop, else one by one (:mod:`fedapp.vectorised_share`);
  and **forced**, the same with ``"on"`` (always together);
* **batched bound**: vectorised mode's limit, its work in bare torch on the same W
  processes: the global weights stacked K times, one ``vmap(grad)`` step of the share's
  stacked minibatches, the stacked update copied out
  (:func:`.common.bare_batched_process_seconds`).

The three Flower apps run with real ``flwr run`` on the simulation engine. With CUDA, every
ClientApp gets a 1/W share of the GPU, so W packed workers share it; ours train on it
(``device = "auto"``), as do the bare-torch processes; the bare Flower app's template
ClientApp trains on the CPU wherever it runs. The ratios: ours / bare Flower, packed / bare Flower,
packed / bare torch, vectorised / bare torch (the per-client loop) and vectorised / batched
bound. Then one vectorised packed run of each ``--huge`` size of virtual clients (default
10,000 and 100,000; W workers, 3 rounds): its warm round (round 2), the peak over time of
the summed RSS of every
process the bench started (flwr run, the SuperLink, the ServerApp, Ray and its actors;
:mod:`.machine_sampler`) and the ServerApp's own peak (its run log); with ``nvidia-smi`` on
PATH, the mean GPU utilisation during the packed runs. ``--ways`` measures some of the ways
only (say the packed ones on a lent GPU: the unpacked runs take minutes); a ratio is printed
where both its ways were measured, "-" stands in the table for the others. ``--repeats N`` measures every
size N times, one row each, and the last lines give each ratio's median over the N repeats
with its range. The last lines::

    scale ratio at <largest> clients = X.XX   (target <= 1.1)
    packed/bare-Flower ratio at <largest> clients = X.XX   (target <= 0.25, stretch 0.15)
    packed/bare-torch ratio at <largest> clients = Y.YY   (target <= 2)
    vectorised/bare-torch ratio at <largest> clients = X.XX   (the per-client loop)
    vectorised/batched-bound ratio at <largest> clients = Y.YY   (target <= 1.5)
    vectorised/packed ratio at <largest> clients = Z.ZZ   (target <= 1: never slower)
    forced (vectorised-clients on)/batched-bound ratio at <largest> clients = ...
    forced/packed ratio at <largest> clients = ...
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from strategies import contract as C

from ..runtime import at_least, option_type
from . import usable_cores
from .common import DATA_DIR, bare_packed_round_seconds, run_bare_app, simulation_round_seconds
from .machine_sampler import MachineSampler

HELP = ("per-round time vs number of clients: ours, a bare Flower FedAvg app, packed mode "
        "and bare torch; a 10,000-client packed round")
HUGE_ROUNDS = 3
WAYS = ("packed", "bare-torch", "vectorised", "forced", "batched-bound", "fedhetero",
        "bare-flower")
"""The ways of running a size, in the order they run (``--ways`` picks some)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=option_type("num-supernodes"), nargs="+",
                   default=[10, 100, 1000],
                   help="numbers of clients: SuperNodes of the unpacked runs, virtual clients "
                        "of the packed run and of bare torch; four measurements each")
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds per run (>= 3: rounds 2..R-1 are timed)")
    p.add_argument("--cpus-per-client", type=option_type("client-resources-num-cpus"), default=1,
                   help="CPUs per ClientApp (the parallel workers: CPUs / this), and torch "
                        "threads per bare-torch process")
    p.add_argument("--workers", type=at_least(1), default=None, metavar="W",
                   help="packed mode's SuperNodes and bare torch's processes (default: the "
                        "cores this process may use / --cpus-per-client)")
    p.add_argument("--huge", type=at_least(0), nargs="+", default=[10_000, 100_000],
                   metavar="N",
                   help=f"virtual clients of the large vectorised packed runs, one run each "
                        f"({HUGE_ROUNDS} rounds, W workers; its round time and peak memory); "
                        "0 skips them")
    p.add_argument("--repeats", type=at_least(1), default=1, metavar="N",
                   help="measure every size N times, one repeat after the other, each a row "
                        "of the table; the last lines give each ratio's median and range")
    p.add_argument("--data-dir", default=DATA_DIR,
                   help="Fashion-MNIST IDX folder (every app and bare torch read it)")
    p.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS), metavar="WAY",
                   help=f"the ways to measure at each size (default all: {', '.join(WAYS)}); "
                        "a ratio is printed where both its ways were measured")


def workload(num_clients: int, rounds: int, data_dir: str) -> dict:
    """Our app's run config: FedAvg, one SGD step of B = 32 per client, evaluation after
    rounds 0 and R only."""
    return {
        "strategy": "fedavg", "num-server-rounds": rounds, "partition": "iid",
        "model": "cnn-small", "local-steps": 1, "batch-size": 32, "lr": 0.05,
        "dataset": "fashion-mnist", "data-dir": data_dir, "min-available-nodes": num_clients,
        "eval-every": rounds,
    }


def packed_workload(num_clients: int, rounds: int, data_dir: str,
                    vectorised: str = "off") -> dict:
    """:func:`workload` served as ``num_clients`` virtual clients (packed mode),
    ``vectorised-clients`` = ``vectorised``."""
    return {**workload(num_clients, rounds, data_dir), "virtual-clients": num_clients,
            "vectorised-clients": vectorised}


def default_workers(cpus_per_client: int) -> int:
    """Packed workers that fit the cores this process may use."""
    return max(1, usable_cores() // cpus_per_client)


def gpu_share(workers: int) -> float:
    """1 / ``workers``, rounded down to Ray's resource precision (1e-4), so that ``workers``
    shares fit one GPU."""
    return math.floor(10_000 / workers) / 10_000


def federation(cpus: int, workers: int, gpu: bool) -> dict:
    """ClientApp resources: ``cpus`` each, and with a GPU a 1/``workers`` share of it."""
    return {"client-resources-num-cpus": cpus,
            **({"client-resources-num-gpus": gpu_share(workers)} if gpu else {})}


def warm_mean(seconds: list[float]) -> float:
    """Mean of rounds 2..R-1 of per-round seconds 1..R."""
    return statistics.mean(seconds[1:-1])


def ours_round_seconds(num_clients: int, rounds: int, resources: dict,
                       data_dir: str) -> list[float]:
    """Wall seconds of rounds 1..R of our app, one SuperNode per client (its run log)."""
    return simulation_round_seconds(workload(num_clients, rounds, data_dir), num_clients,
                                    resources["client-resources-num-cpus"], resources)


def bare_round_seconds(num_clients: int, rounds: int, resources: dict,
                       data_dir: str) -> list[float]:
    """Wall seconds of rounds 1..R of the bare Flower app (its round-end times)."""
    ends = run_bare_app(num_clients, rounds, resources, data_dir=data_dir)["round-ends"]  # 0..R
    return [b - a for a, b in zip(ends, ends[1:])]


def packed_records(num_clients: int, rounds: int, workers: int, resources: dict, data_dir: str,
                   observer=None, vectorised: str = "off") -> list[dict]:
    """The run log's records of our app with ``num_clients`` virtual clients on ``workers``
    SuperNodes (``vectorised``: its ``vectorised-clients``)."""
    return simulation_round_seconds(packed_workload(num_clients, rounds, data_dir, vectorised),
                                    min(workers, num_clients),
                                    resources["client-resources-num-cpus"], resources,
                                    keep_records=True, observer=observer)


def round_seconds(records: list[dict]) -> list[float]:
    """Wall seconds of rounds 1..R from run-log records."""
    return [r[C.LOG_WALL_SECONDS] for r in records if r[C.LOG_ROUND] >= 1]


@dataclass(frozen=True)
class SizeResult:
    """One size's warm seconds per round: ours, bare Flower, packed, bare torch, vectorised,
    batched bound."""

    clients: int
    ours: float | None
    bare_flower: float | None
    packed: float | None
    bare_torch: float | None
    vectorised: float | None
    batched_bound: float | None
    forced: float | None

    @property
    def vectorised_over_torch(self) -> float | None:
        return ratio(self.vectorised, self.bare_torch)

    @property
    def vectorised_over_bound(self) -> float | None:
        return ratio(self.vectorised, self.batched_bound)

    @property
    def vectorised_over_packed(self) -> float | None:
        return ratio(self.vectorised, self.packed)

    @property
    def ours_over_bare(self) -> float | None:
        return ratio(self.ours, self.bare_flower)

    @property
    def packed_over_flower(self) -> float | None:
        return ratio(self.packed, self.bare_flower)

    @property
    def packed_over_torch(self) -> float | None:
        return ratio(self.packed, self.bare_torch)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None where either way was not measured (``--ways``)."""
    return None if a is None or b is None else a / b


HEADER = (f"{'clients':>8} | {'fedhetero s/round':>17} | {'bare Flower s/round':>19} | "
          f"{'ours/bare':>9} | {'packed s/round':>14} | {'bare torch s/round':>18} | "
          f"{'packed/bare-Flower':>18} | {'packed/bare-torch':>17} | "
          f"{'vectorised s/round':>18} | {'batched bound s/round':>21} | "
          f"{'vectorised/bare-torch':>21} | {'vectorised/bound':>16} | "
          f"{'forced s/round':>14}")


def cell(value: float | None, width: int, digits: int) -> str:
    """A table cell: the value, or "-" for a way not measured (``--ways``)."""
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def table_row(r: SizeResult) -> str:
    return (f"{r.clients:>8} | {cell(r.ours, 17, 3)} | {cell(r.bare_flower, 19, 3)} | "
            f"{cell(r.ours_over_bare, 9, 2)} | {cell(r.packed, 14, 3)} | "
            f"{cell(r.bare_torch, 18, 3)} | {cell(r.packed_over_flower, 18, 2)} | "
            f"{cell(r.packed_over_torch, 17, 2)} | {cell(r.vectorised, 18, 3)} | "
            f"{cell(r.batched_bound, 21, 3)} | {cell(r.vectorised_over_torch, 21, 2)} | "
            f"{cell(r.vectorised_over_bound, 16, 2)} | {cell(r.forced, 14, 3)}")


# the bench's last lines: (name, the ratio of one size's result, its target)
RATIOS = (
    ("scale ratio", lambda r: r.ours_over_bare, "(target <= 1.1)"),
    ("packed/bare-Flower ratio", lambda r: r.packed_over_flower, "(target <= 0.25, stretch 0.15)"),
    ("packed/bare-torch ratio", lambda r: r.packed_over_torch, "(target <= 2)"),
    ("vectorised/bare-torch ratio", lambda r: r.vectorised_over_torch, "(the per-client loop)"),
    ("vectorised/batched-bound ratio", lambda r: r.vectorised_over_bound, "(target <= 1.5)"),
    ("vectorised/packed ratio", lambda r: r.vectorised_over_packed,
     "(target <= 1: never slower)"),
    ("forced (vectorised-clients on)/batched-bound ratio",
     lambda r: ratio(r.forced, r.batched_bound), ""),
    ("forced/packed ratio", lambda r: ratio(r.forced, r.packed), ""),
)


def ratio_lines(repeats: list[SizeResult]) -> list[str]:
    """The bench's last lines at one size: each ratio whose two ways were measured, and over
    several repeats of that size (``--repeats``) the median of the repeats' ratios with
    their range."""
    lines = []
    for name, of, target in RATIOS:
        values = [of(r) for r in repeats]
        if None in values:
            continue
        line = f"{name} at {repeats[0].clients} clients = {statistics.median(values):.2f}"
        if target:
            line += f"   {target}"
        if len(values) > 1:
            line += (f"; median of {len(values)} repeats, range "
                     f"{min(values):.2f}-{max(values):.2f}")
        lines.append(line)
    return lines


def huge_lines(num_clients: int, workers: int, records: list[dict],
               sampler: MachineSampler) -> list[str]:
    """The large packed run: its warm round, the peak summed RSS, the ServerApp's peak."""
    warm = next(r[C.LOG_WALL_SECONDS] for r in records if r[C.LOG_ROUND] == 2)
    server = max(r.get(C.LOG_SERVER_MAX_RSS_MB, 0.0) for r in records)
    return [f"vectorised packed, {num_clients} virtual clients on {workers} SuperNodes, "
            f"{HUGE_ROUNDS} rounds: warm round (round 2) {warm:.2f} s",
            f"    peak RSS, summed over every process the bench started (flwr run, SuperLink, "
            f"ServerApp, Ray and its actors): {sampler.peak_rss_mb:.0f} MB "
            f"({sampler.peak_anon_mb:.0f} MB anonymous); the ServerApp's own peak {server:.0f} MB"]


def gpu_line(samplers: dict[str, MachineSampler]) -> str:
    """The mean GPU utilisation during each packed run and over all, or why there is none."""
    readings = {name: s for name, s in samplers.items() if s.mean_gpu_utilisation is not None}
    if not readings:
        why = ("nvidia-smi not on PATH" if not shutil.which("nvidia-smi") else
               "nvidia-smi gave no utilisation" if any(s.gpu for s in samplers.values()) else "")
        return "GPU utilisation during the packed runs: no GPU" + (f" ({why})" if why else "")
    every = [u for s in readings.values() for u, _ in s.gpu if u is not None]
    each = ", ".join(f"{name}: {s.mean_gpu_utilisation:.0f}%" for name, s in readings.items())
    memory = [m for s in readings.values() if (m := s.peak_gpu_memory_mb) is not None]
    return (f"GPU utilisation during the packed runs: mean {statistics.mean(every):.0f}% "
            f"({each})" + (f"; peak GPU memory used {max(memory):.0f} MiB" if memory else ""))


def sampled_into(samplers: dict[str, MachineSampler], name: str):
    """An ``observer`` that samples the run with a :class:`MachineSampler` kept as ``name``."""

    def observe(output_dir):
        samplers[name] = MachineSampler(output_dir)
        return samplers[name]

    return observe


def progress(n: int, way: str, seconds: list[float], started: float,
             sampler: MachineSampler | None = None) -> None:
    """One line on stderr as each way of a size ends (a size of 1,000 takes minutes): its warm
    seconds per round, the run's wall time and, for a packed run on a GPU, its utilisation."""
    gpu = (f", GPU utilisation mean {sampler.mean_gpu_utilisation:.0f}%"
           if sampler is not None and sampler.mean_gpu_utilisation is not None else "")
    print(f"[bench scale] {n} clients, {way}: {warm_mean(seconds):.3f} s per warm round "
          f"(run {time.monotonic() - started:.0f} s{gpu})", file=sys.stderr, flush=True)


def measure_size(n: int, args, workers: int, resources: dict,
                 samplers: dict[str, MachineSampler], repeat: int = 1) -> SizeResult:
    """The ways at ``n`` clients named in ``args.ways``, packed and its limit first; each
    packed run's sampler goes into ``samplers`` (named with ``repeat`` after the first)."""
    again = f" (repeat {repeat})" if repeat > 1 else ""
    plain = workload(n, args.rounds, args.data_dir)

    def packed(mode: str, label: str):
        name = f"{n} clients{label}{again}"
        return (round_seconds(packed_records(n, args.rounds, workers, resources, args.data_dir,
                                             sampled_into(samplers, name), vectorised=mode)),
                samplers.get(name))

    measures = {
        "packed": lambda: packed("off", ""),
        "bare-torch": lambda: (bare_packed_round_seconds(plain, n, args.rounds,
                                                         args.cpus_per_client, workers), None),
        "vectorised": lambda: packed("auto", ", vectorised"),
        "forced": lambda: packed("on", ", forced"),
        "batched-bound": lambda: (bare_packed_round_seconds(
            plain, n, args.rounds, args.cpus_per_client, workers, batched=True), None),
        "fedhetero": lambda: (ours_round_seconds(n, args.rounds, resources, args.data_dir), None),
        "bare-flower": lambda: (bare_round_seconds(n, args.rounds, resources, args.data_dir),
                                None),
    }
    warm: dict[str, float] = {}
    for way in (w for w in WAYS if w in args.ways):
        started = time.monotonic()
        seconds, sampler = measures[way]()
        progress(n, way, seconds, started, sampler)
        warm[way] = warm_mean(seconds)
    return SizeResult(n, warm.get("fedhetero"), warm.get("bare-flower"), warm.get("packed"),
                      warm.get("bare-torch"), warm.get("vectorised"), warm.get("batched-bound"),
                      warm.get("forced"))


def run(args) -> None:
    if args.rounds < 3:
        raise SystemExit("bench scale: --rounds must be >= 3 (rounds 2..R-1 are timed)")
    gpu = torch.cuda.is_available()
    workers = args.workers or default_workers(args.cpus_per_client)
    resources = federation(args.cpus_per_client, workers, gpu)
    print(f"Per-round wall time, FedAvg, one SGD step per client (B=32, cnn-small, "
          f"Fashion-MNIST IID), {args.rounds} rounds per run, rounds 2..{args.rounds - 1} "
          f"timed; {args.cpus_per_client} CPU per ClientApp; packed and bare torch on "
          f"{workers} workers" + (f", each with a 1/{workers} share of the GPU" if gpu else
                                  ", no GPU"), flush=True)
    print(HEADER, flush=True)
    samplers: dict[str, MachineSampler] = {}
    results: dict[int, list[SizeResult]] = {}
    for n in args.clients:
        for k in range(1, args.repeats + 1):
            results.setdefault(n, []).append(
                measure_size(n, args, workers, resources, samplers, repeat=k))
            print(table_row(results[n][-1]), flush=True)
    for huge in (n for n in args.huge if n):
        name = f"{huge} clients (a large run)"
        records = packed_records(huge, HUGE_ROUNDS, workers, resources, args.data_dir,
                                 sampled_into(samplers, name), vectorised="auto")
        print("\n".join(huge_lines(huge, min(workers, huge), records, samplers[name])),
              flush=True)
    print(gpu_line(samplers))
    print("\n".join(ratio_lines(results[max(results)])))

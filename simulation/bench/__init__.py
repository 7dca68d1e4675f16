"""Benchmarks (printed as ratios measured in one run; never asserted in tests).

``python -m simulation bench`` (no sub-command): the standard figures in one run:
(a) ``efficiency`` on the standard workload, (b) ``aggregation`` of every strategy against
Flower's FedAvg on the same replies, (c) the ServerApp's peak memory (from (a)) and the
aggregation's peak extra memory (from (b)).

``python -m simulation bench BENCH``: one benchmark; each is one module of this package
(its docstring says what it measures):

* ``efficiency``: simulation efficiency against ideal parallel bare torch; server memory;
* ``overhead``: simulation vs bare torch per round, and our ClientApp's per-message cost;
* ``aggregation``: ``aggregate_train`` time and memory against Flower's FedAvg;
* ``import``: ``import strategies`` against ``import flwr.serverapp.strategy``;
* ``sync-events``: DynamicFL's seconds per sync event against the active clients;
* ``scale``: per-round time at 10, 100, 1,000 clients: ours, a bare Flower FedAvg app,
  packed mode and bare torch; a 10,000-client packed round's time and peak memory;
* ``packed-workers``: packed mode's warm round against its number of workers, with and
  without GPU shares (how far W workers side by side are from W times one);
* ``packed-split``: a packed round in one process split into the ServerApp's own work, the
  ClientApp calls and the training in them (the ServerApp's part: a packed round's floor);
* ``layout``: SGD step and evaluation times, channels-last against contiguous, on this device;
* ``heap``: SGD step time with glibc's malloc thresholds against fixed ones (CPU);
* ``selection``: each selection policy's cost per round at 1,000 and 10,000 clients;
* ``deploy``: a warm round on a local deployment (``python -m deploy run``, a child process)
  against the simulation engine.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from importlib import metadata

from ..provenance import git_state
from ..runtime import HelpFormatter

# bench name -> module (each has HELP, add_arguments(parser), run(args)); full names, so
# tests/test_layers.py reads them as the imports they are
BENCHES = {
    "efficiency": "simulation.bench.efficiency",
    "overhead": "simulation.bench.overhead",
    "aggregation": "simulation.bench.aggregation",
    "import": "simulation.bench.imports",
    "sync-events": "simulation.bench.sync_events",
    "scale": "simulation.bench.scale",
    "packed-workers": "simulation.bench.packed_workers",
    "packed-split": "simulation.bench.packed_split",
    "layout": "simulation.bench.layout",
    "heap": "simulation.bench.heap",
    "deploy": "simulation.bench.deploy",
    "selection": "simulation.bench.selection",
}
STANDARD = ("efficiency", "aggregation")  # what a plain `bench` runs, in this order


def bench_module(name: str, benches: dict[str, str] = BENCHES):
    """The module that implements bench ``name``."""
    return importlib.import_module(benches[name])


def add_arguments(parser: argparse.ArgumentParser, benches: dict[str, str] = BENCHES) -> None:
    """The sub-commands and options of ``benches``."""
    sub = parser.add_subparsers(
        dest="bench", metavar="BENCH",
        help=f"one benchmark (default: {', then '.join(STANDARD)})")
    for name in benches:
        module = bench_module(name, benches)
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                           formatter_class=HelpFormatter)
        module.add_arguments(p)


def provenance_line(state: dict[str, object] | None = None) -> str:
    """What a figure needs beside it to be compared: the commit measured (and whether the
    tree had uncommitted changes), when, on how many cores, how loaded the machine was as the
    bench began (an idle machine reads near 0), and the torch and flwr versions."""
    state = git_state() if state is None else state
    commit = str(state["git-commit"])[:12]
    tree = {True: "uncommitted changes", False: "clean tree"}.get(state["git-dirty"], "no git")
    cores = usable_cores()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    versions = ", ".join(f"{name} {version(name)}" for name in ("torch", "flwr"))
    return (f"fedhetero bench at commit {commit} ({tree}), "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cores} cores, load "
            f"average {load:.2f} over the last minute as it began; {versions}")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def version(package: str) -> str:
    """``package``'s installed version, or "not installed"."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def run(args: argparse.Namespace, benches: dict[str, str] = BENCHES) -> int:
    """One benchmark of ``benches``, or the standard figures (a), (b), (c) in one run; the
    first line says what was measured where (:func:`provenance_line`)."""
    print(provenance_line(), flush=True)
    if args.bench is not None:
        bench_module(args.bench, benches).run(args)
        return 0
    for name in STANDARD:
        print(f"\n===== python -m simulation bench {name} =====", flush=True)
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        bench_module(name).run(parser.parse_args([name]))
    return 0

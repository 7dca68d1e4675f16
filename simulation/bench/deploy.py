"""``fedhetero bench deploy``: a warm round on Flower's deployment runtime against the same round
on its simulation engine. One run config, one seed, this machine, one run of each runtime,
one after the other: a real ``flwr run`` on the simulation engine (Ray, one CPU and so
one torch thread per ClientApp) and a real local deployment (one SuperLink and
``--supernodes`` SuperNodes on 127.0.0.1, one torch thread each: ``python -m deploy run``,
run as a user runs it, in a child process; ``simulation/`` never imports ``deploy/``). Both runs use one fresh on-disk data cache (filled in the
first round of the first run). Round 1 of each run (Ray or process start, data decoding)
is excluded: the ratio is over rounds 2..R of the run logs' ``wall-seconds``, which
include the ServerApp's test-set evaluation in both runtimes.

The deployment runs twice: with the SuperLink's state in a database file (restartable
after a crash, what ``python -m deploy run`` starts) and with Flower's default in-memory
state. Prints the three round tables, whether the deployed global models are bit-identical
to the simulated ones in every round (the run logs' ``model-sha256``), the ratio of the
database run, and as its last line ``deploy/simulation warm-round ratio = X.XX`` of the
deployment with Flower's default SuperLink. Timings mean something only on an otherwise
idle machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fedapp.run_log import format_table, read_rounds
from strategies import contract as C
from task.cache import ROOT_ENV

from ..runtime import PROJECT_ROOT, at_least, parse_overrides
from .common import simulation_round_seconds

HELP = "deployment runtime vs simulation engine, warm rounds of one config"
ON_DISK = "restartable; what python -m deploy run starts"
IN_MEMORY = "Flower's default"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--supernodes", type=at_least(1), default=2,
                   help="SuperNodes = simulated clients = partitions (default 2)")
    p.add_argument("--rounds", type=int, default=4, help="rounds per run; 2..R are timed")
    p.add_argument("-c", "--run-config", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config override for both runs (default: pyproject's run config)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")


def warm(records: list[dict]) -> list[float]:
    """``wall-seconds`` of rounds 2..R."""
    return [r[C.LOG_WALL_SECONDS] for r in records if r[C.LOG_ROUND] >= 2]


def deployed_records(config: dict, supernodes: int, work: Path, timeout: float,
                     database: bool) -> list[dict]:
    """The run log of one run of ``python -m deploy run`` (a local deployment it starts and
    stops itself); ``database``: the SuperLink keeps its state in a file, else in memory."""
    out = work / "deploy-runs"
    command = [sys.executable, "-m", "deploy", "run", "--num-supernodes", str(supernodes),
               "--num-threads", "1", "--workdir", str(work / "deploy"),
               "--timeout", str(timeout)]
    if not database:
        command.append("--in-memory-superlink")
    for key, value in {**config, "output-dir": str(out)}.items():
        command += ["-c", f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=timeout + 600)
    if done.returncode != 0:
        raise RuntimeError(f"python -m deploy run ended with exit code {done.returncode}:\n"
                           f"{(done.stdout + done.stderr)[-3000:]}")
    (run_dir,) = out.iterdir()
    records = read_rounds(run_dir)
    shutil.rmtree(out)  # the next deployment writes its own
    return records


def run(args) -> None:
    if args.rounds < 2:
        raise SystemExit("fedhetero bench deploy: --rounds must be >= 2 (round 1 is not timed)")
    config = {**parse_overrides(args.run_config), "num-server-rounds": args.rounds,
              "min-available-nodes": args.supernodes}
    print(f"Run config (both runtimes): {config}; {args.supernodes} clients, one torch thread "
          f"each; {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory(prefix="fedhetero-bench-deploy-") as tmp:
        work = Path(tmp)
        previous = os.environ.get(ROOT_ENV)
        os.environ[ROOT_ENV] = str(work / "data-cache")  # both runtimes' ClientApps inherit it
        try:
            simulated = simulation_round_seconds(config, args.supernodes, 1, keep_records=True)
            on_disk = deployed_records(config, args.supernodes, work, args.timeout, True)
            in_memory = deployed_records(config, args.supernodes, work, args.timeout, False)
        finally:
            if previous is None:
                os.environ.pop(ROOT_ENV, None)
            else:
                os.environ[ROOT_ENV] = previous
    runs = (("simulation engine (flwr run, Ray)", simulated),
            (f"deployment, SuperLink state in a database file ({ON_DISK})", on_disk),
            (f"deployment, SuperLink state in memory ({IN_MEMORY})", in_memory))
    for name, records in runs:
        print(f"\n{name}:\n{format_table(records)}")
    sim = statistics.mean(warm(simulated))
    print()
    for name, records in runs[1:]:
        same = [a.get(C.LOG_MODEL_SHA256) == b.get(C.LOG_MODEL_SHA256) is not None
                for a, b in zip(simulated, records, strict=True)]
        print(f"{name}: bit-identical global models in {sum(same)} of {len(same)} rounds "
              f"(round 0 = the initial model); mean warm round (rounds 2..{args.rounds}) "
              f"{statistics.mean(warm(records)):.2f} s against the simulation's {sim:.2f} s")
    print(f"with the database file: deploy/simulation warm-round ratio "
          f"{statistics.mean(warm(on_disk)) / sim:.2f}")
    print(f"deploy/simulation warm-round ratio = {statistics.mean(warm(in_memory)) / sim:.2f}")

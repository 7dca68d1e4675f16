"""``bench import``: ``import strategies`` against ``import flwr.serverapp.strategy`` in
fresh interpreters (what a Flower user imports anyway), both with their bytecode cached."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from ..runtime import at_least

HELP = "import cost of strategies vs flwr.serverapp.strategy"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=at_least(1), default=7,
                   help="fresh interpreters per import (the median is printed)")


def cached_bytecode_env(cache_dir: str) -> dict[str, str]:
    """This environment with Python's bytecode cache on, in ``cache_dir`` for every module.

    pip compiles an installed package's bytecode (flwr's), while an editable install's
    modules (ours) are compiled on their first import and cached in ``__pycache__``, unless
    ``PYTHONDONTWRITEBYTECODE`` is set, as on some CI machines: then every import compiles
    our sources again (36 of 50 ms here) and the comparison measures the compiler. One cache
    folder for both sides (``PYTHONPYCACHEPREFIX``), filled by an untimed first import,
    compares the imports as a user's second and later runs see them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache_dir
    return env


def import_seconds(statement: str, repeats: int, env: dict[str, str]) -> float:
    """Median wall seconds of ``statement`` in fresh interpreters (interpreter start excluded)."""
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    samples = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, timeout=120, env=env).stdout)
        for _ in range(repeats)
    ]
    return statistics.median(samples)


def run(args) -> None:
    """``import strategies`` against the Flower import a strategy user has anyway."""
    baseline = "import flwr.serverapp.strategy"
    ours = "import strategies"
    times = {}
    with tempfile.TemporaryDirectory(prefix="fedhetero-bytecode-") as cache_dir:
        env = cached_bytecode_env(cache_dir)
        for statement in (baseline, ours):  # untimed: writes both sides' bytecode
            subprocess.run([sys.executable, "-c", statement], check=True, timeout=120, env=env)
        for _ in range(2):  # interleave, in case the machine's load changes
            for statement in (baseline, ours):
                times.setdefault(statement, []).append(import_seconds(statement, args.repeats, env))
    base, mine = min(times[baseline]), min(times[ours])
    print(f"fresh interpreters, median of {args.repeats}, best of 2 interleaved rounds; "
          "bytecode cached for both (a first, untimed import)")
    print(f"  {baseline:<32} {base:.3f} s")
    print(
        f"  {ours:<32} {mine:.3f} s   ratio {mine / base:.2f} (target <= 1.0 + noise; torch is "
        "not imported)"
    )

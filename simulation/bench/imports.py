"""``bench import``: ``import strategies`` against ``import flwr.serverapp.strategy`` in
fresh interpreters (what a Flower user imports anyway)."""

from __future__ import annotations

import argparse
import statistics

from ..runtime import at_least

HELP = "import cost of strategies vs flwr.serverapp.strategy"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=at_least(1), default=7,
                   help="fresh interpreters per import (the median is printed)")


def import_seconds(statement: str, repeats: int) -> float:
    """Median wall seconds of ``statement`` in fresh interpreters (interpreter start excluded)."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    samples = [
        float(
            subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
        )
        for _ in range(repeats)
    ]
    return statistics.median(samples)


def run(args) -> None:
    """``import strategies`` against the Flower import a strategy user has anyway."""
    baseline = "import flwr.serverapp.strategy"
    ours = "import strategies"
    times = {}
    for _ in range(2):  # interleave, in case the machine's load changes
        for statement in (baseline, ours):
            times.setdefault(statement, []).append(import_seconds(statement, args.repeats))
    base, mine = min(times[baseline]), min(times[ours])
    print(f"fresh interpreters, median of {args.repeats}, best of 2 interleaved rounds")
    print(f"  {baseline:<32} {base:.3f} s")
    print(
        f"  {ours:<32} {mine:.3f} s   ratio {mine / base:.2f} (target <= 1.0 + noise; torch is "
        "not imported)"
    )

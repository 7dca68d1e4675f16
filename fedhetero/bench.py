"""``fedhetero bench``: the simulation benchmarks (``python -m simulation bench``) plus
``deploy``, which drives ``deploy/`` and so cannot be one of ``simulation/bench``'s own.

No sub-command: the standard figures, as ``python -m simulation bench``.
"""

from __future__ import annotations

import argparse

from simulation import bench as simulation_bench

# bench name -> module (each has HELP, add_arguments(parser), run(args))
BENCHES = {**simulation_bench.BENCHES, "deploy": "fedhetero.deploy_bench"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench sub-commands and their options, ``deploy`` among them."""
    simulation_bench.add_arguments(parser, BENCHES)


def run(args: argparse.Namespace) -> int:
    """One benchmark, or the standard figures in one run."""
    return simulation_bench.run(args, BENCHES)

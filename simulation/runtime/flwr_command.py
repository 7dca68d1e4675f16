"""``python -m simulation.runtime.flwr_command ARGS``: Flower's ``flwr ARGS`` with the FAB's
file walk pruned (:func:`fedapp.flower_patches.prune_fab_walk`): ``flwr run`` from a project
holding its venv builds the same FAB without walking the venv's 72,000 files (about 12 s
of CPU a launch on 2 cores). Every argument goes to Flower's CLI unchanged."""

from __future__ import annotations

import sys

from flwr.cli.app import app

from fedapp.flower_patches import prune_fab_walk


def main() -> None:
    prune_fab_walk()
    sys.argv[0] = "flwr"  # what Flower's usage lines and telemetry look at
    sys.exit(app())


if __name__ == "__main__":
    main()

"""``python -m simulation run``: the app with the real ``flwr run . --stream`` on the
simulation engine (project-local FLWR_HOME, offline), then stop the managed local
SuperLink it started. Exits non-zero unless the run ends ``finished:completed``.

On a terminal a progress bar over the rounds (accuracy, elapsed, ETA) stays below the
streamed log; otherwise the log is printed as it is (:mod:`simulation.progress`)."""

from __future__ import annotations

import argparse
import sys
import tomllib

from .preflight import refuse_bad_run_configs
from .progress import RunProgress
from .runtime import (PROJECT_ROOT, client_resources, option_type, parse_overrides, run_app,
                      unused_gpus_note)
from .runtime.ray_cluster import ray_address


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The run options."""
    parser.add_argument("--num-supernodes", type=option_type("num-supernodes"), default=10,
                        help="simulated SuperNodes, i.e. clients (one data partition each)")
    parser.add_argument("--cpus-per-client", type=option_type("client-resources-num-cpus"),
                        default=1,
                        help="whole CPUs Ray reserves per ClientApp (1: one ClientApp per core)")
    parser.add_argument("--gpus-per-client", type=option_type("client-resources-num-gpus"),
                        default=0,
                        help="GPU share per ClientApp (0.25: four share a GPU)")
    parser.add_argument("-c", "--run-config", action="append", default=[], metavar="KEY=VALUE",
                        type=override,
                        help="run-config override, repeatable (e.g. -c strategy=fedavg -c lr=0.05)")
    parser.add_argument("--flwr-home", default=None, help="FLWR_HOME (default: <project>/.flwr)")
    parser.add_argument("--ray-address", type=ray_address, default=None, metavar="HOST:PORT",
                        help="run the ClientApps on this Ray cluster instead of a private Ray")


def override(text: str) -> str:
    """A ``KEY=VALUE`` argument, checked (a bad one is a usage error)."""
    try:
        parse_overrides([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def run(args: argparse.Namespace) -> int:
    """``flwr run`` with these overrides and federation; its exit code."""
    federation = client_resources(args.num_supernodes, args.cpus_per_client, args.gpus_per_client)
    overrides = parse_overrides(args.run_config)
    refuse_bad_run_configs([("run config check", overrides)], federation)
    note = unused_gpus_note(federation, args.ray_address)
    if note:
        print(note, file=sys.stderr, flush=True)
    with RunProgress(planned_rounds(overrides)) as progress:
        return run_app(overrides or None, federation, flwr_home=args.flwr_home,
                       ray_address=args.ray_address, on_line=progress).returncode


def planned_rounds(overrides: dict[str, object]) -> int:
    """num-server-rounds of the run: the override, else the app's default (pyproject.toml).
    A bad override falls back to the default here; the ServerApp reports it."""
    rounds = overrides.get("num-server-rounds")
    if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1:
        return rounds
    pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    return int(pyproject["tool"]["flwr"]["app"]["config"]["num-server-rounds"])

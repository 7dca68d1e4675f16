"""What the faults table and the resume check share: the small run config and options."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedapp.registry import FLOWER_STRATEGIES, STRATEGIES

from ..runtime import at_least

# fedhetero's own strategies; Flower's classes (fedavgm, ...) can be named with --strategies
OWN_STRATEGIES = sorted(set(STRATEGIES) - set(FLOWER_STRATEGIES))

BASE = {
    "dataset": "synthetic", "model": "mlp-2nn", "partition": "iid", "local-steps": 5,
    "batch-size": 10, "lr": 0.05, "eval-batch-size": 2000, "fedveca-tau-init": 2,
    "fedveca-tau-max": 5, "dynamicfl-local-steps": 4, "round-timeout": 0.3,
    "drift-diagnostics": False,
}


# strategies that need another model than BASE's (MOON: one with a representation)
MODEL_FOR = {"moon": "mlp-2nn-moon"}


def run_config(strategy: str, out: Path, seed: int, rounds: int, extra: dict) -> dict:
    """BASE for ``strategy`` with this seed, round count and output folder, plus ``extra``."""
    rc = {**BASE, "strategy": strategy, "seed": seed, "num-server-rounds": rounds,
          "output-dir": str(out), **extra}
    if strategy == "dynamicfl":
        rc["dynamicfl-intervals"] = "1-4"
    if strategy in MODEL_FOR:
        rc["model"] = MODEL_FOR[strategy]
    return rc


def add_arguments(parser: argparse.ArgumentParser, out_name: str) -> None:
    """--strategies, --rounds, --nodes, --seed, --out (a file, or a folder for ``out_name``)."""
    parser.add_argument("--strategies", type=strategy_list, default=",".join(OWN_STRATEGIES),
                        help="comma-separated strategy names (default: fedhetero's own, "
                             "i.e. all registered but Flower's fedavgm, fedadam, fedyogi, "
                             "fedadagrad)")
    parser.add_argument("--rounds", type=at_least(1), default=5, help="server rounds per run")
    parser.add_argument("--nodes", type=at_least(1), default=4, help="clients (in-process nodes)")
    parser.add_argument("--seed", type=int, default=0, help="the runs' run-config seed")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"also write the result to this file, or into this folder as {out_name}",
    )


def strategy_list(text: str) -> list[str]:
    """'fedavg,fednova' -> ['fedavg', 'fednova']; unknown names are a usage error."""
    strategies = [s for s in text.split(",") if s]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(unknown)}; choose from {','.join(sorted(STRATEGIES))}"
        )
    return strategies


def out_file(args: argparse.Namespace, out_name: str) -> Path | None:
    """--out as a file path (a folder gets ``out_name`` appended)."""
    if args.out is not None and args.out.is_dir():
        return args.out / out_name
    return args.out


def quiet_flower() -> None:
    """Only Flower's errors: the table / check output stays readable."""
    import logging  # noqa: PLC0415

    logging.getLogger("flwr").setLevel(logging.ERROR)

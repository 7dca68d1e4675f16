"""``fedhetero strategies``: every ``strategy`` the app runs, with its paper, in one table.
Each strategy's run-config keys: ``fedhetero keys --strategy NAME``."""

from __future__ import annotations

import argparse

from fedapp.config_keys import ALL, ASYNC, FLOWER, SUMMARIES


def kind(name: str) -> str:
    if name in FLOWER:
        return "Flower's class"
    return "asynchronous" if name in ASYNC else "synchronous"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--names-only", action="store_true",
                   help="one name per line, nothing else (for scripts)")


def run(args: argparse.Namespace) -> int:
    if args.names_only:
        print("\n".join(ALL))
        return 0
    width = max(map(len, ALL))
    for name in ALL:
        print(f"{name:<{width}}  {kind(name):<14}  {SUMMARIES[name]}")
    print("\nRun one with: fedhetero run -c strategy=NAME; its keys: "
          "fedhetero keys --strategy NAME")
    return 0

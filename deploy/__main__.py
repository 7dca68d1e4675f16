"""``python -m deploy COMMAND``: Flower's deployment runtime for this app on this machine.

Commands: ``run`` (SuperLink + N SuperNodes, one ``flwr run``, stop all). See
deploy/README.md for several machines. ``fedhetero deploy COMMAND`` runs this CLI in a child
process (:data:`PROG_ENV` names it ``fedhetero deploy`` in its usage lines).
"""

from __future__ import annotations

import argparse
import os
import sys

from simulation.runtime import HelpFormatter, stop_on_sigterm

from . import run as run_command

PROG_ENV = "FEDHETERO_DEPLOY_PROG"  # the program name usage lines show (default python -m deploy)
COMMANDS = {"run": (run_command, "start SuperLink + SuperNodes, flwr run, stop everything")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-parser per command, built by its module (also ``fedhetero deploy``)."""
    sub = parser.add_subparsers(dest="deploy_command", required=True, metavar="COMMAND")
    for name, (tool, summary) in COMMANDS.items():
        tool_parser = sub.add_parser(name, help=summary, description=tool.__doc__,
                                     formatter_class=HelpFormatter)
        tool.add_arguments(tool_parser)
        tool_parser.set_defaults(deploy_tool=tool)


def run(args: argparse.Namespace) -> int:
    """Run the chosen command; its exit code."""
    return args.deploy_tool.run(args)


def build_parser() -> argparse.ArgumentParser:
    """The CLI parser: one sub-parser per command, built by its module."""
    parser = argparse.ArgumentParser(prog=os.environ.get(PROG_ENV, "python -m deploy"),
                                     description=__doc__,
                                     formatter_class=HelpFormatter)
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; its exit code."""
    args = build_parser().parse_args(argv)
    with stop_on_sigterm():  # `kill PID` stops the SuperLink and SuperNodes, as Ctrl-C does
        return run(args)


if __name__ == "__main__":
    sys.exit(main())

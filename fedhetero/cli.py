"""``fedhetero COMMAND``: run, sweep, report, bench, deploy, ... of fedhetero in one command.

It dispatches by module name (an import of the chosen tool, and only of it) to the
simulation tools (``python -m simulation COMMAND``), to ``deploy`` (``python -m deploy
COMMAND``) and, for ``bench``, to :mod:`fedhetero.bench` (the simulation benchmarks plus
``deploy``). It lives above both ``simulation/`` and ``deploy/`` because it imports both;
``simulation/`` never imports ``deploy/``. :data:`DESCRIPTION` is what ``fedhetero --help``
says.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from simulation.__main__ import COMMANDS as SIMULATION_COMMANDS
from simulation.__main__ import build_parser as build_tool_parser
from simulation.__main__ import chosen_command, run_tool

PROG = "fedhetero"
DESCRIPTION = """\
Heterogeneity-aware federated learning on Flower: every fedhetero tool as one command.
`fedhetero COMMAND --help` shows that command's options and their defaults.

examples:
  fedhetero run --num-supernodes 10 -c strategy=fednova -c num-server-rounds=20
  fedhetero sweep simulation/experiments/niid_alpha_sweep.toml
  fedhetero report runs/niid_alpha_sweep --target 0.7
  fedhetero bench efficiency
  fedhetero deploy run --num-supernodes 2 --tls --auth
"""
# name -> (module with add_arguments(parser) and run(args), one-line summary)
COMMANDS = {
    **SIMULATION_COMMANDS,
    "bench": ("fedhetero.bench", SIMULATION_COMMANDS["bench"][1]),
    "deploy": ("deploy.__main__",
               "Flower's deployment runtime: SuperLink + SuperNodes (its own sub-commands)"),
}


def installed_version() -> str:
    """The installed distribution's version ('unknown' when run from a plain checkout)."""
    try:
        return version("fedhetero")
    except PackageNotFoundError:
        return "unknown"


def build_parser(command: str | None = None):
    """The ``fedhetero`` parser; the sub-parser of ``command`` gets its tool's arguments."""
    parser = build_tool_parser(command, prog=PROG, commands=COMMANDS, description=DESCRIPTION)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {installed_version()}")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen tool; its exit code (the console script's entry)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(chosen_command(argv, COMMANDS)).parse_args(argv)
    return run_tool(args)

"""``fedhetero COMMAND``: run, sweep, report, bench, deploy, ... of fedhetero in one command.

The simulation tools (``python -m simulation COMMAND``) are imported by module name, only the
chosen one. ``fedhetero deploy ...`` runs ``python -m deploy ...`` as a child process with
the same arguments and returns its exit code: ``simulation/`` never imports ``deploy/``
(ARCHITECTURE.md, "Layers"; deploy is built on ``simulation.runtime``), and a child process
shares no module state with this one. :data:`DESCRIPTION` is what ``fedhetero --help`` says.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

from .__main__ import COMMANDS as SIMULATION_COMMANDS
from .__main__ import build_parser as build_tool_parser
from .__main__ import chosen_command, run_tool

PROG = "fedhetero"
DESCRIPTION = """\
Heterogeneity-aware federated learning on Flower: every fedhetero tool as one command.
`fedhetero COMMAND --help` shows that command's options and their defaults.

examples:
  fedhetero strategies                      # the strategies, each with its paper
  fedhetero keys --strategy fedprox         # the run-config keys fedprox reads
  fedhetero run --num-supernodes 10 -c strategy=fednova -c num-server-rounds=20
  fedhetero run --check -c partition=dirichlet -c dirichlet-alpha=0.1   # check, start nothing
  fedhetero run --resume RUN_DIR            # continue a stopped run from its last checkpoint
  fedhetero sweep simulation/experiments/niid_alpha_sweep.toml
  fedhetero report runs/niid_alpha_sweep --target 0.7
  fedhetero bench efficiency
  fedhetero deploy run --num-supernodes 2 --tls --auth
"""
DEPLOY = "deploy"  # the package `fedhetero deploy` runs as `python -m deploy` (a child process)
DEPLOY_SUMMARY = ("Flower's deployment runtime: SuperLink + SuperNodes (its own sub-commands: "
                  "fedhetero deploy --help)")
COMMANDS = SIMULATION_COMMANDS  # name -> (module with add_arguments / run, one-line summary)


def installed_version() -> str:
    """The installed distribution's version ('unknown' when run from a plain checkout)."""
    try:
        return version("fedhetero")
    except PackageNotFoundError:
        return "unknown"


def build_parser(command: str | None = None):
    """The ``fedhetero`` parser; the sub-parser of ``command`` gets its tool's arguments
    (``deploy`` is listed; its arguments are ``python -m deploy``'s)."""
    parser = build_tool_parser(command, prog=PROG, commands=COMMANDS, description=DESCRIPTION,
                               passthrough={DEPLOY: DEPLOY_SUMMARY})
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {installed_version()}")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen tool; its exit code (the console script's entry)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [DEPLOY]:
        return run_deploy(argv[1:])
    args = build_parser(chosen_command(argv, COMMANDS)).parse_args(argv)
    try:
        return run_tool(args)
    except BrokenPipeError:  # the reader went away (fedhetero keys | head): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def run_deploy(argv: list[str]) -> int:
    """``python -m deploy ARGV`` in a child process (its --help, its exit code); Ctrl-C and
    ``kill PID`` reach it as they reach this process (same process group / forwarded)."""
    env = {**os.environ, "FEDHETERO_DEPLOY_PROG": f"{PROG} {DEPLOY}"}  # deploy's usage lines
    child = subprocess.Popen([sys.executable, "-m", DEPLOY, *argv], env=env)
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.wait()
        return 130


if __name__ == "__main__":
    sys.exit(main())

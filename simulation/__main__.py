"""``python -m simulation COMMAND``: one CLI for the simulation tools.

Each tool module has ``add_arguments(parser)`` and ``run(args) -> exit code``; its
sub-parser is built from it, and only the chosen tool is imported. The ``fedhetero``
command (:mod:`simulation.cli`) offers the same commands, plus ``deploy`` (``python -m
deploy`` in a child process).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .runtime import (NOTHING_RAN, FederationConfigError, ForeignSuperLinkError, HelpFormatter,
                      stop_on_sigterm)

PROG = "python -m simulation"
COMMANDS = {
    "run": ("simulation.run", "flwr run . --stream on the simulation engine"),
    "sweep": ("simulation.sweep", "variants x seeds from a TOML sweep file, resumable"),
    "report": ("simulation.report", "tables and plots of run directories and sweep folders"),
    "results": ("simulation.results", "rebuild docs/results/* from runs/*"),
    "archive-logs": ("simulation.archive_logs",
                     "a sweep's finished runs, xz-compressed, into docs/results/run-logs/"),
    "bench": ("simulation.bench", "benchmarks (their own sub-commands)"),
    "strategies": ("simulation.list_strategies",
                   "the strategies the app runs (run-config `strategy`), each with its paper"),
    "keys": ("simulation.list_keys",
             "the run-config keys: default, allowed values, what each does"),
    "fedscale-trace": ("simulation.fedscale_traces",
                       "FedScale's device-capacity / availability pickles -> a device trace"),
    "faults-table": ("simulation.reliability.faults_table",
                     "fault class x strategy table, in-process"),
    "resume-check": ("simulation.reliability.resume_check",
                     "kill, resume and compare a run bit for bit, in-process"),
    "centralized": ("simulation.experiments.fedveca.centralized",
                    "centralized SGD with a step budget (FedVeca's fairness protocol)"),
    "fedveca-fig3": ("simulation.experiments.fedveca.fig3",
                     "FedVeca Fig. 3 with the paper's fairness protocol"),
    "fedveca-plots": ("simulation.experiments.fedveca.plots",
                      "tables and figures of a fedveca-fig3 folder"),
}


def build_parser(command: str | None = None, prog: str = PROG,
                 commands: dict[str, tuple[str, str]] = COMMANDS,
                 description: str | None = __doc__,
                 passthrough: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """The CLI parser; the sub-parser of ``command`` gets its tool's arguments.

    ``prog``, ``commands`` and ``passthrough`` (commands listed with their summary whose
    arguments another program parses) let the ``fedhetero`` command (:mod:`simulation.cli`)
    build its parser the same way, with ``deploy``.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in (passthrough or {}).items():
        sub.add_parser(name, help=summary, description=summary, add_help=False)
    for name, (module, summary) in commands.items():
        tool_parser = sub.add_parser(name, help=summary, description=summary,
                                     formatter_class=HelpFormatter)
        if name == command:
            tool = importlib.import_module(module)
            tool_parser.description = tool.__doc__
            tool.add_arguments(tool_parser)
            tool_parser.set_defaults(tool=tool)
    return parser


def chosen_command(argv: list[str], commands: dict[str, tuple[str, str]] = COMMANDS) -> str | None:
    """The sub-command ``argv`` names (its first argument), if it is one of ``commands``."""
    return argv[0] if argv and argv[0] in commands else None


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen tool; its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(chosen_command(argv)).parse_args(argv)
    return run_tool(args)


def run_tool(args) -> int:
    """The chosen tool's ``run(args)``; ``kill PID`` stops what it started, as Ctrl-C does,
    and what ``run_app`` refuses before anything starts (a federation no ClientApp fits
    here, another FLWR_HOME's SuperLink on the local port) stops it with that message, as
    a damaged run log that a tool was given to read does (naming the file)."""
    with stop_on_sigterm():
        try:
            return args.tool.run(args)
        except (FederationConfigError, ForeignSuperLinkError) as exc:
            what = "federation: " if isinstance(exc, FederationConfigError) else ""
            raise SystemExit(f"{what}{exc}\n{NOTHING_RAN}") from None
        except ValueError as exc:
            if not is_damaged_log(exc):
                raise
            raise SystemExit(str(exc)) from None


def is_damaged_log(exc: BaseException) -> bool:
    """Whether ``exc`` is :class:`fedapp.run_log.DamagedLogError` (fedapp is imported only by
    the tools that read run logs, so it is looked up, not imported, here)."""
    run_log = sys.modules.get("fedapp.run_log")
    return run_log is not None and isinstance(exc, run_log.DamagedLogError)


if __name__ == "__main__":
    sys.exit(main())

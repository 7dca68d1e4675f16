"""``python -m simulation run``: the app with the real ``flwr run . --stream`` on the
simulation engine (project-local FLWR_HOME, offline), then stop the managed local
SuperLink it started. Exits non-zero unless the run ends ``finished:completed``.

Before anything starts, the run config, a checkpoint to resume, the data and the
partitions are checked (:mod:`simulation.preflight`); ``--check`` stops there.
``--resume RUN_DIR`` continues the run in RUN_DIR with the run config of its checkpoint
(``-c`` overrides on top); the resumed run writes a new run directory. Ctrl-C stops the
SuperLink and the processes it started, by PID, and prints one line: where the last
checkpoint is and how to resume from it (exit code 130).

On a terminal a progress bar over the rounds (accuracy, elapsed, ETA) stays below the
streamed log; otherwise the log is printed as it is (:mod:`simulation.progress`)."""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from .preflight import RUN_CONFIG_CHECK, refuse_bad_run_configs, refuse_unstartable
from .progress import RunProgress
from .provenance import record as record_provenance
from .quick import QUICK_SUPERNODES, quick_overrides
from .runtime import (NOTHING_RAN, PROJECT_ROOT, client_resources, interrupt_once, option_type,
                      parse_overrides, refuse_unfittable, run_app, unused_gpus_note)
from .runtime.processes import is_alive, is_flower_process, process_tree, stop_pids
from .runtime.ray_cluster import ray_address

WHAT = RUN_CONFIG_CHECK  # the prefix of every refusal before flwr run starts
SERVER_EXIT_TIMEOUT = 40.0  # s: Flower ends a stopped run's ServerApp within a heartbeat (~25 s)
DEFAULT_SUPERNODES = 10
INTERRUPTED = 130  # the exit code of a run stopped by Ctrl-C (128 + SIGINT)
TERMINATED = 143  # stop_on_sigterm's exit code of a run stopped by kill PID (128 + SIGTERM)
# lines of the streamed ServerApp log (fedapp.server_app, fedapp.checkpoint.Checkpointer)
RUN_DIRECTORY = re.compile(r"run directory (\S+)\s*$")
CHECKPOINT = re.compile(r"Checkpoint of round (\d+): (\S+)\s*$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The run options."""
    parser.add_argument("--num-supernodes", type=option_type("num-supernodes"), default=None,
                        help="simulated SuperNodes, i.e. clients (one data partition each; "
                             "default 10, with --quick 4)")
    parser.add_argument("--quick", action="store_true",
                        help="a first look in about a minute on 2 cores: 4 SuperNodes, 10 rounds "
                             "of 40 local steps (simulation/quick.py; -c overrides any)")
    parser.add_argument("--cpus-per-client", type=option_type("client-resources-num-cpus"),
                        default=1,
                        help="whole CPUs Ray reserves per ClientApp (1: one ClientApp per core)")
    parser.add_argument("--gpus-per-client", type=option_type("client-resources-num-gpus"),
                        default=0,
                        help="GPU share per ClientApp (0.25: four share a GPU)")
    parser.add_argument("-c", "--run-config", action="append", default=[], metavar="KEY=VALUE",
                        type=override,
                        help="run-config override, repeatable (e.g. -c strategy=fedavg -c lr=0.05)")
    parser.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR (written with checkpoint-every >= 1) "
                             "with its run config, -c overrides on top; give its "
                             "--num-supernodes; the resumed run gets a new run directory")
    parser.add_argument("--check", action="store_true",
                        help="check the run config, a checkpoint to resume, the data and the "
                             "partitions, then exit without starting anything (0: it would "
                             "start)")
    parser.add_argument("--flwr-home", default=None, help="FLWR_HOME (default: <project>/.flwr)")
    parser.add_argument("--ray-address", type=ray_address, default=None, metavar="HOST:PORT",
                        help="run the ClientApps on this Ray cluster instead of a private Ray")
    # python -m deploy run's checks (--check --deployment): no simulation federation; the
    # SuperNodes' data folder (its --data-dir)
    parser.add_argument("--deployment", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--node-data-dir", default="", help=argparse.SUPPRESS)


def override(text: str) -> str:
    """A ``KEY=VALUE`` argument, checked (a bad one is a usage error)."""
    try:
        parse_overrides([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def run(args: argparse.Namespace) -> int:
    """``flwr run`` with these overrides and federation; its exit code. Ctrl-C: what was
    started is stopped, one line says what there is to resume, exit code 130."""
    watch = RunWatch()
    try:
        with interrupt_once():  # a second Ctrl-C does not cut the clean-up short
            return launch(args, watch)
    except KeyboardInterrupt:
        watch.wait_for_server()
        print(watch.stopped(), file=sys.stderr, flush=True)
        return INTERRUPTED
    except SystemExit as stop:  # kill PID: stop_on_sigterm's SystemExit(143), after clean-up
        if stop.code == TERMINATED:
            watch.wait_for_server()
            print(watch.stopped("kill (SIGTERM)"), file=sys.stderr, flush=True)
        raise


def launch(args: argparse.Namespace, watch: RunWatch) -> int:
    """Check everything, then ``flwr run``; ``watch`` sees its streamed lines."""
    if args.num_supernodes is None:
        args.num_supernodes = QUICK_SUPERNODES if args.quick else DEFAULT_SUPERNODES
    federation = None if args.deployment else client_resources(
        args.num_supernodes, args.cpus_per_client, args.gpus_per_client)
    overrides = parse_overrides(args.run_config)
    if args.resume is not None:
        overrides = resume_overrides(args.resume, overrides)
    elif args.quick:
        overrides, note = quick_overrides(overrides, args.num_supernodes)
        print(note, file=sys.stderr, flush=True)
    from fedapp.config import cli_fix  # noqa: PLC0415 - the app's modules: only here
    refuse_bad_run_configs([(WHAT, overrides)], federation, fix_as=cli_fix)
    if federation is not None:
        refuse_unfittable(federation, args.ray_address)
    refuse_unstartable(WHAT, overrides, args.num_supernodes, args.node_data_dir, fix_as=cli_fix)
    if args.check or args.deployment:
        print(f"{WHAT}: the run would start (nothing was started)", flush=True)
        return 0
    note = unused_gpus_note(federation, args.ray_address)
    if note:
        print(note, file=sys.stderr, flush=True)
    watch.checkpoint_every = int(overrides.get("checkpoint-every", 0) or 0)
    watch.resumed_from = str(overrides.get("resume-from") or "") or None
    with RunProgress(planned_rounds(overrides)) as progress:
        watch.forward = progress
        code = run_app(overrides or None, federation, flwr_home=args.flwr_home,
                       ray_address=args.ray_address, on_line=watch).returncode
    if watch.run_dir is not None and Path(watch.run_dir).is_dir():  # commit, dirty, seeds
        record_provenance(Path(watch.run_dir), {**app_config(), **overrides},
                          "resumed" if watch.resumed_from else "ran")
    return code


def planned_rounds(overrides: dict[str, object]) -> int:
    """num-server-rounds of the run: the override, else the app's default (pyproject.toml).
    A bad override falls back to the default here; the ServerApp reports it."""
    rounds = overrides.get("num-server-rounds")
    if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1:
        return rounds
    return int(app_config()["num-server-rounds"])


@functools.cache
def app_config() -> dict[str, object]:
    """The app's run-config defaults: pyproject.toml's ``[tool.flwr.app.config]``."""
    pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    return dict(pyproject["tool"]["flwr"]["app"]["config"])


# ----------------------------------------------------------------- --resume RUN_DIR
def resume_overrides(run_dir: Path, given: dict[str, object]) -> dict[str, object]:
    """The overrides that resume the run in ``run_dir``: its checkpoint's run config (the
    values that differ from the app's defaults), ``resume-from`` = ``run_dir``, and the
    ``-c`` overrides ``given`` on top, with a note naming those that change it."""
    from fedapp.checkpoint import load_checkpoint  # noqa: PLC0415 - flwr, numpy: only here
    from fedapp.config import ConfigError, cli_fix, with_fix_as  # noqa: PLC0415

    run_dir = run_dir.expanduser().resolve()
    if "resume-from" in given:
        raise SystemExit(
            f"--resume {run_dir} and -c resume-from={given['resume-from']!r}: give one of them "
            f"(--resume takes the run config from the run directory; -c resume-from needs "
            f"every other key given again)\n{NOTHING_RAN}")
    try:
        payload = load_checkpoint(run_dir)
    except ConfigError as exc:  # its fix in the syntax used: --resume, not resume-from
        message = with_fix_as(exc, lambda fix: "leave out --resume")
        raise SystemExit(f"--resume {run_dir}: {message}\n{NOTHING_RAN}") from None
    saved = {key: value for key, value in payload["run-config"].items() if key != "resume-from"}
    defaults = app_config()
    base = {key: value for key, value in saved.items()
            if key not in defaults or defaults[key] != value}
    changed = {key: value for key, value in given.items()
               if saved.get(key, defaults.get(key)) != value}
    note = (f"note: resuming {run_dir} after its round {payload['round']} with its run config "
            f"(the resumed run gets a new run directory; the run directory does not record "
            f"--num-supernodes: give the original run's)")
    if changed:
        shown = ", ".join(f"{cli_fix({key: value})} (was {saved.get(key, defaults.get(key))!r})"
                          for key, value in changed.items())
        note += f"; on top: {shown}"
    print(note, file=sys.stderr, flush=True)
    return {**base, **given, "resume-from": str(run_dir)}


# ----------------------------------------------------------------- Ctrl-C
class RunWatch:
    """What the streamed ServerApp log has said about the run: its run directory and its
    last checkpoint, for the line Ctrl-C prints. Every line goes on to ``forward``."""

    def __init__(self, forward: Callable[[str], None] | None = None) -> None:
        self.forward = forward
        self.run_dir: str | None = None
        self.checkpoint_round: int | None = None
        self.checkpoint_every = 0
        self.resumed_from: str | None = None  # resume-from: a checkpoint from before this run

    def __call__(self, line: str) -> None:
        text = ANSI.sub("", line)
        if match := RUN_DIRECTORY.search(text):
            self.run_dir = match.group(1)
        if match := CHECKPOINT.search(text):
            self.checkpoint_round = int(match.group(1))
            self.run_dir = str(Path(match.group(2)).parent)
        if self.forward is not None:
            self.forward(line)

    def wait_for_server(self, timeout: float = SERVER_EXIT_TIMEOUT) -> None:
        """Until the process that ran this launch's ServerApp (its run directory's
        server.pid) has exited, after ``flwr stop`` (Flower ends it at its next Grid call or
        heartbeat); then (or after ``timeout`` s) that process and what it started (Ray)
        are stopped by PID, if still there."""
        from fedapp.run_log import SERVER_PID  # noqa: PLC0415

        try:
            pid = int((Path(str(self.run_dir)) / SERVER_PID).read_text())
        except (OSError, ValueError, TypeError):
            return
        if not (is_alive(pid) and is_flower_process(pid)):
            return
        below = process_tree([pid])  # its Ray: orphaned, not the SuperLink's, once it exits
        deadline = time.monotonic() + timeout
        while is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        stop_pids([p for p in below if is_alive(p)])

    def stopped(self, cause: str = "Ctrl-C") -> str:
        """The one line after Ctrl-C (once everything is stopped): what there is to resume,
        and how. The round is the checkpoint's own: the ServerApp may have written later
        ones than the streamed log showed before it was stopped."""
        if self.checkpoint_round is not None:
            last = saved_round(Path(str(self.run_dir))) or self.checkpoint_round
            return (f"Stopped by {cause}; the last checkpoint (round {last}) is in "
                    f"{self.run_dir} (resume with fedhetero run --resume {self.run_dir})")
        if self.resumed_from is not None:
            return (f"Stopped by {cause} before this run's first checkpoint; resume from the "
                    f"one it started from: fedhetero run --resume {self.resumed_from}")
        if self.run_dir is not None:
            why = (f"the first is written after round {self.checkpoint_every}"
                   if self.checkpoint_every else
                   "checkpoint-every=0; give -c checkpoint-every=1 to make a run resumable")
            return f"Stopped by {cause}; {self.run_dir} has no checkpoint to resume from ({why})"
        return f"Stopped by {cause} before the run started; nothing to resume"


def saved_round(run_dir: Path) -> int | None:
    """The round of the checkpoint in ``run_dir`` (its manifest's), None if unreadable."""
    from fedapp.checkpoint import CHECKPOINT_NAME  # noqa: PLC0415

    try:
        saved = json.loads((run_dir / CHECKPOINT_NAME).read_text())["round"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return saved if isinstance(saved, int) else None

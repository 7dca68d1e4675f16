"""A SuperExec whose ClientApp processes fork from a parent that has already imported
flwr and torch.

Flower 1.41 runs every message a SuperNode receives in a new ``flwr-clientapp`` process
(``flwr/supernode/runtime/run_clientapp.py``: one task, then exit). Measured on the bench
workload (2 SuperNodes, one torch thread each), each of those processes spent 3.5-4.3 s
before its training started, about 1.2 s of it importing flwr and 1.5-2 s importing torch.

``python -m deploy.warm_superexec`` is Flower's own SuperExec loop
(``flwr.supercore.superexec.run_superexec``: ask the SuperNode's Runtime API for a task,
launch it, poll again) with one change: its executor, :class:`ForkExecutor`, starts a
ClientApp task by ``os.fork()`` of this process, whose modules (flwr's ClientApp runtime,
numpy, torch) are already imported, and the child runs Flower's ``run_clientapp`` as the
``flwr-clientapp`` command would. The app itself (its FAB) is installed and imported by
each child as before, so a new app version needs no restart. Other task types go to
Flower's :class:`SubprocessExecutor` unchanged.

Start it beside a SuperNode in ``--isolation process`` mode, which then does not start a
SuperExec of its own (docs/deployment.md, "Warm ClientApp processes"). POSIX only.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from logging import ERROR, INFO
from pathlib import Path

from flwr.supercore import log
from flwr.supercore.constant import TaskType
from flwr.supercore.superexec import run_superexec as flower_superexec
from flwr.supercore.superexec.executor import LaunchResult, SubprocessExecutor
from flwr.supercore.superexec.executor.types import ExecutionSpec
from flwr.supercore.tls import validate_and_resolve_root_certificates
from flwr.supernode.runtime.run_clientapp import run_clientapp

# imported once here, inherited by every ClientApp process (comma-separated to change)
# torch._dynamo: torch's optimisers import it on their first construction (the
# ``_disable_dynamo`` wrapper of ``Optimizer.__init__``), about 1.1 s of CPU in every forked
# ClientApp otherwise (py-spy of a deployed round: 3/4 of a child's time)
PRELOAD = ("numpy", "torch", "torch._dynamo")
PRELOAD_ENV = "FEDHETERO_SUPEREXEC_PRELOAD"


def preload(modules: Sequence[str]) -> None:
    """Import ``modules`` in this process. Nothing here may start torch's thread pool
    (no tensor operations): a child forked after that would inherit a broken one."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:  # a node without torch still runs its ClientApps
            log(ERROR, "SuperExec: cannot preload %r (%s); ClientApps import it themselves",
                name, err)


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited, a zombie included (Flower's parent monitor tests
    ``os.kill(pid, 0)``, which a zombie passes: a SuperNode started by a Python parent that
    has not yet waited for it would never be seen to die)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):  # no /proc (macOS): os.kill says it runs
        return False
    return state in ("Z", "X")


def exit_with(pid: int, interval: float = 0.2, at_once: bool = False,
              grace: float = 15.0) -> None:
    """Once ``pid`` is gone: SIGINT this process (Flower's handlers then exit it cleanly;
    before its loop installs them, :func:`main` ends on the KeyboardInterrupt), and if it
    still runs ``grace`` seconds later, end it on the spot (``os._exit``). With ``at_once``
    end it on the spot at once: a forked ClientApp needs that, as it inherited the
    SuperExec's handlers and the locks of threads it does not have, and a clean exit there
    was seen to wait forever (its SuperNode is gone, so its reply has nowhere to go)."""
    def watch() -> None:
        while not process_gone(pid):
            time.sleep(interval)
        if at_once:
            os.write(2, f"flwr-clientapp (forked): its SuperExec {pid} is gone; "
                        "exiting\n".encode())
            os._exit(1)
        log(INFO, "SuperExec: its SuperNode %d is gone; exiting", pid)
        signal.raise_signal(signal.SIGINT)
        time.sleep(grace)
        os.write(2, f"SuperExec: still running {grace:.0f} s after SIGINT; exiting now\n".encode())
        os._exit(1)

    threading.Thread(target=watch, name=f"exit-with-{pid}", daemon=True).start()


def _run_child(spec: ExecutionSpec) -> int:
    """In the forked child: what ``flwr-clientapp --token ...`` runs; its exit code."""
    sys.argv = ["flwr-clientapp"]  # what Flower's exit telemetry and logs look at
    if spec.parent_pid is not None:  # this SuperExec: the child goes when it goes
        exit_with(spec.parent_pid, at_once=True)
    if spec.suppress_output:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    try:
        run_clientapp(
            runtime_api_address=spec.runtime_api_address,
            token=spec.token,
            insecure=spec.insecure,
            certificates=validate_and_resolve_root_certificates(
                spec.root_certificates_path, spec.insecure),
            parent_pid=None,  # watched by exit_with above
            runtime_dependency_install=spec.runtime_dependency_install,
        )
    except SystemExit as done:  # run_clientapp always ends in flwr_exit -> sys.exit
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException as err:  # noqa: BLE001 - reported, then the child exits non-zero
        log(ERROR, "flwr-clientapp (forked) failed: %r", err)
        return 1
    return 0


def fork_child(run: Callable[[], int]) -> int:
    """``os.fork()``; the child runs ``run()`` and exits with its code (``os._exit``, after
    flushing stdout and stderr: never back into the parent's loop, none of the parent's
    atexit handlers). Returns the child's pid in the parent; raises ``OSError``."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = run()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


class ForkExecutor(SubprocessExecutor):
    """Flower's Executor protocol: ClientApp tasks by fork, everything else as Flower does."""

    def __init__(self) -> None:
        self.children: set[int] = set()
        self.launched_at = -float("inf")  # time.monotonic() of the last fork

    def busy_at(self) -> float:
        """When this executor last had work: now while a child runs, else its last fork."""
        return time.monotonic() if self.children else self.launched_at

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        """Fork a ClientApp task; other task types: a subprocess, as Flower's executor."""
        if spec.task_type != TaskType.CLIENT_APP:
            return super().launch(spec)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = fork_child(lambda: _run_child(spec))
        except OSError as err:
            return LaunchResult.failed(f"fork failed: {err}")
        self.children.add(pid)
        self.launched_at = time.monotonic()
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap the children that have finished (called by Flower's loop every poll)."""
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)

    def close(self) -> None:
        """Running children finish their task (they watch ``--parent-pid`` themselves)."""
        self.reconcile()


def patch_flower(executor: ForkExecutor) -> None:
    """The Flower patches this process asks for (:mod:`fedapp.flower_patches`): the
    children's message arrays pulled with a 0.05 s first retry (the children inherit it),
    ``executor`` as the executor of Flower's SuperExec loop, and that loop's polls slowed to
    0.5 s after 30 s without a ClientApp. Then forget the app's modules
    again: they ship in the app's FAB, and every ClientApp imports them from its own FAB,
    never from here."""
    before = set(sys.modules)
    from fedapp import flower_patches  # noqa: PLC0415

    flower_patches.shorten_object_pulls()
    flower_patches.use_superexec_executor(executor)
    flower_patches.slow_idle_superexec_polls(executor.busy_at)
    for name in set(sys.modules) - before:
        if name.split(".")[0] == "fedapp":
            del sys.modules[name]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``flower-superexec`` options a SuperNode's local SuperExec needs."""
    p.add_argument("--runtime-api-address", required=True,
                   help="the SuperNode's Runtime API (its --clientappio-api-address), "
                        "e.g. 127.0.0.1:9094")
    p.add_argument("--insecure", action="store_true",
                   help="no TLS to the Runtime API (a SuperNode on the same host)")
    p.add_argument("--root-certificates", default=None, metavar="CA_CERT",
                   help="CA certificate of the Runtime API's TLS certificate")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit when this process (the SuperNode) exits")
    p.add_argument("--preload", default=os.environ.get(PRELOAD_ENV, ",".join(PRELOAD)),
                   help=f"modules imported once and inherited by every ClientApp process, "
                        f"comma-separated (default: {','.join(PRELOAD)}; env {PRELOAD_ENV})")


def run(args: argparse.Namespace) -> int:
    """Flower's SuperExec loop with :class:`ForkExecutor`; returns only on error."""
    if not hasattr(os, "fork"):
        raise SystemExit("deploy.warm_superexec: needs os.fork (Linux/macOS); on this system "
                         "start the SuperNode without --isolation process instead")
    if args.root_certificates is None and not args.insecure:
        raise SystemExit("deploy.warm_superexec: give --root-certificates CA_CERT (the Runtime "
                         "API's TLS) or --insecure (a SuperNode on this host without TLS)")
    preload([m for m in args.preload.split(",") if m.strip()])
    executor = ForkExecutor()
    patch_flower(executor)  # Flower's loop builds its executor by name: it gets this one
    if args.parent_pid is not None:
        exit_with(args.parent_pid)
    log(INFO, "Starting SuperExec (ClientApps forked from a process with %s imported)",
        args.preload or "nothing")
    flower_superexec.run_superexec(
        runtime_api_address=args.runtime_api_address,
        insecure=args.insecure,
        root_certificates_path=args.root_certificates,
        parent_pid=None,  # watched by exit_with above
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m deploy.warm_superexec --runtime-api-address HOST:PORT ...``"""
    parser = argparse.ArgumentParser(prog="python -m deploy.warm_superexec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    # A SuperNode started in the background by a shell script passes SIGINT on ignored;
    # exit_with relies on it (Flower's own handlers replace this one once its loop runs).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return run(parser.parse_args(argv))
    except KeyboardInterrupt:  # SIGINT before Flower's loop installed its handlers
        return 130


if __name__ == "__main__":  # run as a module: imports flwr and the preloads, not the app
    sys.exit(main())

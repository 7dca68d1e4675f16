"""Start long-running Flower processes with a log file; stop them (and their children) by PID."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from simulation.launcher import descendants, stop_pids


@dataclass
class Started:
    """One process we started: its name (for messages), Popen handle and log file."""

    name: str
    proc: subprocess.Popen
    log_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        """The end of its log (for error messages)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start(name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> Started:
    """Start ``argv`` with stdout+stderr into ``log_path`` (kept as a child of ours)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    return Started(name, proc, log_path)


def stop(started: Sequence[Started], timeout: float = 15.0) -> None:
    """SIGTERM each process and everything below it (collected first), then SIGKILL leftovers.

    Only these PIDs and their descendants are signalled, never processes found by name.
    """
    pids = []
    for item in started:
        if item.proc.poll() is None:
            pids.append(item.proc.pid)
        pids.extend(descendants(item.proc.pid))
    stop_pids(pids, timeout)
    for item in started:
        try:
            item.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def wait_for_port(host: str, port: int, timeout: float, watch: Started | None = None) -> None:
    """Block until ``host:port`` accepts TCP connections; error if ``watch`` dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if watch is not None and watch.proc.poll() is not None:
            raise RuntimeError(f"{watch.name} exited with code {watch.proc.returncode} before listening on "
                               f"{host}:{port}; its log ({watch.log_path}) ends with:\n{watch.log_tail()}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout} s; "
                       + (f"see {watch.log_path}" if watch else "is the process running?"))

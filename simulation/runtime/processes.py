"""Start long-running processes with a log file; stop process trees by PID, never by name."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """All processes below ``pid`` (children first), from /proc."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(proc.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def process_tree(roots: Iterable[int]) -> list[int]:
    """Each root followed by its descendants, collected before anything is signalled
    (children in process groups of their own outlive a parent that dies first)."""
    return list(dict.fromkeys(pid for root in roots for pid in [root, *descendants(root)]))


def send_signal(pid: int, sig: int) -> None:
    """``os.kill`` that ignores a process that is already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within it, SIGTERM (``kill PID``, ``timeout``, a batch scheduler) ends this process
    the way Ctrl-C does: a ``SystemExit(143)`` unwinds the ``finally`` blocks that stop
    what it started (the SuperLink, SuperNodes, Ray), by PID, instead of leaving them
    running. Later SIGTERMs are ignored so that the clean-up finishes; the previous handler
    is back afterwards. Main thread only (Python runs signal handlers there); the tools'
    entry points hold it around the tool."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, _frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def interrupt_once() -> Iterator[None]:
    """Within it, the first Ctrl-C (SIGINT) raises KeyboardInterrupt as always, and later
    ones are ignored, so that the ``finally`` blocks that stop what was started (the
    SuperLink, its processes, Ray), by PID, finish instead of being cut short by a second
    Ctrl-C. The previous handler is back afterwards; main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def is_flower_process(pid: int) -> bool:
    """True when ``pid``'s command line is Flower's (``flwr-simulation``, ``flwr-serverapp``,
    ...): a PID read from a file is signalled only while it is still that process."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(b"flwr" in a or b"flower" in a for a in argv[:2])


def stop_pids(pids: list[int], timeout: float = 15.0) -> None:
    """SIGTERM every PID, wait up to ``timeout`` s, then SIGKILL the survivors."""
    for pid in pids:
        send_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(is_alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        if is_alive(pid):
            send_signal(pid, signal.SIGKILL)


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


def start_process(name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path,
                  log_path: Path) -> Started:
    """Start ``argv`` with stdout+stderr appended to ``log_path`` (kept as a child of ours)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Started(name, proc, log_path)


def stop_processes(started: Sequence[Started], timeout: float = 15.0) -> None:
    """Stop each process and everything below it, by PID; reap our children."""
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
    """Block until ``host:port`` accepts TCP connections; error if ``watch`` dies first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if watch is not None and watch.proc.poll() is not None:
            raise RuntimeError(f"{watch.name} exited with code {watch.proc.returncode} before "
                               f"listening on {host}:{port}; its log ({watch.log_path}) ends "
                               f"with:\n{watch.log_tail()}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout} s; "
                       + (f"see {watch.log_path}" if watch else "is the process running?"))

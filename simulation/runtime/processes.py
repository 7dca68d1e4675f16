"""Start long-running processes with a log file; stop process trees by PID, never by name."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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


REDELIVERY_SECONDS = 0.1  # a signal dropped in a finaliser comes again this much later


@contextlib.contextmanager
def first_signal_raises(signum: int, error: Callable[[], BaseException]) -> Iterator[None]:
    """Within it, the first ``signum`` raises ``error()`` in the main thread, and later ones
    are ignored so that the ``finally`` blocks it unwinds (stopping what was started, by
    PID) finish. A signal that lands while a finaliser or a weakref callback runs would have
    its exception dropped by Python ("Exception ignored in ...") and the process would go on
    deaf to that signal: the exception is recognised in ``sys.unraisablehook`` and the
    signal sent again to the main thread from a timer thread (``signal.pthread_kill``) after
    :data:`REDELIVERY_SECONDS`, once the hook has returned (raised inside the hook, it would
    be dropped for good), to be raised where it unwinds. The
    previous handler and hook are back afterwards; main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[BaseException] = []

    def handler(_signum: int, _frame) -> None:
        if raised:
            return  # the clean-up it started is running
        raised.append(error())
        raise raised[0]

    def dropped(unraisable) -> None:
        if raised and unraisable.exc_value is raised[0]:
            raised.clear()
            again = threading.Timer(REDELIVERY_SECONDS, signal.pthread_kill,
                                    (threading.main_thread().ident, signum))
            again.daemon = True
            again.start()
        else:
            previous_hook(unraisable)

    previous_hook = sys.unraisablehook
    previous = signal.signal(signum, handler)
    sys.unraisablehook = dropped
    try:
        yield
    finally:
        signal.signal(signum, previous)
        sys.unraisablehook = previous_hook


def stop_on_sigterm() -> contextlib.AbstractContextManager[None]:
    """Within it, SIGTERM (``kill PID``, ``timeout``, a batch scheduler) ends this process
    the way Ctrl-C does: a ``SystemExit(143)`` unwinds the ``finally`` blocks that stop
    what it started (the SuperLink, SuperNodes, Ray), by PID, instead of leaving them
    running; later SIGTERMs wait for that clean-up (:func:`first_signal_raises`). The tools'
    entry points hold it around the tool."""
    return first_signal_raises(signal.SIGTERM, lambda: SystemExit(128 + signal.SIGTERM))


def interrupt_once() -> contextlib.AbstractContextManager[None]:
    """Within it, the first Ctrl-C (SIGINT) raises KeyboardInterrupt as always, and later
    ones are ignored, so that the ``finally`` blocks that stop what was started (the
    SuperLink, its processes, Ray), by PID, finish instead of being cut short by a second
    Ctrl-C (:func:`first_signal_raises`)."""
    return first_signal_raises(signal.SIGINT, KeyboardInterrupt)


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

"""Where a benchmark's CPU went: every process's CPU time, read from Linux's
``/proc/<pid>/stat`` twice a second during a real ``flwr run``, summed by kind of process
over the timed rounds. The window ends when the run log gets its last round's record (the
last round is evaluated in the foreground, so that record is written when the round ends)
and starts the timed rounds' wall seconds before that."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .periodic import PeriodicSampler

CLIENT_ACTORS = "client actors (Ray workers running the ClientApps)"
SERVER_PROCESS = "ServerApp (strategy, Flower's engine, Ray driver) + its evaluation process"
EVERYTHING_ELSE = "everything else (SuperLink, Ray's daemons, flwr CLI, the OS)"
IDLE = "idle"


def process_kind(cmdline: str) -> str:
    """The kind of a process, from its command line."""
    if cmdline.startswith("ray::"):
        return CLIENT_ACTORS
    if "flwr-simulation" in cmdline or "fedapp.evaluation_process" in cmdline:
        return SERVER_PROCESS
    return EVERYTHING_ELSE


def stat_fields(pid: int | str = "self") -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (``[7]`` minor faults,
    ``[11]`` user and ``[12]`` system clock ticks); OSError where there is none."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds_by_pid(exclude: int) -> dict[int, tuple[str, float]]:
    """{pid: (kind, user + system CPU seconds so far)} of every process but ``exclude``."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == exclude:
            continue
        try:
            fields = stat_fields(entry.name)
            with open(f"/proc/{entry.name}/cmdline") as f:
                cmdline = f.read().replace("\0", " ")
        except OSError:  # the process ended between the listing and the read
            continue
        seconds[int(entry.name)] = (process_kind(cmdline), (int(fields[11]) + int(fields[12])) / tick)
    return seconds


class CpuSampler(PeriodicSampler):
    """Samples :func:`cpu_seconds_by_pid` every ``interval`` seconds in a daemon thread,
    with how many records the run log (the first file matching ``run_log_glob`` under
    ``root``) has at that moment. ``available`` is False off Linux (no ``/proc``)."""

    def __init__(self, root: Path, run_log_glob: str = "*/rounds.jsonl",
                 interval: float = 0.5) -> None:
        super().__init__(interval, "fedhetero-cpu-sampler")
        self.root, self.run_log_glob = Path(root), run_log_glob
        self.samples: list[tuple[float, int, dict[int, tuple[str, float]]]] = []

    def _records(self) -> int:
        logs = sorted(self.root.glob(self.run_log_glob))
        try:
            return sum(1 for line in logs[0].read_text().splitlines() if line.strip()) if logs else 0
        except OSError:
            return 0

    def sample(self) -> None:
        self.samples.append((time.monotonic(), self._records(), cpu_seconds_by_pid(os.getpid())))

    def by_kind(self, records: int, window_seconds: float, cpus: int) -> dict[str, float] | None:
        """CPU seconds per kind of process (and ``IDLE``: the rest of ``cpus`` x the window)
        in the ``window_seconds`` before the run log first had ``records`` records; None
        when that moment or the window's start was not sampled."""
        end = next((i for i, (_, n, _) in enumerate(self.samples) if n >= records), None)
        if end is None:
            return None
        start_time = self.samples[end][0] - window_seconds
        start = max((i for i, (t, _, _) in enumerate(self.samples) if t <= start_time),
                    default=None)
        if start is None:
            return None
        before = self.samples[start][2]
        latest: dict[int, tuple[str, float]] = {}  # a process that ended keeps its last value
        for _, _, seconds in self.samples[start:end + 1]:
            latest.update(seconds)
        totals = {CLIENT_ACTORS: 0.0, SERVER_PROCESS: 0.0, EVERYTHING_ELSE: 0.0}
        for pid, (kind, cpu) in latest.items():
            totals[kind] += cpu - before.get(pid, (kind, 0.0))[1]
        span = self.samples[end][0] - self.samples[start][0]
        totals[IDLE] = max(0.0, cpus * span - sum(totals.values()))
        return totals

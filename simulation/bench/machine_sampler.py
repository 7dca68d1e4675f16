"""Peak memory and GPU use of what a benchmark starts: every ``interval`` seconds, the
summed resident memory (``VmRSS``, and its anonymous part ``RssAnon``, of Linux's
``/proc/<pid>/status``) of every descendant of this process (under ``flwr run`` run the
SuperLink it starts, the SuperExec, the ServerApp and its evaluation process, Ray's
daemons and the raylet's ClientApp actors: all of them; and each, once seen, for as long
as it runs: when ``flwr run`` ends, the SuperLink and all below it have init as their
parent until they are stopped), and, where ``nvidia-smi`` is on PATH, the GPUs'
utilisation and memory used. A sum of RSS counts the pages that processes
share (torch's libraries) once per process: an upper bound of what the machine holds."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .cpu_accounting import stat_fields
from .periodic import PeriodicSampler

GPU_QUERY = ["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]


def parent_pids() -> dict[int, int]:
    """{pid: parent pid} of every process this user can see."""
    parents = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(stat_fields(entry.name)[1])
            except (OSError, IndexError, ValueError):  # ended between the listing and the read
                continue
    return parents


def descendants_of(root: int, parents: dict[int, int]) -> list[int]:
    """The processes whose parent chain leads to ``root`` (``root`` itself not included)."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def resident_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) of ``pid`` in kB; (0, 0) for a process gone or a kernel thread."""
    rss = anon = 0
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, anon


def tree_resident_mb(root: int, known: set[int] | None = None) -> tuple[float, float]:
    """(summed VmRSS, summed RssAnon) in MB of every descendant of ``root`` and of every
    process in ``known`` still running; the descendants found are added to ``known`` (the
    SuperLink and all below it outlive ``flwr run`` by a moment: then init is their parent)."""
    parents = parent_pids()
    known = set() if known is None else known
    known.intersection_update(parents)
    known.update(descendants_of(root, parents))
    kb = [resident_kb(pid) for pid in known]
    return sum(r for r, _ in kb) / 1024, sum(a for _, a in kb) / 1024


def _number(text: str) -> float | None:
    """A number of nvidia-smi's CSV, or None for ``[N/A]`` and the like."""
    try:
        return float(text)
    except ValueError:
        return None


def gpu_reading(nvidia_smi: str) -> tuple[float | None, float | None] | None:
    """(mean utilisation % over the GPUs, summed MiB used) now, each None where nvidia-smi
    reports none (``[N/A]``); None when the query fails or reports neither."""
    try:
        out = subprocess.run([nvidia_smi, *GPU_QUERY], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[_number(v) for v in line.split(",")] for line in out.splitlines() if line.strip()]
    utilisation = [r[0] for r in rows if r[0] is not None]
    memory = [r[1] for r in rows if len(r) > 1 and r[1] is not None]
    if not utilisation and not memory:
        return None
    return (sum(utilisation) / len(utilisation) if utilisation else None,
            sum(memory) if memory else None)


class MachineSampler(PeriodicSampler):
    """Samples :func:`tree_resident_mb` of ``root`` (default: this process) and, with
    ``nvidia-smi`` on PATH, :func:`gpu_reading`, every ``interval`` seconds in a daemon
    thread while held. Usable as a bench's ``observer(output_dir)`` (the folder is not
    read). ``available`` is False off Linux (no ``/proc``): nothing is sampled then."""

    def __init__(self, output_dir: Path | None = None, *, root: int | None = None,
                 interval: float = 0.5) -> None:
        super().__init__(interval, "fedhetero-machine-sampler")
        self.output_dir = output_dir
        self.root = os.getpid() if root is None else root
        self.nvidia_smi = shutil.which("nvidia-smi")
        self.peak_rss_mb = 0.0
        self.peak_anon_mb = 0.0
        self.gpu: list[tuple[float | None, float | None]] = []  # (utilisation %, MiB used)
        self._known: set[int] = set()  # every descendant seen, while it runs

    def sample(self) -> None:
        rss, anon = tree_resident_mb(self.root, self._known)
        self.peak_rss_mb = max(self.peak_rss_mb, rss)
        self.peak_anon_mb = max(self.peak_anon_mb, anon)
        if self.nvidia_smi is not None:
            reading = gpu_reading(self.nvidia_smi)
            if reading is None:
                self.nvidia_smi = None  # no GPU answers: stop asking
            else:
                self.gpu.append(reading)

    @property
    def mean_gpu_utilisation(self) -> float | None:
        """Mean GPU utilisation (%) over the samples; None without a reading of it."""
        readings = [u for u, _ in self.gpu if u is not None]
        return sum(readings) / len(readings) if readings else None

    @property
    def peak_gpu_memory_mb(self) -> float | None:
        """Most GPU memory used (MiB) in any sample; None without a reading of it."""
        return max((m for _, m in self.gpu if m is not None), default=None)

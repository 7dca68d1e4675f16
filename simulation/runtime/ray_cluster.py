"""Start and stop Ray cluster nodes by PID (``ray start --block``), for tests and demos.

On real machines use ``ray start`` directly (docs/simulation.md, "Running on a Ray cluster"); this
module starts the same commands as child processes so a test can bring up a head and a
worker on one machine, point the simulation engine at them (``RAY_ADDRESS``) and stop
exactly what it started. ``ray stop`` is never used: it stops every Ray on the machine.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .processes import process_tree, stop_pids

RAY = str(Path(sys.executable).parent / "ray")
RAY_CLUSTER_HELP = ("start the head with: ray start --head --port=6379 (docs/simulation.md: 'Running on a Ray "
                    "cluster'), or leave --ray-address out for a private Ray on this machine")


def ray_address(text: str, timeout: float = 3.0) -> str:
    """An argparse ``type`` for ``--ray-address``: ``HOST:PORT`` of a Ray head's GCS that
    accepts connections now. Without this check a wrong address left the run waiting in
    round 1 for ClientApps that never start."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: give HOST:PORT of the Ray head, e.g. "
                                         f"192.168.1.10:6379; {RAY_CLUSTER_HELP}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return text
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r}: no Ray head answers there ({exc.strerror or exc}); {RAY_CLUSTER_HELP}"
        ) from None


@dataclass
class RayNode:
    """One ``ray start --block`` process and what it logs to."""

    process: subprocess.Popen
    log: Path
    pids: list[int] = field(default_factory=list)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop this node's process tree (collected first: Ray's agents outlive the raylet)."""
        self.pids = [*process_tree([self.process.pid]), *self.pids]
        stop_pids(list(dict.fromkeys(self.pids)), timeout)
        self.process.wait(timeout=timeout)


def start_node(args: list[str], log: Path) -> RayNode:
    """``ray start --block ARGS`` as our child, logging to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = log.open("w")
    process = subprocess.Popen(
        [RAY, "start", "--block", "--disable-usage-stats", *args],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=ray_env(),
    )
    handle.close()
    return RayNode(process, log)


def ray_env() -> dict[str, str]:
    """This process's environment without RAY_ADDRESS."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # `ray start` must not read a caller's address
    return env


def start_head(port: int, num_cpus: int, temp_dir: Path, log: Path) -> RayNode:
    """A head node on this machine listening on ``port`` (its GCS), with ``num_cpus`` CPUs.

    ``temp_dir`` keeps Ray's session files (and its ``ray_current_cluster`` pointer)
    out of /tmp/ray; keep it short: Ray's socket paths must fit in 107 characters.
    """
    return start_node(
        [
            "--head",
            f"--port={port}",
            f"--num-cpus={num_cpus}",
            f"--temp-dir={temp_dir}",
            "--include-dashboard=false",
        ],
        log,
    )


def start_worker(address: str, num_cpus: int, log: Path) -> RayNode:
    """A worker node joining the cluster whose head listens at ``address`` (host:port)."""
    return start_node([f"--address={address}", f"--num-cpus={num_cpus}"], log)


def cluster_status(address: str) -> str:
    """``ray status`` of the cluster at ``address`` ('' while it does not answer)."""
    proc = subprocess.run(
        [RAY, "status", f"--address={address}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=ray_env(),
    )
    return proc.stdout if proc.returncode == 0 else ""


def active_nodes_and_cpus(status: str) -> tuple[int, float]:
    """(active node count, total CPUs) parsed from ``ray status`` output."""
    active = status.split("Active:", 1)[1].split("Pending:", 1)[0] if "Active:" in status else ""
    nodes = len(re.findall(r"^\s*\d+\s+node_", active, flags=re.MULTILINE))
    match = re.search(r"[\d.]+/([\d.]+) CPU", status)
    return nodes, float(match.group(1)) if match else 0.0


def wait_for_nodes(address: str, count: int, timeout: float = 120.0) -> tuple[int, float]:
    """Poll until ``count`` nodes are active; returns (nodes, CPUs) or raises TimeoutError."""
    deadline = time.monotonic() + timeout
    seen = (0, 0.0)
    while time.monotonic() < deadline:
        seen = active_nodes_and_cpus(cluster_status(address))
        if seen[0] >= count:
            return seen
        time.sleep(2)
    raise TimeoutError(
        f"Ray cluster at {address}: {seen[0]} of {count} nodes active after {timeout:.0f} s"
    )

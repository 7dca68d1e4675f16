"""Run the app with the real ``flwr run`` on a managed local SuperLink, and clean up.

``flwr run .`` starts a background "managed local SuperLink" (simulation runtime)
that outlives the command. We give every launch an explicit ``FLWR_HOME`` (by default
the project-local ``.flwr/``, never the user's ``~/.flwr``), disable runtime
dependency installation and update checks (offline machines), and afterwards stop the
SuperLink this launch started, by PID: the process whose command line carries this
FLWR_HOME's log file.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def parse_value(text: str) -> object:
    """A ``KEY=VALUE`` value as ``flwr run --run-config`` would type it: int, float, bool or string."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text.strip("'\"")


def parse_overrides(items: list[str]) -> dict[str, object]:
    """['lr=0.05', "strategy=fednova"] -> {'lr': 0.05, 'strategy': 'fednova'}."""
    overrides: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--run-config {item!r}: expected KEY=VALUE, e.g. -c num-server-rounds=5")
        overrides[key.strip()] = parse_value(value.strip())
    return overrides


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flwr_env(flwr_home: Path, base: Mapping[str, str] | None = None, isolate_ports: bool = False,
             ray_address: str | None = None) -> dict[str, str]:
    """Environment for an offline ``flwr`` CLI with its own FLWR_HOME.

    ``ray_address`` (``host:port`` of a running Ray cluster's head) makes the simulation
    engine run its ClientApp actors on that cluster instead of starting a private Ray.
    """
    env = dict(os.environ if base is None else base)
    env["FLWR_HOME"] = str(flwr_home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    # Without an explicit RAY_ADDRESS, ray.init() attaches to any Ray cluster that
    # `ray start` left running on this machine; a simulation should start its own
    # unless the user points it at a cluster (README: "Ray cluster").
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    env.setdefault("RAY_ADDRESS", "local")
    if isolate_ports:
        env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(free_port())
        env["FLWR_LOCAL_CONTROL_API_PORT"] = str(free_port())
    return env


def to_flwr_config(values: Mapping[str, object]) -> str:
    """{'strategy': 'fedavg', 'lr': 0.1} -> "strategy='fedavg' lr=0.1" (TOML values)."""
    def toml(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return "'" + value.replace("'", "") + "'"
        return repr(value)
    return " ".join(f"{key}={toml(value)}" for key, value in values.items())


def local_superlink_pids(flwr_home: Path) -> list[int]:
    """PIDs of managed local SuperLinks whose log file lies in this FLWR_HOME."""
    marker = str(Path(flwr_home) / "local-superlink" / "superlink.log")
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if any(a.endswith("flower-superlink") for a in args[:2]) and marker in args:
            pids.append(int(proc.name))
    return pids


def stop_local_superlink(flwr_home: Path, timeout: float = 15.0) -> list[int]:
    """Stop this FLWR_HOME's managed SuperLink and every process below it, by PID.

    Below it are SuperExec, the ServerApp / simulation processes and Ray's workers; some
    run in process groups of their own and outlive the SuperLink if it dies first, so the
    whole tree is collected before anything is signalled.
    """
    roots = local_superlink_pids(flwr_home)
    stop_pids([pid for root in roots for pid in [root, *descendants(root)]], timeout)
    return roots


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


def send_signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def flwr_run_command(run_config: Mapping[str, object] | None = None,
                     federation_config: Mapping[str, object] | None = None,
                     app_dir: Path = PROJECT_ROOT, stream: bool = True) -> list[str]:
    """The ``flwr run`` argv for these overrides."""
    cmd = [str(Path(sys.executable).parent / "flwr"), "run", str(app_dir)]
    if run_config:
        cmd += ["--run-config", to_flwr_config(run_config)]
    if federation_config:
        cmd += ["--federation-config", " ".join(f"{k}={v}" for k, v in federation_config.items())]
    if stream:
        cmd.append("--stream")
    return cmd


@dataclass
class AppRun:
    """Outcome of one ``flwr run``: exit code (non-zero unless finished:completed)."""

    returncode: int
    run_id: int | None
    status: str
    output: str


def run_app(run_config: Mapping[str, object] | None = None,
            federation_config: Mapping[str, object] | None = None,
            flwr_home: Path | None = None, timeout: float | None = None,
            isolate_ports: bool = False, capture: bool = False,
            on_line: Callable[[str], None] | None = None, app_dir: Path = PROJECT_ROOT,
            ray_address: str | None = None) -> AppRun:
    """``flwr run . --stream`` with a private FLWR_HOME; stops the SuperLink it started.

    Output is echoed line by line (unless ``capture``) and kept. ``flwr run`` exits 0
    even when the ServerApp fails, so the run's final status is read with
    ``flwr ls --run-id ID --format json``.
    """
    flwr_home = Path(flwr_home or PROJECT_ROOT / ".flwr").resolve()
    flwr_home.mkdir(parents=True, exist_ok=True)
    env = flwr_env(flwr_home, isolate_ports=isolate_ports, ray_address=ray_address)
    cmd = flwr_run_command(run_config, federation_config, app_dir=Path(app_dir))
    if not capture:
        print("$ " + shlex.join(cmd), flush=True)
    already_running = set(local_superlink_pids(flwr_home))
    lines: list[str] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        with subprocess.Popen(cmd, env=env, cwd=PROJECT_ROOT, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, bufsize=1) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if not capture:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                if on_line is not None:
                    on_line(line)
                if deadline is not None and time.monotonic() > deadline:
                    proc.kill()
                    lines.append(f"[launcher] flwr run exceeded {timeout} s and was stopped\n")
                    break
            proc.wait()
        output = "".join(lines)
        match = re.search(r"Successfully started run (\d+)", output)
        run_id = int(match.group(1)) if match else None
        status = run_status(env, run_id) if run_id is not None else "not-started"
    finally:
        if not already_running:
            stop_local_superlink(flwr_home)
    return AppRun(0 if status == "finished:completed" else 1, run_id, status, output)


def run_status(env: Mapping[str, str], run_id: int, wait: float = 30.0) -> str:
    """'finished:completed', 'finished:failed', ... of a run (polls until finished)."""
    deadline = time.monotonic() + wait
    status = "unknown"
    while time.monotonic() < deadline:
        proc = subprocess.run([str(Path(sys.executable).parent / "flwr"), "ls", "--run-id", str(run_id),
                               "--format", "json"], env=dict(env), cwd=PROJECT_ROOT, text=True,
                              capture_output=True, timeout=60, check=False)
        try:
            runs = json.loads(proc.stdout).get("runs", [])
            status = runs[0]["status"] if runs else "unknown"
        except (json.JSONDecodeError, KeyError, IndexError):
            status = "unknown"
        if status.startswith("finished"):
            return status
        time.sleep(1)
    return status

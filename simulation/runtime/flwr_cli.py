"""Drive the ``flwr`` CLI: an offline environment, the ``flwr run`` argv, streaming its
output, and the run's final status (``flwr ls``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .federation import checked_federation
from .overrides import to_flwr_config
from .processes import free_port
from .stream_filter import StreamFilter

PROJECT_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OPENBLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"
FLWR_COMMAND = "simulation.runtime.flwr_command"  # `python -m` this: Flower's `flwr`, patched


# Flower's variables for the ports of the local SuperLink that `flwr run` starts or uses
HTTP_PORT_ENV = "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"
CONTROL_PORT_ENV = "FLWR_LOCAL_CONTROL_API_PORT"
DEFAULT_HTTP_PORT = "39091"  # Flower 1.41's default (flwr/cli/constant.py)


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
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    # Without an explicit RAY_ADDRESS, ray.init() attaches to any Ray cluster that
    # `ray start` left running on this machine; a simulation should start its own
    # unless the user points it at a cluster (docs/simulation.md: "Running on a Ray cluster").
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    env.setdefault("RAY_ADDRESS", "local")
    # The simulation engine starts Ray (which forks with a preexec_fn) while the ServerApp's
    # thread loads its data; a fork during a multi-threaded OpenBLAS call leaves numpy
    # spinning forever in that thread (OpenBLAS's fork handler stops its workers). One
    # OpenBLAS thread has no workers to lose; torch's own threads are unaffected.
    env.setdefault(OPENBLAS_THREADS_ENV, "1")
    if isolate_ports:
        env[HTTP_PORT_ENV] = str(free_port())
        env[CONTROL_PORT_ENV] = str(free_port())
    return env


def flwr_run_command(run_config: Mapping[str, object] | None = None,
                     federation_config: Mapping[str, object] | None = None,
                     app_dir: Path = PROJECT_ROOT, stream: bool = True,
                     connection: str | None = None) -> list[str]:
    """The ``flwr run APP [CONNECTION]`` argv for these overrides (the federation's values
    checked and typed as Flower takes them: :mod:`.federation`), through
    :mod:`.flwr_command` (Flower's CLI, the FAB built without walking the venv)."""
    cmd = [str(BIN / "python"), "-m", FLWR_COMMAND, "run", str(app_dir)]
    if connection:
        cmd.append(connection)
    if run_config:
        cmd += ["--run-config", to_flwr_config(run_config)]
    if federation_config:
        cmd += ["--federation-config",
                " ".join(f"{k}={v}" for k, v in checked_federation(federation_config).items())]
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


def stream_command(cmd: Sequence[str], env: Mapping[str, str], cwd: Path,
                   timeout: float | None = None, capture: bool = False,
                   on_line: Callable[[str], None] | None = None,
                   timeout_note: str = "") -> str:
    """Run ``cmd``, echo (unless ``capture``) and keep its output line by line; kill it
    after ``timeout`` s (and on Ctrl-C). Returns the whole output."""
    if not capture:
        print("$ " + shlex.join(cmd), flush=True)
    lines: list[str] = []
    proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)

    shown = StreamFilter(colour=sys.stdout.isatty())

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if not capture and (text := shown(line)) is not None:
                sys.stdout.write(text)
                sys.stdout.flush()
            if on_line is not None:
                on_line(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        head = cmd.index(FLWR_COMMAND) + 1 if FLWR_COMMAND in cmd else 1
        what = " ".join(["flwr" if head > 1 else Path(cmd[0]).name, *cmd[head:head + 1]])
        note = f"[runtime] {what} exceeded {timeout} s and was stopped"
        lines.append(f"{note}{'; ' + timeout_note if timeout_note else ''}\n")
        if not capture:
            print(lines[-1], end="", flush=True)
    finally:  # never leave the command behind or block on its pipe
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(timeout=10)
    return "".join(lines)


def run_id_of(output: str) -> int | None:
    """The run id ``flwr run`` printed ('Successfully started run N'), if any."""
    match = re.search(r"Successfully started run (\d+)", output)
    return int(match.group(1)) if match else None


def run_status(env: Mapping[str, str], run_id: int, wait: float = 30.0) -> str:
    """'finished:completed', 'finished:failed', ... of a run on the env's default
    connection (polls ``flwr ls --run-id ID --format json`` until finished)."""
    deadline = time.monotonic() + wait
    status = "unknown"
    while time.monotonic() < deadline:
        proc = subprocess.run(
            [str(BIN / "flwr"), "ls", "--run-id", str(run_id), "--format", "json"],
            env=dict(env),
            cwd=PROJECT_ROOT,
            text=True,
            capture_output=True,
            timeout=60,
            check=False,
        )
        try:
            runs = json.loads(proc.stdout).get("runs", [])
            status = runs[0]["status"] if runs else "unknown"
        except (json.JSONDecodeError, KeyError, IndexError):
            status = "unknown"
        if status.startswith("finished"):
            return status
        time.sleep(1)
    return status


def stop_run(env: Mapping[str, str], run_id: int | None, wait: float = 30.0) -> str:
    """``flwr stop RUN_ID`` on the env's connection, then until the run is finished (at
    most ``wait`` s); its status ('not-started' without a run id)."""
    if run_id is None:
        return "not-started"
    subprocess.run([str(BIN / "flwr"), "stop", str(run_id)], env=dict(env), cwd=PROJECT_ROOT,
                   text=True, capture_output=True, timeout=60, check=False)
    return run_status(env, run_id, wait)


def submit_run(
    cmd: Sequence[str],
    env: Mapping[str, str],
    cwd: Path = PROJECT_ROOT,
    timeout: float | None = None,
    capture: bool = False,
    on_line: Callable[[str], None] | None = None,
    timeout_note: str = "",
    stop_on_interrupt: Callable[[], bool] | None = None,
) -> AppRun:
    """``flwr run ... --stream``, then its final status: ``flwr run`` exits 0 even when the
    ServerApp fails, so the outcome is read with ``flwr ls``. Ctrl-C (or SIGTERM's
    SystemExit) while it streams stops this launch's own run on the SuperLink
    (:func:`stop_run`) before it goes on, when ``stop_on_interrupt()`` says the SuperLink
    serves other launches and outlives this one (the run would train on under it; a
    SuperLink this launch stops takes its runs with it)."""
    seen: list[str] = []

    def watch(line: str) -> None:
        seen.append(line)
        if on_line is not None:
            on_line(line)

    try:
        output = stream_command(cmd, env, cwd, timeout, capture, watch, timeout_note)
    except (KeyboardInterrupt, SystemExit):
        if stop_on_interrupt is not None and stop_on_interrupt():
            stop_run(env, run_id_of("".join(seen)))
        raise
    run_id = run_id_of(output)
    status = run_status(env, run_id) if run_id is not None else "not-started"
    return AppRun(0 if status == "finished:completed" else 1, run_id, status, output)

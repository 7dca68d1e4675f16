"""``flwr run . <connection> --stream`` against a running SuperLink, then its final status."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from simulation.launcher import PROJECT_ROOT, AppRun, flwr_run_command, run_status


def run_on_connection(connection: str, env: Mapping[str, str], run_config: Mapping[str, object] | None = None,
                      timeout: float = 600.0, capture: bool = False, app_dir: Path = PROJECT_ROOT) -> AppRun:
    """Submit the app, stream its log, and read ``finished:*`` with ``flwr ls --format json``.

    ``env`` must carry the FLWR_HOME whose config.toml has ``connection`` as its default
    (``deploy.connection.write_connection`` does that), because the status poll
    (``simulation.launcher.run_status``) uses the default connection. ``flwr run`` is
    killed after ``timeout`` seconds; the result is then not ``finished:completed``.
    """
    cmd = flwr_run_command(run_config, app_dir=app_dir)
    cmd.insert(3, connection)  # flwr run APP CONNECTION ...
    if not capture:
        print("$ " + shlex.join(cmd), flush=True)
    lines: list[str] = []
    proc = subprocess.Popen(cmd, env=dict(env), cwd=app_dir, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, bufsize=1)
    reader = threading.Thread(target=_pump, args=(proc, lines, capture), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        note = f"[deploy] flwr run exceeded {timeout} s and was stopped; give it more time (--timeout)\n"
        lines.append(note)
        if not capture:
            print(note, end="", flush=True)
    finally:  # also on Ctrl-C: never leave flwr run behind or block on its pipe
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(timeout=10)
    output = "".join(lines)
    match = re.search(r"Successfully started run (\d+)", output)
    run_id = int(match.group(1)) if match else None
    status = run_status(env, run_id) if run_id is not None else "not-started"
    return AppRun(0 if status == "finished:completed" else 1, run_id, status, output)


def _pump(proc: subprocess.Popen, lines: list[str], capture: bool) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if not capture:
            sys.stdout.write(line)
            sys.stdout.flush()

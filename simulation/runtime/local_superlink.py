"""``flwr run .`` on a managed local SuperLink (simulation runtime), and its clean-up.

``flwr run .`` starts a background "managed local SuperLink" that outlives the command.
Every launch gets an explicit ``FLWR_HOME`` (by default the project-local ``.flwr/``,
never the user's ``~/.flwr``), runs offline, and afterwards the SuperLink this launch
started is stopped by PID: the process whose command line carries this FLWR_HOME's log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from .flwr_cli import PROJECT_ROOT, AppRun, flwr_env, flwr_run_command, submit_run
from .processes import process_tree, stop_pids


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
    """Stop this FLWR_HOME's managed SuperLink and every process below it (SuperExec,
    ServerApp / simulation processes, Ray's workers), by PID; returns the SuperLink PIDs."""
    roots = local_superlink_pids(flwr_home)
    stop_pids(process_tree(roots), timeout)
    return roots


def run_app(run_config: Mapping[str, object] | None = None,
            federation_config: Mapping[str, object] | None = None,
            flwr_home: Path | None = None, timeout: float | None = None,
            isolate_ports: bool = False, capture: bool = False,
            on_line: Callable[[str], None] | None = None, app_dir: Path = PROJECT_ROOT,
            ray_address: str | None = None) -> AppRun:
    """``flwr run APP --stream`` with a private FLWR_HOME; stops the SuperLink it started.

    Output is echoed line by line (unless ``capture``) and kept in the result.
    """
    flwr_home = Path(flwr_home or PROJECT_ROOT / ".flwr").resolve()
    flwr_home.mkdir(parents=True, exist_ok=True)
    env = flwr_env(flwr_home, isolate_ports=isolate_ports, ray_address=ray_address)
    cmd = flwr_run_command(run_config, federation_config, app_dir=Path(app_dir))
    already_running = set(local_superlink_pids(flwr_home))
    try:
        return submit_run(cmd, env, PROJECT_ROOT, timeout, capture, on_line)
    finally:
        if not already_running:
            stop_local_superlink(flwr_home)

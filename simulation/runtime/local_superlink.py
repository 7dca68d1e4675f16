"""``flwr run .`` on a managed local SuperLink (simulation runtime), and its clean-up.

``flwr run .`` starts a background "managed local SuperLink" that outlives the command.
Every launch gets an explicit ``FLWR_HOME`` (by default the project-local ``.flwr/``,
never the user's ``~/.flwr``), runs offline, and afterwards the SuperLink this launch
started is stopped by PID: the process whose command line carries this FLWR_HOME's log.
That SuperLink keeps its state in ``FLWR_HOME/local-superlink/state.db``; a run still
unfinished there when its launch was stopped would start again beside the next launch's
run, so the next launch marks such runs stopped first (:func:`stop_stale_runs`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from .flwr_cli import PROJECT_ROOT, AppRun, flwr_env, flwr_run_command, submit_run
from .processes import process_tree, stop_pids


def local_superlink_dir(flwr_home: Path) -> Path:
    """Where ``flwr`` keeps this FLWR_HOME's managed SuperLink: its log and state.db."""
    return Path(flwr_home) / "local-superlink"


def local_superlink_pids(flwr_home: Path) -> list[int]:
    """PIDs of managed local SuperLinks whose log file lies in this FLWR_HOME."""
    marker = str(local_superlink_dir(flwr_home) / "superlink.log")
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


def superlink_state(flwr_home: Path):
    """Flower's own state classes (its SQL LinkState) on this FLWR_HOME's managed
    SuperLink's state.db, as the SuperLink opens it."""
    from flwr.server.superlink.linkstate import LinkStateFactory  # noqa: PLC0415
    from flwr.supercore.object_store import ObjectStoreFactory  # noqa: PLC0415
    from flwr.superlink.federation import NoOpFederationManager  # noqa: PLC0415

    return LinkStateFactory(str(local_superlink_dir(flwr_home) / "state.db"),
                            NoOpFederationManager(simulation=True), ObjectStoreFactory()).state()


def stop_stale_runs(flwr_home: Path) -> list[int]:
    """Mark stopped, in this FLWR_HOME's SuperLink state, every run left pending, starting or
    running by a launch that was stopped (its SuperLink with it); returns their run IDs.

    Call it only while no SuperLink of this FLWR_HOME runs. Flower's SuperLink would
    otherwise start a run left pending as soon as it comes up again, in parallel with the
    new one. Uses Flower's own state classes on the same database file."""
    if not (local_superlink_dir(flwr_home) / "state.db").exists():
        return []
    from flwr.common.constant import Status, SubStatus  # noqa: PLC0415 - only when needed

    state = superlink_state(flwr_home)
    stale = state.get_tasks(statuses=[Status.PENDING, Status.STARTING, Status.RUNNING])
    for task in stale:
        state.finish_task(task.task_id, SubStatus.STOPPED,
                          "left unfinished by a launch that was stopped; stopped before the "
                          "next launch so that it does not start again")
    return sorted({task.run_id for task in stale})


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
    if not already_running:
        try:
            stale = stop_stale_runs(flwr_home)
        except Exception as err:  # noqa: BLE001 - the run itself can still go ahead
            stale = []
            print(f"warning: could not read {local_superlink_dir(flwr_home) / 'state.db'} "
                  f"({err!r}); a run an earlier, stopped launch left there may start again "
                  f"beside this one (delete that file and its -wal/-shm if none of its runs "
                  f"matters)", file=sys.stderr, flush=True)
        for run_id in stale:
            print(f"run {run_id} in {flwr_home} was left unfinished by an earlier launch that "
                  f"was stopped; marked stopped so that it does not start again beside this one",
                  file=sys.stderr, flush=True)
    try:
        return submit_run(cmd, env, PROJECT_ROOT, timeout, capture, on_line)
    finally:
        if not already_running:
            stop_local_superlink(flwr_home)

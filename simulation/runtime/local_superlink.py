"""``flwr run .`` on a managed local SuperLink (simulation runtime), and its clean-up.

``flwr run .`` starts a background "managed local SuperLink" that outlives the command.
Every launch gets an explicit ``FLWR_HOME`` (by default the project-local ``.flwr/``,
never the user's ``~/.flwr``), runs offline, and once the last launch on that FLWR_HOME
has finished, the SuperLink is stopped by PID: the process whose command line carries
this FLWR_HOME's log (:func:`superlink_use`: concurrent launches share it).
That SuperLink keeps its state in ``FLWR_HOME/local-superlink/state.db``; a run still
unfinished there when its launch was stopped would start again beside the next launch's
run, so the next launch marks such runs stopped first (:func:`stop_stale_runs`).
``flwr run`` uses whatever SuperLink answers on the local port, whichever FLWR_HOME and
Python environment started it; a launch refuses another one's
(:func:`refuse_foreign_superlink`). ``flwr run`` gives the SuperLink it starts 15 s, which a
loaded machine can miss ("Failed to start local SuperLink within 15s"); a launch therefore
starts it itself, with Flower's own command line, and waits for it as long as it takes
(:func:`start_local_superlink`).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from .federation import refuse_unfittable
from .flwr_cli import (
    BIN,
    CONTROL_PORT_ENV,
    DEFAULT_HTTP_PORT,
    HTTP_PORT_ENV,
    PROJECT_ROOT,
    AppRun,
    flwr_env,
    flwr_run_command,
    submit_run,
)
from .processes import is_alive, process_tree, stop_pids

try:
    import fcntl
except ImportError:  # not POSIX: launches on one FLWR_HOME are not serialised
    fcntl = None

USERS_DIR = "superlink-users"  # one empty file per launch using the managed SuperLink
USERS_LOCK = "superlink-users.lock"
STARTED_BY_US = "superlink-started-by-fedhetero"  # the last launch to leave stops it
DEFAULT_CONTROL_PORT = "39093"  # Flower 1.41's default (flwr/cli/constant.py)
SUPERLINK_START_TIMEOUT = 180.0  # seconds; Flower's CLI waits 15


class ForeignSuperLinkError(RuntimeError):
    """Another FLWR_HOME's (or a hand-started) SuperLink answers on the local port."""


def local_superlink_dir(flwr_home: Path) -> Path:
    """Where ``flwr`` keeps this FLWR_HOME's managed SuperLink: its log and state.db."""
    return Path(flwr_home) / "local-superlink"


def _superlink_processes() -> Iterator[tuple[int, list[str]]]:
    """(PID, argv) of every ``flower-superlink`` process this user can see."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if any(a.endswith("flower-superlink") for a in args[:2]):
            yield int(proc.name), args


def local_superlink_pids(flwr_home: Path) -> list[int]:
    """PIDs of managed local SuperLinks whose log file lies in this FLWR_HOME."""
    marker = str(local_superlink_dir(flwr_home) / "superlink.log")
    return [pid for pid, args in _superlink_processes() if marker in args]


def running_superlink_env(flwr_home: Path, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the ports of this FLWR_HOME's running SuperLink, if one runs: a launch
    beside (or after) another on the same FLWR_HOME uses that SuperLink, not a second one
    on its own ports over the same state database."""
    env = dict(env)
    for pid, args in _superlink_processes():
        if str(local_superlink_dir(flwr_home) / "superlink.log") not in args:
            continue
        option = dict(zip(args, args[1:]))
        if "--port" in option:
            env[HTTP_PORT_ENV] = option["--port"]
        if "--control-api-address" in option:
            env[CONTROL_PORT_ENV] = option["--control-api-address"].rsplit(":", 1)[1]
        break
    return env


def superlink_answers(port: int) -> bool:
    """True when a Flower SuperLink answers ``GET /health`` on 127.0.0.1:``port`` (the probe
    ``flwr run`` makes before it would start one; no proxy in between)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def superlinks_on_port(port: int) -> list[tuple[int, str]]:
    """(PID, log file or '') of each ``flower-superlink`` process listening on ``port``."""
    options = ((pid, dict(zip(args, args[1:]))) for pid, args in _superlink_processes())
    return [(pid, option.get("--log-file", "")) for pid, option in options
            if option.get("--port") == str(port)]


def refuse_foreign_superlink(flwr_home: Path, env: Mapping[str, str]) -> None:
    """:class:`ForeignSuperLinkError` when a SuperLink that is not this FLWR_HOME's answers
    on the local port ``flwr run`` will use: it would run the app there, under that
    SuperLink's FLWR_HOME and in its Python environment (another project's flwr, without
    this one's packages). Flower's managed SuperLink outlives the ``flwr run .`` of any
    project, so one left by another project is the usual case."""
    if local_superlink_pids(flwr_home):
        return  # ours (a launch beside this one started it): shared
    port = int(env.get(HTTP_PORT_ENV, DEFAULT_HTTP_PORT))
    if not superlink_answers(port):
        return
    holders = superlinks_on_port(port)
    who = "; ".join(f"flower-superlink PID {pid}" + (f", its log {log}" if log else "")
                    for pid, log in holders) or "a process this user cannot see"
    other_ports = (f"give this launch other ports with Flower's variables, e.g. "
                   f"{HTTP_PORT_ENV}={port + 100} {CONTROL_PORT_ENV}={port + 102}")
    fix = f"Stop it (kill {holders[0][0]}), or {other_ports}" if holders else \
        other_ports[0].upper() + other_ports[1:]
    raise ForeignSuperLinkError(
        f"a SuperLink that is not {flwr_home}'s answers on 127.0.0.1:{port} ({who}): flwr "
        f"run would run this app on it, under its FLWR_HOME and in its Python environment. "
        f"{fix}")


def superlink_ray_address(flwr_home: Path) -> str | None:
    """``RAY_ADDRESS`` in the environment of this FLWR_HOME's running SuperLink: the Ray its
    simulation runs use ('' when it has none: Ray then joins any local cluster; None when no
    SuperLink runs or its environment cannot be read)."""
    for pid in local_superlink_pids(flwr_home):
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            return None
        found = [item[len(b"RAY_ADDRESS="):] for item in environ
                 if item.startswith(b"RAY_ADDRESS=")]
        return found[0].decode(errors="replace") if found else ""
    return None


def describe_ray(address: str) -> str:
    """Which Ray a RAY_ADDRESS means, in words."""
    if address == "local":
        return "a private Ray that the simulation engine starts for the run"
    if not address:
        return "any Ray cluster running on this machine (RAY_ADDRESS unset)"
    return f"the Ray cluster at {address}"


def refuse_other_ray(flwr_home: Path, env: Mapping[str, str]) -> None:
    """:class:`ForeignSuperLinkError` when this FLWR_HOME's SuperLink already runs (another
    launch started it) with another Ray than this launch asks for: its runs would use that
    Ray, and ``--ray-address`` would be dropped without a word."""
    running = superlink_ray_address(flwr_home)
    wanted = env.get("RAY_ADDRESS", "")
    if running is None or running == wanted:
        return
    asked = (f"--ray-address {wanted}" if wanted not in ("", "local")
             else "this launch (no --ray-address)")
    raise ForeignSuperLinkError(
        f"{asked} wants {describe_ray(wanted)}, but {flwr_home}'s SuperLink (PID "
        f"{local_superlink_pids(flwr_home)[0]}), started by another launch, runs every run "
        f"on {describe_ray(running)}. Give this launch its own --flwr-home, or start it "
        "once that launch has ended")


def start_local_superlink(flwr_home: Path, env: Mapping[str, str], cwd: Path,
                          timeout: float = SUPERLINK_START_TIMEOUT) -> None:
    """Start this FLWR_HOME's managed local SuperLink as ``flwr run`` would (the command line
    of Flower's ``flwr.cli.local_superlink._start_local_superlink``: simulation, subprocess
    isolation, the ports of ``env``, its log and state database in FLWR_HOME, the working
    directory ``cwd`` of the ``flwr run`` it serves: the ServerApp's imports resolve there),
    detached, and wait until it answers ``/health``, up to ``timeout`` seconds (Flower's CLI: 15 s, and
    then it kills it). ``flwr run`` then finds it running and uses it."""
    port = env.get(HTTP_PORT_ENV, DEFAULT_HTTP_PORT)
    folder = local_superlink_dir(flwr_home)
    folder.mkdir(parents=True, exist_ok=True)
    command = [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation",
               "subprocess", "--control-api-address",
               f"127.0.0.1:{env.get(CONTROL_PORT_ENV, DEFAULT_CONTROL_PORT)}",
               "--host", "127.0.0.1", "--port", port,
               "--log-file", str(folder / "superlink.log"),
               "--log-rotation-interval-hours", "24", "--log-rotation-backup-count", "7",
               "--database", str(folder / "state.db")]
    process = subprocess.Popen(command, env=dict(env), cwd=cwd, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not superlink_answers(int(port)):
        if process.poll() is not None:
            raise RuntimeError(f"the local SuperLink exited with code {process.returncode} "
                               f"before it answered on 127.0.0.1:{port}; see "
                               f"{folder / 'superlink.log'}")
        if time.monotonic() > deadline:
            stop_pids(process_tree([process.pid]))
            raise TimeoutError(f"the local SuperLink did not answer on 127.0.0.1:{port} "
                               f"within {timeout:.0f} s; see {folder / 'superlink.log'}")
        time.sleep(0.2)


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
    """``flwr run APP --stream`` with a private FLWR_HOME; the last launch on it stops the
    SuperLink (:func:`superlink_use`).

    Output is echoed line by line (unless ``capture``) and kept in the result. Before
    anything starts, a federation no ClientApp fits here raises
    :class:`FederationConfigError`, another FLWR_HOME's SuperLink on the local port
    :class:`ForeignSuperLinkError`.
    """
    refuse_unfittable(federation_config or {}, ray_address)
    flwr_home = Path(flwr_home or PROJECT_ROOT / ".flwr").resolve()
    flwr_home.mkdir(parents=True, exist_ok=True)
    env = flwr_env(flwr_home, isolate_ports=isolate_ports, ray_address=ray_address)
    cmd = flwr_run_command(run_config, federation_config, app_dir=Path(app_dir))
    refuse_foreign_superlink(flwr_home, env)
    refuse_other_ray(flwr_home, env)
    if not capture:
        print(f"[runtime] Ray: {describe_ray(env.get('RAY_ADDRESS', ''))}", flush=True)
    with superlink_use(flwr_home, env, PROJECT_ROOT):
        env = running_superlink_env(flwr_home, env)
        return submit_run(cmd, env, PROJECT_ROOT, timeout, capture, on_line,
                          stop_on_interrupt=lambda: shared_with_others(flwr_home))


def shared_with_others(flwr_home: Path) -> bool:
    """True while another live launch uses this FLWR_HOME's SuperLink: then a Ctrl-C here
    stops this launch's run on it (``flwr stop``), not the SuperLink and its processes."""
    users = Path(flwr_home) / USERS_DIR
    return users.is_dir() and any(mark.name.split("-")[0] != str(os.getpid())
                                  for mark in _live_users(users))


def _live_users(users: Path) -> list[Path]:
    """The launches marked in ``users`` whose process still runs (a killed one's mark is
    left behind and ignored)."""
    return [mark for mark in users.iterdir()
            if mark.name.split("-")[0].isdigit() and is_alive(int(mark.name.split("-")[0]))]


@contextlib.contextmanager
def _users_locked(flwr_home: Path) -> Iterator[None]:
    """One launch at a time joins or leaves this FLWR_HOME's managed SuperLink."""
    with open(Path(flwr_home) / USERS_LOCK, "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


@contextlib.contextmanager
def superlink_use(flwr_home: Path, env: Mapping[str, str] | None = None,
                  cwd: Path = PROJECT_ROOT) -> Iterator[None]:
    """A launch's use of this FLWR_HOME's managed SuperLink, which ``flwr run`` starts when
    none runs. Launches on one FLWR_HOME (two terminals in the project) share it: each
    marks itself in ``FLWR_HOME/superlink-users``; the first (no SuperLink, no other
    launch) marks the runs an earlier, stopped launch left unfinished as stopped
    (:func:`stop_stale_runs`) and, given the launch's ``env``, starts the SuperLink in ``cwd``
    (:func:`start_local_superlink`); the last to leave stops the SuperLink, by PID, where one of
    our launches started it (a SuperLink that was running before any did is left alone).
    Before, the first launch to finish stopped it under the others' runs."""
    flwr_home = Path(flwr_home)
    users, started = flwr_home / USERS_DIR, flwr_home / STARTED_BY_US
    mark = users / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with _users_locked(flwr_home):
        users.mkdir(exist_ok=True)
        alone = not _live_users(users)
        if not local_superlink_pids(flwr_home):
            started.touch()  # we (or the flwr run below, or a launch beside it) start it
            if alone:
                _stop_stale_runs_and_say(flwr_home)
            if env is not None:
                start_local_superlink(flwr_home, env, cwd)
        mark.touch()
    try:
        yield
    finally:
        with _users_locked(flwr_home):
            mark.unlink(missing_ok=True)
            if not _live_users(users) and started.exists():
                stop_local_superlink(flwr_home)
                started.unlink(missing_ok=True)


def _stop_stale_runs_and_say(flwr_home: Path) -> None:
    """:func:`stop_stale_runs`, with a line per run it stopped (or why it could not)."""
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

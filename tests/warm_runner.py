"""A warm interpreter for the tests' fresh-interpreter script runs (a user project run in
process, :func:`tests.user_project.run_inprocess`): it has imported numpy, torch (with
``torch._dynamo``, which torch's optimisers import when the first one is built) and flwr's
app modules, and forks a child per run. A fresh ``python script.py`` spent about 4 s of CPU
on those imports before the script's first line on this 2-core machine; a fork costs
milliseconds. The child is what the fresh interpreter was: the script as ``__main__``, its
``sys.argv``, its folder first on ``sys.path`` and then ``PYTHONPATH``, its working
directory, its environment, its own stdout and stderr; nothing of fedhetero is imported (but
:func:`deploy.warm_superexec.fork_child`) before the script imports it.

No tensor operation runs in this process: a child forked after torch's thread pool started
would inherit a broken one (as :mod:`deploy.warm_superexec`'s). One server per pytest
process, started on first use (``python -m tests.warm_runner``); requests are one JSON line
each on its stdin, answered by the child's pid and then its exit code; it exits when its
stdin closes.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PRELOAD = ("numpy", "torch", "torch._dynamo", "flwr.app", "flwr.serverapp", "flwr.clientapp")
_server: subprocess.Popen | None = None
_lock = threading.Lock()


def _child(request: dict) -> int:
    """In the forked child: run the script as a fresh interpreter would; its exit code."""
    os.setsid()  # its own process group: a kill on timeout takes what it started too
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    null = os.open(os.devnull, os.O_RDONLY)  # the script's stdin: not the request pipe
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    script = request["script"]
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [str(Path(script).parent), *extra, *sys.path[1:]]
    sys.argv = [script, *request["argv"]]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, exit 1
        import traceback  # noqa: PLC0415

        traceback.print_exc()
        return 1
    return 0


def serve() -> None:
    """The server's loop (module docstring)."""
    import importlib  # noqa: PLC0415

    from deploy.warm_superexec import fork_child  # noqa: PLC0415 - flwr's SuperExec, not torch

    for name in PRELOAD:
        importlib.import_module(name)
    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = fork_child(lambda request=request: _child(request))
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        replies.write(json.dumps({"code": code}) + "\n")
        replies.flush()


def _server_process() -> subprocess.Popen:
    global _server  # noqa: PLW0603 - one server per pytest process
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-m", "tests.warm_runner"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   cwd=Path(__file__).resolve().parent.parent)
        atexit.register(_server.kill)
    return _server


def run_script(script: Path, argv: list[str], cwd: Path, env: dict[str, str],
               timeout: float) -> subprocess.CompletedProcess:
    """``python script *argv`` in ``cwd`` with ``env``, forked from the warm server; its
    exit code, stdout and stderr (as ``subprocess.run(..., capture_output=True)``). Raises
    ``subprocess.TimeoutExpired`` (after killing the run) past ``timeout`` seconds."""
    with _lock, tempfile.TemporaryDirectory(prefix="warm-run-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        server = _server_process()
        server.stdin.write(json.dumps({"script": str(script), "argv": list(argv),
                                       "cwd": str(cwd), "env": dict(env),
                                       "stdout": str(out), "stderr": str(err)}) + "\n")
        server.stdin.flush()
        started = server.stdout.readline()
        if not started:
            raise RuntimeError("tests.warm_runner: the server exited; see the test's stderr")
        pid = json.loads(started)["pid"]
        fired = threading.Event()

        def kill() -> None:
            fired.set()
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # it had just ended
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            line = server.stdout.readline()
        finally:
            timer.cancel()
        if not line:
            raise RuntimeError("tests.warm_runner: the server exited; see the test's stderr")
        code = json.loads(line)["code"]
        stdout = out.read_text(errors="replace") if out.exists() else ""
        stderr = err.read_text(errors="replace") if err.exists() else ""
        if fired.is_set():
            raise subprocess.TimeoutExpired([sys.executable, str(script), *argv], timeout,
                                            stdout, stderr)
        return subprocess.CompletedProcess([sys.executable, str(script), *argv], code,
                                           stdout, stderr)


if __name__ == "__main__":
    serve()

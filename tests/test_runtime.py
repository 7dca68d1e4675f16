"""simulation.runtime without Flower: overrides, streaming with a timeout, process trees."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from simulation.runtime import (
    flwr_run_command,
    is_alive,
    parse_overrides,
    process_tree,
    run_id_of,
    start_process,
    stop_processes,
    stream_command,
    to_flwr_config,
)


def test_overrides_are_typed_and_written_back_as_toml():
    values = parse_overrides(["lr=0.05", "rounds=3", "iid=true", "strategy='fednova'"])
    assert values == {"lr": 0.05, "rounds": 3, "iid": True, "strategy": "fednova"}
    assert to_flwr_config(values) == "lr=0.05 rounds=3 iid=true strategy='fednova'"
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_overrides(["lr"])


def test_flwr_run_command_puts_the_connection_after_the_app():
    cmd = flwr_run_command({"lr": 0.1}, app_dir=Path("/app"), connection="remote")
    assert cmd[:3] == [str(Path(sys.executable).parent / "python"), "-m",
                       "simulation.runtime.flwr_command"]
    assert cmd[3:6] == ["run", "/app", "remote"] and cmd[-1] == "--stream"
    assert "--federation-config" not in cmd


@pytest.mark.usefixtures("processes")
def test_stream_command_keeps_every_line_and_calls_back(tmp_path, capsys):
    seen = []
    code = "print('a'); print('Successfully started run 42')"
    output = stream_command([sys.executable, "-c", code], {}, tmp_path, capture=True,
                            on_line=seen.append)
    assert output == "a\nSuccessfully started run 42\n" and seen == ["a\n", output[2:]]
    assert run_id_of(output) == 42 and capsys.readouterr().out == ""


@pytest.mark.usefixtures("processes")
def test_stream_command_stops_a_command_at_its_timeout(tmp_path):
    code = "import time; print('up', flush=True); time.sleep(60)"
    started = time.monotonic()
    output = stream_command([sys.executable, "-c", code], {}, tmp_path, timeout=1.5, capture=True,
                            timeout_note="give it more time")
    assert time.monotonic() - started < 30
    assert output.startswith("up\n") and "exceeded 1.5 s" in output
    assert "give it more time" in output


@pytest.mark.usefixtures("processes")
def test_stop_processes_ends_the_whole_tree(tmp_path):
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(60)")
    started = start_process("parent", [sys.executable, "-c", code], {}, tmp_path,
                            tmp_path / "log.txt")
    deadline = time.monotonic() + 20
    while len(process_tree([started.proc.pid])) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    tree = process_tree([started.proc.pid])
    assert len(tree) == 2
    stop_processes([started], timeout=5)
    assert not [pid for pid in tree if is_alive(pid)]


# A thread multiplying with numpy while the main thread forks with a preexec_fn (as Ray's
# start does beside the simulation's ServerApp thread); prints how many products the thread
# finished in the last half second: 0 when OpenBLAS's fork handler left it spinning.
BLAS_DURING_FORKS = """
import subprocess, threading, time
import numpy as np
done = [0]
def multiply():
    a, w = np.ones((3000, 60)), np.ones((60, 10))
    while True:
        a @ w
        done[0] += 1
threading.Thread(target=multiply, daemon=True).start()
for _ in range(200):
    subprocess.run(["true"], preexec_fn=lambda: None, check=True)
before = done[0]
time.sleep(0.5)
print(done[0] - before)
"""


@pytest.mark.usefixtures("processes")
def test_flwr_runs_get_one_openblas_thread_so_a_fork_cannot_hang_numpy(tmp_path):
    import subprocess  # noqa: PLC0415

    from simulation.runtime.flwr_cli import OPENBLAS_THREADS_ENV, flwr_env  # noqa: PLC0415

    env = flwr_env(tmp_path, base={"PATH": "/usr/bin:/bin"})
    assert env[OPENBLAS_THREADS_ENV] == "1"
    assert flwr_env(tmp_path, base={OPENBLAS_THREADS_ENV: "4"})[OPENBLAS_THREADS_ENV] == "4"
    out = subprocess.run([sys.executable, "-c", BLAS_DURING_FORKS], env=env, timeout=120,
                         capture_output=True, text=True, check=True)
    assert int(out.stdout) > 0

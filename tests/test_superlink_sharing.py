"""Launches on one FLWR_HOME share its managed SuperLink: the last to leave stops it
(simulation/runtime/local_superlink.py::superlink_use). Before, the first launch to finish
stopped it under a second one's run (two `fedhetero run` in the project: the second
failed in round 3 with 'Connection to the SuperLink is unavailable')."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from simulation.runtime import is_alive, local_superlink_pids
from simulation.runtime.local_superlink import (STARTED_BY_US, USERS_DIR, local_superlink_dir,
                                                superlink_use)


@pytest.fixture
def fake_superlink(tmp_path):
    """Start processes that local_superlink_pids takes for this FLWR_HOME's SuperLink."""
    started = []
    program = tmp_path / "bin" / "flower-superlink"
    program.parent.mkdir()
    program.write_text("import time\ntime.sleep(600)\n")

    def start(home):
        log = local_superlink_dir(home) / "superlink.log"
        proc = subprocess.Popen([sys.executable, str(program), "--log-file", str(log)])
        started.append(proc)
        deadline = time.monotonic() + 30
        while proc.pid not in local_superlink_pids(home) and time.monotonic() < deadline:
            time.sleep(0.05)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_the_last_launch_to_leave_stops_the_superlink_whichever_finishes_first(
        tmp_path, fake_superlink):
    for first_to_leave in ("a", "b"):
        home = tmp_path / f"home-{first_to_leave}"
        home.mkdir()
        a, b = superlink_use(home), superlink_use(home)
        a.__enter__()
        link = fake_superlink(home)  # what a's flwr run starts
        b.__enter__()  # b's flwr run finds it running
        (a if first_to_leave == "a" else b).__exit__(None, None, None)
        assert link.poll() is None  # the other launch's run still needs it
        (b if first_to_leave == "a" else a).__exit__(None, None, None)
        assert link.wait(timeout=30) is not None
        assert local_superlink_pids(home) == [] and not (home / STARTED_BY_US).exists()
        assert list((home / USERS_DIR).iterdir()) == []


def test_a_superlink_running_before_any_launch_is_left_alone(tmp_path, fake_superlink):
    link = fake_superlink(tmp_path)  # started by someone else's flwr run
    with superlink_use(tmp_path):
        pass
    assert link.poll() is None and is_alive(link.pid)


def test_a_killed_launchs_mark_does_not_keep_the_superlink(tmp_path, fake_superlink):
    users = tmp_path / USERS_DIR
    users.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (users / f"{dead.pid}-deadbeef").touch()  # a launch that was SIGKILLed
    with superlink_use(tmp_path):
        link = fake_superlink(tmp_path)
    assert link.wait(timeout=30) is not None

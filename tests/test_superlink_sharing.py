"""Launches on one FLWR_HOME share its managed SuperLink: the last to leave stops it
(simulation/runtime/local_superlink.py::superlink_use). Before, the first launch to finish
stopped it under a second one's run (two `fedhetero run` in the project: the second
failed in round 3 with 'Connection to the SuperLink is unavailable')."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulation.runtime import is_alive, local_superlink_pids
from simulation.runtime.local_superlink import (
    STARTED_BY_US,
    USERS_DIR,
    ForeignSuperLinkError,
    local_superlink_dir,
    refuse_other_ray,
    superlink_ray_address,
    superlink_use,
)

pytestmark = pytest.mark.usefixtures("processes")


@pytest.fixture
def fake_superlink(tmp_path):
    """Start processes that local_superlink_pids takes for this FLWR_HOME's SuperLink."""
    started = []
    program = tmp_path / "bin" / "flower-superlink"
    program.parent.mkdir()
    program.write_text("import time\ntime.sleep(600)\n")

    def start(home, env=None):
        log = local_superlink_dir(home) / "superlink.log"
        proc = subprocess.Popen([sys.executable, str(program), "--log-file", str(log)], env=env)
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


def test_another_flwr_homes_superlink_on_the_local_port_is_refused_not_used(tmp_path, monkeypatch):
    """`flwr run` takes whatever SuperLink answers on the local port; one that another
    project's `flwr run .` left running would run this app in that project's environment."""
    from simulation.runtime import ForeignSuperLinkError, flwr_env, free_port, run_app, stop_pids
    from simulation.runtime.flwr_cli import CONTROL_PORT_ENV, HTTP_PORT_ENV
    from simulation.runtime.local_superlink import refuse_foreign_superlink, superlink_answers

    other, ours = tmp_path / "other-home", tmp_path / "ours"
    port, control = free_port(), free_port()
    log = local_superlink_dir(other) / "superlink.log"
    log.parent.mkdir(parents=True)
    superlink = subprocess.Popen(
        [str(Path(sys.executable).with_name("flower-superlink")), "--insecure", "--simulation",
         "--isolation", "subprocess", "--control-api-address", f"127.0.0.1:{control}",
         "--host", "127.0.0.1", "--port", str(port), "--log-file", str(log)],
        env=flwr_env(other),  # its FLWR_HOME, and flwr's bin on PATH for its SuperExec
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not superlink_answers(port):
            assert superlink.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        monkeypatch.setenv(HTTP_PORT_ENV, str(port))
        monkeypatch.setenv(CONTROL_PORT_ENV, str(control))
        with pytest.raises(ForeignSuperLinkError) as info:
            run_app({"num-server-rounds": 1}, flwr_home=ours, timeout=60)
        message = str(info.value)
        assert f"answers on 127.0.0.1:{port} (flower-superlink PID {superlink.pid}, its log " \
               f"{log})" in message
        assert f"kill {superlink.pid}" in message and HTTP_PORT_ENV in message
        assert not (ours / USERS_DIR).exists()  # refused before the launch joined anything
        # the SuperLink of the FLWR_HOME it was started for is shared, not refused
        refuse_foreign_superlink(other, flwr_env(other))
    finally:
        stop_pids([superlink.pid])
    assert not superlink_answers(port)


def test_a_ray_address_the_shared_superlink_does_not_use_is_refused_not_dropped(
        tmp_path, fake_superlink):
    """Another launch's SuperLink runs on a private Ray: a launch that asks for a Ray
    cluster would run on the private one without a word (#57); it is refused, naming both."""
    import os  # noqa: PLC0415

    home = tmp_path / "home"
    assert superlink_ray_address(home) is None
    refuse_other_ray(home, {"RAY_ADDRESS": "10.0.0.5:6379"})  # no SuperLink yet: nothing to say
    proc = fake_superlink(home, {**os.environ, "RAY_ADDRESS": "local"})
    assert superlink_ray_address(home) == "local"
    refuse_other_ray(home, {"RAY_ADDRESS": "local"})  # the same Ray: shared
    with pytest.raises(ForeignSuperLinkError) as info:
        refuse_other_ray(home, {"RAY_ADDRESS": "10.0.0.5:6379"})
    assert str(info.value) == (
        f"--ray-address 10.0.0.5:6379 wants the Ray cluster at 10.0.0.5:6379, but {home}'s "
        f"SuperLink (PID {proc.pid}), started by another launch, runs every run on a private "
        "Ray that the simulation engine starts for the run. Give this launch its own "
        "--flwr-home, or start it once that launch has ended")

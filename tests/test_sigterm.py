"""`kill PID` (SIGTERM) of a running `python -m simulation run` stops everything it
started, by PID, as Ctrl-C does (simulation/runtime/processes.py::stop_on_sigterm): a
real `flwr run` on a managed local SuperLink, its ServerApp and Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest

from simulation.runtime import (
    free_port,
    is_alive,
    local_superlink_pids,
    process_tree,
    stop_local_superlink,
)

ROOT = Path(__file__).resolve().parents[1]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout} s")


@pytest.mark.usefixtures("processes")
def test_sigterm_stops_the_superlink_the_serverapp_and_ray(tmp_path):
    home = tmp_path / "flwr-home"
    env = {**os.environ, "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(free_port())}
    log = tmp_path / "driver.log"  # a file, not a pipe nobody reads while it runs
    driver = subprocess.Popen(
        [sys.executable, "-m", "simulation", "run", "--num-supernodes", "2",
         "--flwr-home", str(home), "-c", "num-server-rounds=50", "-c", "dataset='synthetic'",
         "-c", "model='mlp-2nn'", "-c", "local-steps=1", "-c", f"output-dir='{tmp_path / 'runs'}'"],
        cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        def training():  # round 1 logged: Ray and the ClientApp actors are up
            logs = list((tmp_path / "runs").glob("*/rounds.jsonl"))
            return bool(logs) and len(logs[0].read_text().splitlines()) >= 2

        wait_for(training, 240, "round 1 of the run")
        tree = process_tree(local_superlink_pids(home))
        assert len(tree) >= 3  # the SuperLink, the ServerApp's process, Ray and its actors
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=120)
        assert driver.returncode == 128 + signal.SIGTERM, log.read_text()[-3000:]
        wait_for(lambda: not any(is_alive(pid) for pid in tree), 60,
                 "every process of the SuperLink's tree gone")
        assert local_superlink_pids(home) == []
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        stop_local_superlink(home)  # what a failed check left, by PID


def test_within_it_sigterm_is_a_system_exit_and_the_old_handler_comes_back():
    from simulation.runtime import stop_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    try:
        with stop_on_sigterm():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises before this ends
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # a second one waits for the clean-up
                time.sleep(0.2)
                cleaned.append(True)
    except SystemExit as exc:
        assert exc.code == 128 + signal.SIGTERM
    else:
        raise AssertionError("no SystemExit")
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("signum, error", [(signal.SIGTERM, SystemExit),
                                           (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_that_lands_in_a_finaliser_is_not_lost(signum, error):
    """Python drops an exception raised in a weakref callback ("Exception ignored in"): the
    signal comes again where it unwinds, instead of leaving the process deaf to it."""
    from simulation.runtime import interrupt_once, stop_on_sigterm

    class Node:
        pass

    hook, unwound = sys.unraisablehook, []
    with pytest.raises(error):
        with (stop_on_sigterm() if signum == signal.SIGTERM else interrupt_once()):
            try:
                node = Node()
                watcher = weakref.ref(node, lambda _: os.kill(os.getpid(), signum))
                del node  # the callback runs, the signal's exception is raised in it
                for _ in range(100):
                    time.sleep(0.01)  # the signal again, raised here
            finally:
                unwound.append(watcher() is None)
    assert unwound == [True] and sys.unraisablehook is hook

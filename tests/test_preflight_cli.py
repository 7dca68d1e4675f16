"""The commands, end to end: a refusal before anything starts is one message and no
traceback, with no SuperLink started (``python -m simulation run``, ``python -m deploy
run``); Ctrl-C during a real ``python -m simulation run`` stops the SuperLink's whole tree
and prints one line saying how to resume, and ``--resume`` takes that run back."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from simulation.runtime import (
    free_port,
    is_alive,
    local_superlink_pids,
    process_tree,
    stop_local_superlink,
)
from tests.test_sigterm import wait_for

pytestmark = pytest.mark.usefixtures("deployment")

ROOT = Path(__file__).resolve().parents[1]


def test_a_bad_data_dir_stops_simulation_run_before_any_superlink(tmp_path):
    home, missing = tmp_path / "flwr-home", tmp_path / "no-data"
    done = subprocess.run(
        [sys.executable, "-m", "simulation", "run", "--flwr-home", str(home),
         "-c", f"data-dir='{missing}'"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == (
        f"run config check: data-dir='{missing}' does not exist (no such folder); it must be "
        "the folder that holds Fashion-MNIST's four IDX files (train-images-idx3-ubyte, "
        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each also "
        f"as .gz) in {missing} or {missing / 'fashion-mnist'}. Fix: give -c \"data-dir="
        "'/abs/folder'\" of the folder that holds them, or -c \"data-dir=''\" for the default "
        "lookup\n(checked before flwr run started; nothing ran)\n")
    assert done.stdout == ""  # no `$ flwr run ...` line: nothing was started
    assert not home.exists() and local_superlink_pids(home) == []


def test_a_bad_data_dir_stops_deploy_run_before_anything_starts(tmp_path, capsys, monkeypatch):
    import deploy.run as deploy_run  # noqa: PLC0415

    monkeypatch.setattr(deploy_run, "LocalDeployment", lambda *a, **k: 1 / 0)
    parser = argparse.ArgumentParser()
    deploy_run.add_arguments(parser)
    args = parser.parse_args(["--data-dir", str(tmp_path / "no-data"),
                              "--workdir", str(tmp_path / "work")])
    assert deploy_run.run(args) == 2
    err = capsys.readouterr().err
    assert (f"python -m deploy run: error: run config check: --data-dir {tmp_path / 'no-data'} "
            "does not exist (no such folder)") in err
    assert "give --data-dir /abs/folder" in err and "Traceback" not in err
    assert not (tmp_path / "work").exists()


def launch(home: Path, runs: Path, env: dict, out: Path, err: Path) -> subprocess.Popen:
    """``python -m simulation run`` of a long tiny run (checkpoint every round), in its own
    process group as a terminal's foreground job."""
    return subprocess.Popen(
        [sys.executable, "-m", "simulation", "run", "--num-supernodes", "2",
         "--flwr-home", str(home), "-c", "num-server-rounds=100000", "-c", "dataset='synthetic'",
         "-c", "partition='natural'", "-c", "model='mlp-2nn'", "-c", "local-steps=1",
         "-c", "checkpoint-every=1", "-c", f"output-dir='{runs}'"],
        cwd=ROOT, env=env, stdout=out.open("w"), stderr=err.open("w"), start_new_session=True)


def rounds_logged(runs: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in runs.glob("*/rounds.jsonl"))


def test_ctrl_c_stops_everything_and_says_how_to_resume(tmp_path):
    """Two launches share one Flower home (two terminals): Ctrl-C in the second stops its
    own run on the shared SuperLink (it trained on before, #57) and leaves the first's;
    Ctrl-C in the first then stops everything."""
    home, runs, other = tmp_path / "flwr-home", tmp_path / "runs", tmp_path / "other-runs"
    env = {**os.environ, "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(free_port())}
    out, err = tmp_path / "driver.out", tmp_path / "driver.err"
    second_out, second_err = tmp_path / "second.out", tmp_path / "second.err"
    driver = launch(home, runs, env, out, err)
    second = None
    try:
        wait_for(lambda: "Checkpoint of round 1:" in out.read_text(), 240, "round 1's checkpoint")
        tree = process_tree(local_superlink_pids(home))
        assert len(tree) >= 3  # the SuperLink, the ServerApp's process, Ray and its actors
        second = launch(home, other, env, second_out, second_err)
        wait_for(lambda: "Checkpoint of round 1:" in second_out.read_text(), 240,
                 "the second launch's round 1")
        os.killpg(second.pid, signal.SIGINT)
        second.wait(timeout=120)
        assert second.returncode == 130, second_err.read_text()[-3000:]
        assert second_err.read_text().splitlines()[-1].startswith("Stopped by Ctrl-C;")
        server = int(next(other.glob("*/server.pid")).read_text())
        assert not is_alive(server)  # its ServerApp's process ended before the line
        stopped_at, first_at = rounds_logged(other), rounds_logged(runs)
        wait_for(lambda: rounds_logged(runs) >= first_at + 20, 120, "the first run going on")
        assert rounds_logged(other) == stopped_at
        assert local_superlink_pids(home)  # the first launch still uses the SuperLink
        os.killpg(driver.pid, signal.SIGINT)  # Ctrl-C: the whole foreground process group
        driver.wait(timeout=120)
        assert driver.returncode == 130, err.read_text()[-3000:]
        wait_for(lambda: not any(is_alive(pid) for pid in tree), 60,
                 "every process of the SuperLink's tree gone")
        assert local_superlink_pids(home) == []
    finally:
        for process in (driver, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        stop_local_superlink(home)  # what a failed check left, by PID
    lines = err.read_text().splitlines()
    assert "Traceback" not in err.read_text() + out.read_text()
    match = re.fullmatch(r"Stopped by Ctrl-C; the last checkpoint \(round (\d+)\) is in (\S+) "
                         r"\(resume with fedhetero run --resume (\S+)\)", lines[-1])
    assert match, lines[-3:]
    run_dir = Path(match.group(2))
    assert match.group(3) == str(run_dir) and run_dir.parent == runs
    assert (run_dir / "checkpoint.json").is_file()
    resumed = subprocess.run(  # --resume takes it back (checked only: nothing starts)
        [sys.executable, "-m", "simulation", "run", "--resume", str(run_dir),
         "--num-supernodes", "2", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"note: resuming {run_dir} after its round {match.group(1)}" in resumed.stderr

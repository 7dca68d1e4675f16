"""A sweep keeps each run's streamed ServerApp output (server.log) and its own sweep file
(sweep.toml) in its results folder; run_app is faked."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from simulation import sweep
from tests.test_sweep import SWEEP_TOML, fake_run_dir, write


@pytest.fixture(autouse=True)
def known_commit(monkeypatch):
    """The sweep asks git for the code's state before each run (a process): fixed here."""
    monkeypatch.setattr(sweep, "git_state", lambda: {"git-commit": "abc", "git-dirty": False})


def fake_run_app(run_config, federation, **kwargs):
    directory = Path(run_config["output-dir"])
    if run_config["seed"] == 2 and "b.x" in directory.parts:  # stops before its run directory
        return SimpleNamespace(returncode=1, status="failed", output="config error\n")
    fake_run_dir(directory, [0.1, 0.2, 0.3, 0.4])
    return SimpleNamespace(returncode=0, status="ok", output=f"INFO : run of {directory.name}\n")


def test_every_run_keeps_its_server_log_and_the_folder_its_sweep_file(tmp_path, monkeypatch):
    path = write(tmp_path, SWEEP_TOML)
    out = tmp_path / "out"
    monkeypatch.setattr(sweep, "run_app", fake_run_app)
    args = argparse.Namespace(file=path, out=out, ray_address=None, seeds=None, variants=None)
    assert sweep.run(args) == 1  # one run failed
    assert (out / sweep.SWEEP_COPY).read_text() == SWEEP_TOML
    logs = sorted(out.glob("*/seed*/*/server.log"))
    assert [p.relative_to(out).parts[:2] for p in logs] == [("a", "seed1"), ("a", "seed2"),
                                                            ("b.x", "seed1")]
    assert logs[0].read_text() == "INFO : run of seed1\n"
    (failed,) = (out / "b.x" / "seed2").glob("server-*.log")
    assert failed.read_text() == "config error\n"


def test_a_resumed_run_keeps_its_log_in_its_new_run_directory(tmp_path):
    run = sweep.SweepRun("a", 1, {}, tmp_path / "a" / "seed1")
    old = fake_run_dir(run.directory, [0.1, 0.2], name="20250101-000000-x-run1")
    before = sweep.run_dirs(run.directory)
    new = fake_run_dir(run.directory, [0.1, 0.2, 0.3], name="20250102-000000-x-run2")
    assert sweep.keep_server_log(run, before, "resumed\n") == new / sweep.SERVER_LOG
    assert not (old / sweep.SERVER_LOG).exists()

"""Resuming is checked before anything starts (simulation/preflight.py): a bad
``resume-from`` (no folder, no checkpoint, another strategy or run config) is the
ServerApp's own message, in the driver. ``run --resume RUN_DIR`` takes the run config
from the run's checkpoint, ``-c`` overrides on top with a note; Ctrl-C's one line says
where the last checkpoint is (simulation/run.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fedapp.checkpoint import make_payload, save_checkpoint
from fedapp.registry import build_strategy, check_run_config
from simulation import __main__ as simulation_cli
from simulation import run as run_tool
from simulation.preflight import check_before_start
from simulation.run import RunWatch, resume_overrides
from simulation.runtime import interrupt_once

REPO = Path(__file__).resolve().parents[1]
SYNTHETIC = {"dataset": "synthetic", "model": "mlp-2nn", "partition": "natural",
             "num-server-rounds": 5, "checkpoint-every": 1, "lr": 0.05}


def checkpointed_run(folder: Path, run_config: dict, server_round: int = 2) -> Path:
    """A run directory with the checkpoint of ``server_round`` of ``run_config``."""
    cfg = check_run_config({**run_config, "output-dir": str(folder.parent)})
    strategy, _ = build_strategy(cfg)
    arrays = ArrayRecord({"w": Array(np.arange(3, dtype=np.float32))})
    folder.mkdir(parents=True)
    save_checkpoint(folder, make_payload(server_round, arrays, strategy, [], 1.0, cfg.to_dict()))
    return folder


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return checkpointed_run(tmp_path / "runs" / "20250101-000000-fedavg-run1", SYNTHETIC)


@pytest.fixture
def no_flwr_run(monkeypatch):
    started = []
    monkeypatch.setattr(run_tool, "run_app", lambda *a, **k: started.append(a) or 1 / 0)
    return started


def resume_config(run_dir: Path, **changes) -> dict:
    return {**SYNTHETIC, "output-dir": str(run_dir.parent), "resume-from": str(run_dir),
            **changes}


def refusal(config: dict) -> str:
    with pytest.raises(ValueError) as info:
        check_before_start(config, 5)
    return str(info.value)


def test_a_compatible_checkpoint_passes(run_dir):
    assert check_before_start(resume_config(run_dir, **{"num-server-rounds": 8}), 5) == []


def test_a_missing_folder_or_checkpoint_is_refused(tmp_path, run_dir):
    missing = tmp_path / "gone"
    assert refusal(resume_config(missing)).startswith(
        f"run config: resume-from='{missing}' is not a run directory (no such folder)")
    (tmp_path / "empty").mkdir()
    message = refusal(resume_config(tmp_path / "empty"))
    assert f"resume-from='{tmp_path / 'empty'}' has no checkpoint.json" in message
    assert "checkpoint-every >= 1" in message


def test_a_checkpoint_of_another_strategy_or_config_is_refused(run_dir):
    message = refusal(resume_config(run_dir, strategy="fedprox"))
    assert "written with other settings (strategy: checkpoint 'fedavg' vs now 'fedprox')" \
        in message
    assert "lr: checkpoint 0.05 vs now 0.1" in refusal(resume_config(run_dir, lr=0.1))
    message = refusal(resume_config(run_dir, **{"num-server-rounds": 2}))
    assert "num-server-rounds=2 but the checkpoint is already at round 2" in message


def test_a_damaged_checkpoint_is_refused(run_dir):
    npz = next(run_dir.glob("checkpoint-round*.npz"))
    npz.write_bytes(npz.read_bytes()[:-5])
    assert "cannot be read" in refusal(resume_config(run_dir))


def test_the_cli_refuses_a_bad_resume_from_before_flwr_run(tmp_path, no_flwr_run):
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["run", "--num-supernodes", "5", "-c", "dataset='synthetic'",
                             "-c", "model='mlp-2nn'", "-c", f"resume-from='{tmp_path}'"])
    assert str(info.value).startswith(f"run config: resume-from='{tmp_path}' "
                                      "has no checkpoint.json")
    assert "or start fresh: -c resume-from=''\n" in str(info.value)  # as the user gave it
    assert str(info.value).endswith("nothing ran)") and no_flwr_run == []


def test_resume_of_no_run_directory_says_the_fix_in_resumes_own_terms(tmp_path, no_flwr_run):
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["run", "--resume", str(tmp_path / "nope")])
    message = str(info.value)
    assert message.startswith(f"--resume {tmp_path / 'nope'}: run config: resume-from=")
    assert "or start fresh: leave out --resume\n" in message and "--run-config" not in message
    assert no_flwr_run == []


def test_resume_takes_the_run_config_from_the_run_directory(run_dir, no_flwr_run, capsys):
    overrides = resume_overrides(run_dir, {"num-server-rounds": 9})
    assert overrides["resume-from"] == str(run_dir)
    assert overrides["dataset"] == "synthetic" and overrides["lr"] == 0.05
    assert overrides["num-server-rounds"] == 9
    assert "strategy" not in overrides  # the app's default: flwr run gives it
    note = capsys.readouterr().err
    assert note.startswith(f"note: resuming {run_dir} after its round 2 with its run config")
    assert note.rstrip().endswith("; on top: -c num-server-rounds=9 (was 5)")
    assert simulation_cli.main(["run", "--resume", str(run_dir), "--num-supernodes", "5",
                                "--check"]) == 0
    with pytest.raises(ZeroDivisionError):  # checked, then handed to (the stand-in) flwr run
        simulation_cli.main(["run", "--resume", str(run_dir), "--num-supernodes", "5",
                             "-c", "num-server-rounds=7"])
    assert len(no_flwr_run) == 1 and no_flwr_run[0][0]["resume-from"] == str(run_dir)


def test_resume_with_an_override_the_checkpoint_refuses(run_dir, no_flwr_run):
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["run", "--resume", str(run_dir), "--num-supernodes", "5",
                             "-c", "lr=0.5"])
    assert "lr: checkpoint 0.05 vs now 0.5" in str(info.value) and no_flwr_run == []
    with pytest.raises(SystemExit, match="give one of them"):
        simulation_cli.main(["run", "--resume", str(run_dir), "-c", f"resume-from='{run_dir}'"])
    with pytest.raises(SystemExit, match=r"^--resume .*gone: run config: resume-from="):
        simulation_cli.main(["run", "--resume", str(run_dir.parent / "gone")])


# ----------------------------------------------------------------- Ctrl-C's line
def test_the_logged_lines_it_reads_are_the_serverapps():
    """RunWatch reads two log lines; their format strings are the ServerApp's."""
    assert '"fedhetero: %s on %s (%s, %s), model %s, run directory %s"' in \
        (REPO / "fedapp" / "server_app.py").read_text()
    assert '"Checkpoint of round %d: %s"' in (REPO / "fedapp" / "checkpoint.py").read_text()


def test_ctrl_c_names_the_last_checkpoint_and_how_to_resume(run_dir):
    seen = []
    watch = RunWatch(seen.append)
    assert watch.stopped() == "Stopped by Ctrl-C before the run started; nothing to resume"
    watch("\x1b[92mINFO \x1b[0m:      fedhetero: fedavg on synthetic (natural, synthetic), "
          f"model mlp-2nn, run directory {run_dir}\n")
    assert watch.stopped() == (f"Stopped by Ctrl-C; {run_dir} has no checkpoint to resume from "
                               "(checkpoint-every=0; give -c checkpoint-every=1 to make a run "
                               "resumable)")
    watch(f"INFO :      Checkpoint of round 1: {run_dir / 'checkpoint.json'}\n")
    # the checkpoint's own round: the ServerApp wrote round 2 before it was stopped
    assert watch.stopped() == (f"Stopped by Ctrl-C; the last checkpoint (round 2) is in "
                               f"{run_dir} (resume with fedhetero run --resume {run_dir})")
    assert len(seen) == 2  # every line goes on to the progress display


def test_a_second_ctrl_c_does_not_cut_the_clean_up_short():
    previous, cleaned = signal.getsignal(signal.SIGINT), []
    with pytest.raises(KeyboardInterrupt), interrupt_once():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # interrupted at once
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C: ignored
            time.sleep(0.2)
            cleaned.append(True)
    assert cleaned == [True] and signal.getsignal(signal.SIGINT) is previous


def test_ctrl_c_and_kill_print_the_line_after_the_clean_up(monkeypatch, capsys):
    def stopped(exc):
        def launch(args, watch):
            raise exc
        return launch

    args = simulation_cli.build_parser("run").parse_args(["run"])
    monkeypatch.setattr(run_tool, "launch", stopped(KeyboardInterrupt()))
    assert run_tool.run(args) == 130
    assert capsys.readouterr().err == ("Stopped by Ctrl-C before the run started; nothing to "
                                       "resume\n")
    monkeypatch.setattr(run_tool, "launch", stopped(SystemExit(143)))
    with pytest.raises(SystemExit) as info:
        run_tool.run(args)
    assert info.value.code == 143
    assert capsys.readouterr().err.startswith("Stopped by kill (SIGTERM) before the run started")
    monkeypatch.setattr(run_tool, "launch", stopped(SystemExit("refused")))
    with pytest.raises(SystemExit, match="refused"):
        run_tool.run(args)
    assert capsys.readouterr().err == ""  # a refusal is its own message

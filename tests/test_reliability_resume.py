"""Checkpoint / resume and determinism, every registered strategy, in-process (fake Grid, CPU).

A run killed after round 3 (checkpoint every 2 rounds, so the checkpoint is of round 2)
and resumed must end with exactly the final model and run log (timings aside) of an
uninterrupted run with the same seed; two runs with the same seed must be identical.
Faults are on, so the failed-client bookkeeping and the kept-model rounds are covered too.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from fedapp.checkpoint import CHECKPOINT_NAME, LEGACY_NAME, load_checkpoint
from fedapp.checkpoint_format import CheckpointFormatError
from fedapp.config import ConfigError
from fedapp.run_log import read_rounds
from simulation.reliability import SimulatedKill, run_inprocess
from strategies import contract as C
from tests.reliability_common import (
    ALL_STRATEGIES,
    config,
    resend_aside,
    run,
    same_model,
    without_timings,
)

FAULTY = {"num-server-rounds": 4, "fault-crash-prob": 0.2, "fault-late-prob": 0.1, "seed": 1}


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
@pytest.mark.usefixtures("processes")
def test_killed_and_resumed_run_equals_uninterrupted_run(strategy, tmp_path):
    _, full_dir, full_rounds, full_model = run(
        strategy, tmp_path / "full", 3, **FAULTY, **{"checkpoint-every": 2}
    )
    killed_cfg = config(strategy, tmp_path / "killed", **FAULTY, **{"checkpoint-every": 2})
    with pytest.raises(SimulatedKill):
        run_inprocess(killed_cfg, 3, kill_after_round=3)
    killed_dir = next((tmp_path / "killed").iterdir())
    assert [r["round"] for r in read_rounds(killed_dir)] == [
        0,
        1,
        2,
        3,
    ]  # round 3 logged, not checkpointed
    assert load_checkpoint(killed_dir)["round"] == 2
    assert not (killed_dir / "final_model.pt").exists()
    _, resumed_dir, resumed_rounds, resumed_model = run(
        strategy,
        tmp_path / "resumed",
        3,
        **FAULTY,
        **{"checkpoint-every": 2, "resume-from": str(killed_dir)},
    )
    full, resumed = without_timings(full_rounds), without_timings(resumed_rounds)
    resent = resend_aside(full, resumed, 3)  # client state (SCAFFOLD's c_i) is sent again
    assert resumed == full
    if C.LOG_CLIENT_STATE_ATTACHED in full_rounds[3]:
        assert resent > 0 and resumed_rounds[3][C.LOG_BYTES_DOWN] > full_rounds[3][C.LOG_BYTES_DOWN]
    assert same_model(resumed_model, full_model)
    assert load_checkpoint(resumed_dir)["round"] == 4 and load_checkpoint(full_dir)["round"] == 4
    resumed_config = json.loads((resumed_dir / "config.json").read_text())
    assert resumed_config["resumed-from"] == {"run-dir": str(killed_dir), "round": 2}


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
@pytest.mark.usefixtures("processes")
def test_two_runs_with_the_same_seed_are_identical(strategy, tmp_path):
    _, _, first, first_model = run(strategy, tmp_path / "a", 3, **FAULTY)
    # other node ids (as in a new simulation), same partitions: nothing may depend on them
    _, _, second, second_model = run(
        strategy, tmp_path / "b", 3, grid_kwargs={"node_ids": [5, 77, 31]}, **FAULTY
    )
    assert without_timings(first) == without_timings(second)
    assert same_model(first_model, second_model)
    assert (tmp_path / "a").iterdir() and json.dumps(
        without_timings(first), sort_keys=True
    ) == json.dumps(without_timings(second), sort_keys=True)


@pytest.mark.usefixtures("processes")
def test_a_checkpoint_that_cannot_be_written_keeps_the_last_good_one(tmp_path):
    """A state the format cannot hold (here a set) is refused before any file is written;
    the checkpoint of round 2 stays whole. (A full disk: tests/test_checkpoint_disk_full.py.)"""
    _, run_dir, _, _ = run("fedavg", tmp_path / "a", 2,
                           **{"num-server-rounds": 2, "checkpoint-every": 2})
    from fedapp import checkpoint  # noqa: PLC0415

    good = load_checkpoint(run_dir)
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(CheckpointFormatError, match=r"payload\['strategy'\]\['x'\] is a builtins.set"):
        checkpoint.save_checkpoint(run_dir, {**good, "round": 4, "strategy": {"x": {1}}})
    assert sorted(p.name for p in run_dir.iterdir()) == before  # no .tmp, no new .npz
    assert load_checkpoint(run_dir)["round"] == 2


def test_resume_errors_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="is not a run directory .no such folder."):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="that is a file: give the run directory"):
        load_checkpoint(tmp_path / "file")
    with pytest.raises(ConfigError, match="has no checkpoint.json"):
        load_checkpoint(tmp_path)
    (tmp_path / CHECKPOINT_NAME).write_text('{"format": "fedhetero-checkp')
    with pytest.raises(ConfigError, match="corrupt, truncated or not a fedhetero checkpoint"):
        load_checkpoint(tmp_path)


@pytest.mark.usefixtures("apps")
def test_a_pickle_checkpoint_is_refused_unread(tmp_path):
    """A checkpoint.pkl (format 1, or planted) is never unpickled: resume-from says why."""
    class Planted:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))

    (tmp_path / LEGACY_NAME).write_bytes(pickle.dumps(Planted()))
    with pytest.raises(ConfigError, match="a Python pickle, which can run any code"):
        load_checkpoint(tmp_path)
    assert not (tmp_path / "pwned").exists()
    rc = config("fedavg", tmp_path / "b", **{"num-server-rounds": 3, "resume-from": str(tmp_path)})
    with pytest.raises(RuntimeError, match="checkpoint.pkl"):
        run_inprocess(rc, 2)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.usefixtures("processes")
def test_resume_refuses_another_experiment(tmp_path):
    _, run_dir, _, _ = run(
        "fedavg", tmp_path / "a", 2, **{"num-server-rounds": 2, "checkpoint-every": 1}
    )
    for changed, pattern in (
        ({"lr": 0.5}, "lr: checkpoint 0.05 vs now 0.5"),
        ({"num-server-rounds": 2}, "already at round 2"),
    ):
        rc = config(
            "fedavg",
            tmp_path / "b",
            **{"num-server-rounds": 3, "resume-from": str(run_dir), **changed},
        )
        with pytest.raises(RuntimeError, match=pattern):
            run_inprocess(rc, 2)


def test_a_key_added_after_the_checkpoint_counts_as_its_default(tmp_path):
    """A checkpoint written before a run-config key existed (here: server-beta1, added with
    Flower's server optimisers) resumes when the key is at its default, and only then."""
    from fedapp.checkpoint import check_compatible  # noqa: PLC0415
    from fedapp.config import RunConfig  # noqa: PLC0415

    now = RunConfig().to_dict() | {"num-server-rounds": 3}
    old = {"round": 2, "run-config": {k: v for k, v in now.items() if k != "server-beta1"}}
    check_compatible(old, now)
    with pytest.raises(ConfigError, match="server-beta1: checkpoint 0.9 vs now 0.5"):
        check_compatible(old, now | {"server-beta1": 0.5})


@pytest.mark.timeout(1500)
@pytest.mark.usefixtures("processes")
def test_a_real_flwr_run_resumes_from_its_checkpoint_bit_exactly(tmp_path):
    """Through `flwr run` on the simulation engine (not in-process): a 2-round run with its
    checkpoint of round 2, resumed to 3 rounds, equals an uninterrupted 3-round run (run in
    process: the same bits as under `flwr run`, tests/test_runtime_matrix.py). The two
    launches share one managed SuperLink."""
    from fedapp.model_file import read_model  # noqa: PLC0415
    from simulation.runtime import run_app  # noqa: PLC0415
    from simulation.runtime.local_superlink import superlink_use  # noqa: PLC0415
    from tests.deployed import run_in_process  # noqa: PLC0415

    home = tmp_path / "flwr-home"
    home.mkdir()
    rc = {"num-server-rounds": 3, "local-steps": 3, "partition": "iid", "seed": 4}

    def flwr_run(out, **overrides):
        result = run_app({**rc, "output-dir": str(out), **overrides},
                         {"num-supernodes": 2, "client-resources-num-cpus": 1},
                         flwr_home=home, timeout=420, isolate_ports=True, capture=True)
        assert result.returncode == 0, result.output[-4000:]
        (run_dir,) = list(out.iterdir())
        return run_dir

    full = run_in_process({**rc, "output-dir": str(tmp_path / "full")}, 2)
    with superlink_use(home):
        half = flwr_run(tmp_path / "half", **{"num-server-rounds": 2, "checkpoint-every": 2})
        assert load_checkpoint(half)["round"] == 2
        resumed = flwr_run(tmp_path / "resumed", **{"resume-from": str(half)})
    assert without_timings(read_rounds(resumed)) == without_timings(read_rounds(full))
    assert same_model(read_model(resumed / "final_model.pt"), read_model(full / "final_model.pt"))

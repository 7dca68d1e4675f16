"""The figures ``python -m simulation bench efficiency`` prints besides the run itself: the
evaluation bound, the bare evaluation time, the CPU by kind of process, torch's memory."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest

from simulation.bench import cpu_accounting as A
from simulation.bench.common import bare_evaluation_seconds, torch_import_mb
from simulation.bench.efficiency import Measurement, evaluation_bound, repeats_summary


def test_the_evaluation_bound_adds_the_evaluation_cpu_split_over_the_workers():
    # 84.9 s ideal, 15.6 s of evaluation on 2 workers: 84.9 / (84.9 + 7.8) = 0.91586...
    assert evaluation_bound(84.9, 15.6, 2) == pytest.approx(84.9 / 92.7)
    assert evaluation_bound(84.9, 15.6, 2) == pytest.approx(0.915857605, abs=1e-9)
    assert evaluation_bound(50.0, 0.0, 4) == 1.0
    # more workers share the same evaluation: the bound rises toward 1
    assert evaluation_bound(50.0, 10.0, 1) < evaluation_bound(50.0, 10.0, 8) < 1.0


def test_repeats_print_each_efficiency_and_their_median_and_range():
    def repeat(bare_total, ours, parallel):
        return Measurement(sim=[], ours=ours, evals=0.0, evaluated=4, eval_cpu=10.0,
                           bare=[bare_total / 2, bare_total / 2], ideal=bare_total / 2,
                           parallel=parallel)

    lines = repeats_summary([repeat(200.0, 125.0, 110.0),   # 0.80, profile 0.88
                             repeat(220.0, 118.0, 112.0),   # 0.93, profile 0.95
                             repeat(210.0, 120.0, 108.0)])  # 0.875, profile 0.90
    assert lines[0] == ("    repeat 1: bare SGD 200.0 s, ideal 100.0 s, ours 125.0 s, "
                        "efficiency 0.80, against the profile 0.88")
    assert lines[3] == ("    efficiency over 3 repeats: median 0.88 (range 0.80-0.93)   "
                        "(target >= 0.92)")
    assert lines[4] == "    against the parallel profile: median 0.90 (range 0.88-0.95)"
    alone = repeats_summary([repeat(200.0, 125.0, None)])  # one worker: no profile
    assert len(alone) == 2 and "against" not in alone[0]


@pytest.mark.usefixtures("processes")
def test_repeats_must_be_a_positive_integer():
    out = subprocess.run([sys.executable, "-m", "simulation", "bench", "efficiency",
                          "--repeats", "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "argument --repeats: '0': give a whole number >= 1" in out.stderr


@pytest.mark.usefixtures("processes")
def test_torch_import_memory_is_measured_in_a_fresh_process():
    measured = torch_import_mb()
    assert set(measured) == {"peak", "anonymous", "file"}
    assert measured["peak"] > 50  # torch and its libraries, whatever the build
    if sys.platform.startswith("linux"):
        assert measured["anonymous"] > 0 and measured["file"] > 0
        assert measured["anonymous"] + measured["file"] <= measured["peak"] + 1
    else:
        assert math.isnan(measured["anonymous"])


@pytest.mark.parametrize("cmdline, kind", [
    ("ray::ClientAppActor.run", A.CLIENT_ACTORS),
    ("ray::IDLE", A.CLIENT_ACTORS),
    ("/venv/bin/python /venv/bin/flwr-simulation --insecure --serverappio-api-address x",
     A.SERVER_PROCESS),
    ("/venv/bin/python -m fedapp.evaluation_process 7", A.SERVER_PROCESS),
    ("/venv/bin/python /venv/bin/flower-superlink --insecure", A.EVERYTHING_ELSE),
    ("/venv/lib/python3.12/site-packages/ray/core/src/ray/raylet/raylet --x", A.EVERYTHING_ELSE),
])
def test_processes_are_told_apart_by_their_command_line(cmdline, kind):
    assert A.process_kind(cmdline) == kind


def test_cpu_by_kind_is_the_window_before_the_last_record_by_hand(tmp_path):
    sampler = A.CpuSampler(tmp_path)
    actor, server, superlink, brief = (A.CLIENT_ACTORS, A.SERVER_PROCESS, A.EVERYTHING_ELSE,
                                       A.EVERYTHING_ELSE)
    sampler.samples = [  # (time, run-log records, {pid: (kind, cpu seconds so far)})
        (0.0, 1, {1: (actor, 0.0), 2: (server, 1.0)}),
        (5.0, 2, {1: (actor, 4.0), 2: (server, 1.5), 3: (superlink, 0.2)}),
        (10.0, 3, {1: (actor, 8.0), 2: (server, 2.5), 3: (superlink, 0.4), 4: (brief, 0.3)}),
        (15.0, 4, {1: (actor, 12.0), 2: (server, 3.0), 3: (superlink, 0.6)}),  # 4 ended
        (20.0, 5, {1: (actor, 16.0), 2: (server, 4.0), 3: (superlink, 0.8)}),
    ]
    # the 10 s before the 4th record: samples at t = 5 .. 15, 2 CPUs -> 20 CPU-seconds
    totals = sampler.by_kind(4, 10.0, 2)
    assert totals == pytest.approx({actor: 8.0, server: 1.5, superlink: 0.4 + 0.3,
                                    A.IDLE: 20.0 - 8.0 - 1.5 - 0.7})
    assert sampler.by_kind(6, 10.0, 2) is None  # the run log never had 6 records
    assert sampler.by_kind(2, 10.0, 2) is None  # the window starts before the first sample


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
@pytest.mark.usefixtures("processes")
def test_the_sampler_sees_a_busy_process_until_the_run_log_is_complete(tmp_path):
    log = tmp_path / "run" / "rounds.jsonl"
    log.parent.mkdir()
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1.5\n"
                             "while time.time() < end: pass"])
    with A.CpuSampler(tmp_path, interval=0.1) as sampler:
        busy.wait(timeout=60)
        log.write_text('{"round": 0}\n')
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(n for _, n, _ in sampler.samples):
            time.sleep(0.05)
    totals = sampler.by_kind(1, sampler.samples[-1][0] - sampler.samples[0][0], 1)
    assert totals is not None
    assert totals[A.EVERYTHING_ELSE] > 0.5  # ~1.5 s of a busy loop that ended in the window
    assert all(seconds >= 0 for seconds in totals.values())


def test_bare_evaluation_seconds_times_real_test_set_evaluations():
    pytest.importorskip("torch")
    from task.data import DataNotFoundError, load_dataset

    try:
        load_dataset("fashion-mnist")
    except DataNotFoundError as err:
        pytest.skip(str(err))
    workload = {"model": "mlp-2nn", "dataset": "fashion-mnist"}
    one, three = bare_evaluation_seconds(workload, 1), bare_evaluation_seconds(workload, 3)
    assert 0 < one < three
    assert bare_evaluation_seconds(workload, 0) < one


def test_the_bare_baseline_warms_up_with_two_untimed_steps_then_times_every_round():
    torch = pytest.importorskip("torch")
    from fedapp.config import RunConfig
    from simulation.bench.common import bare_client_seconds, warm_up
    from task.models import build_model

    cfg = RunConfig.from_user_config({"model": "mlp-2nn", "batch-size": 4})
    model = build_model("mlp-2nn", (1, 28, 28), 10)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(100, 1, 28, 28), torch.randint(0, 10, (100,))
    warm_up(model, {0: (x, y)}, cfg)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

    workload = {"model": "mlp-2nn", "dataset": "synthetic", "batch-size": 8}
    per_round = bare_client_seconds(workload, 4, [2, 3], threads=1, clients=[0, 1])
    assert len(per_round) == 2 and all(seconds > 0 for seconds in per_round)


def test_the_layout_bench_times_both_layouts_and_prints_what_training_layout_picks(
        capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    import argparse

    from simulation.bench import add_arguments, run

    # git is a process: the provenance line's own test is below
    monkeypatch.setattr("simulation.bench.git_state",
                        lambda: {"git-commit": "0" * 40, "git-dirty": False})

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    run(parser.parse_args(["layout", "--steps", "2", "--repeats", "1", "--device", "cpu",
                           "--eval-images", "256", "--model", "cnn-small"]))
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("cnn-small")]
    assert len(rows) == 2  # the two cnn-small cases, nothing else
    assert all(row.endswith("channels-last") for row in rows)  # the CPU's pick, from layout.py
    assert "evaluation, cnn-mcmahan, 256 images" in out
    assert "channels-last SGD speed-up on cpu:" in out.splitlines()[-1]
    with pytest.raises(SystemExit, match="--model mlp-2nn: not a convolutional model"):
        run(parser.parse_args(["layout", "--model", "mlp-2nn"]))
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--device cuda: torch sees no CUDA device"):
            run(parser.parse_args(["layout", "--device", "cuda"]))


@pytest.mark.usefixtures("processes")
def test_the_import_bench_compares_both_sides_with_their_bytecode_cached(tmp_path, monkeypatch):
    """With PYTHONDONTWRITEBYTECODE set, our editable sources would be compiled at every
    import while flwr's come precompiled: the bench's environment caches both."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from simulation.bench.imports import cached_bytecode_env  # noqa: PLC0415

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = cached_bytecode_env(str(tmp_path))
    assert "PYTHONDONTWRITEBYTECODE" not in env
    subprocess.run([sys.executable, "-c", "import strategies.contract"], check=True, env=env,
                   timeout=60)
    assert list(tmp_path.rglob("strategies/contract.*.pyc"))  # the prefix mirrors the sources


def test_every_bench_begins_with_the_commit_the_tree_the_cores_and_the_load():
    from simulation.bench import provenance_line  # noqa: PLC0415

    line = provenance_line({"git-commit": "46b5777d0123456789", "git-dirty": False})
    assert line.startswith("fedhetero bench at commit 46b5777d0123 (clean tree), 20")
    assert " cores, load average " in line and "; torch " in line and ", flwr 1.4" in line
    assert "(uncommitted changes)" in provenance_line({"git-commit": "abc", "git-dirty": True})
    assert "(no git)" in provenance_line({"git-commit": "unknown", "git-dirty": None})

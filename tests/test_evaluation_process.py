"""The ServerApp's evaluation process (fedapp.evaluation_process): the ServerApp imports no
torch; the child builds the same seeded model and computes the same losses as the task module
in this process; its errors reach the ServerApp with their names; it stops when asked, when
the ServerApp's end closes, and a crash of it is reported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from fedapp.evaluation_process import EvaluationProcess, EvaluationSpec, evaluation_process
from task.data import DataNotFoundError, load_dataset
from task.evaluate import evaluate
from task.models import build_model

SPEC = EvaluationSpec(dataset="synthetic", data_dir="", allow_download=False, synthetic_alpha=1.0,
                      synthetic_beta=1.0, normalize=True, model="mlp-2nn", seed=7, device="cpu",
                      batch_size=500, reference_gflops=None)


@pytest.fixture(scope="module")
def process(processes):
    handle = EvaluationProcess(SPEC)
    yield handle
    handle.close()


@pytest.mark.usefixtures("processes")
def test_the_server_app_imports_no_torch():
    """Not by its imports, nor by what its evaluation process sends back (a torch object in
    a reply would import torch when unpickled here)."""
    code = ("import sys, fedapp.server_app as s\n"
            f"p = s.EvaluationProcess(s.EvaluationSpec(**{SPEC.__dict__!r}))\n"
            "p.evaluate(p.info['arrays'])\n"
            "p.close()\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_initial_model_and_the_losses_are_those_of_the_task_module(process):
    dataset = load_dataset("synthetic", "", False, 1.0, 1.0, True, with_train=False)
    torch.manual_seed(SPEC.seed)
    model = build_model(SPEC.model, dataset.input_shape, dataset.num_classes)
    state = model.state_dict()
    assert list(process.info["arrays"]) == list(state)  # the state dict's order
    for key, array in process.info["arrays"].items():
        assert array.dtype == state[key].numpy().dtype
        assert np.array_equal(array, state[key].numpy())
    assert process.info["input-shape"] == tuple(dataset.input_shape)
    assert process.info["device"] == "cpu" and process.info["torch"] == torch.__version__
    assert process.info["seconds-per-example"] is None  # no simulated clock asked for

    perturbed = {k: v + np.float32(0.01) if v.dtype == np.float32 else v
                 for k, v in process.info["arrays"].items()}
    ours = process.evaluate(perturbed)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in perturbed.items()})
    here = evaluate(model, dataset.x_test, dataset.y_test, SPEC.batch_size)
    assert (ours.loss, ours.accuracy) == (here.loss, here.accuracy)
    in_background = process.evaluate(perturbed, background=True)
    assert (in_background.loss, in_background.accuracy) == (here.loss, here.accuracy)
    assert ours.seconds > 0 and ours.peak_rss_mb > 50


def test_the_final_model_file_holds_the_arrays_given(process, tmp_path):
    arrays = {k: np.full_like(v, 0.5) for k, v in process.info["arrays"].items()}
    process.evaluate({k: np.zeros_like(v) for k, v in arrays.items()})  # no hidden state
    path = process.save_model(arrays, tmp_path / "final_model.pt")
    saved = torch.load(path)
    assert list(saved) == list(arrays)
    assert all(np.array_equal(saved[k].numpy(), arrays[k]) for k in arrays)
    assert not list(tmp_path.glob("*.tmp"))


def test_an_error_in_the_child_is_raised_here_and_the_child_goes_on(process):
    wrong = {k: v[..., :1] for k, v in process.info["arrays"].items()}
    with pytest.raises(RuntimeError, match="(?s)evaluation process failed: RuntimeError: .*size mismatch"):
        process.evaluate(wrong)
    assert process.evaluate(process.info["arrays"]).accuracy >= 0.0  # still serving


@pytest.mark.usefixtures("processes")
def test_a_clock_gets_the_model_cost_from_the_child():
    from task.devices import seconds_per_example  # noqa: PLC0415

    handle = EvaluationProcess(EvaluationSpec(**{**SPEC.__dict__, "reference_gflops": 2.0}))
    try:
        torch.manual_seed(SPEC.seed)
        model = build_model(SPEC.model, handle.info["input-shape"], handle.info["num-classes"])
        assert handle.info["seconds-per-example"] == seconds_per_example(
            model, handle.info["input-shape"], 2.0)
    finally:
        handle.close()
    assert handle.process.returncode == 0


@pytest.mark.usefixtures("processes")
def test_missing_data_is_the_data_error(tmp_path):
    spec = EvaluationSpec(**{**SPEC.__dict__, "dataset": "mnist", "data_dir": str(tmp_path)})
    with pytest.raises(DataNotFoundError, match="mnist not found under"):
        EvaluationProcess(spec)


@pytest.mark.usefixtures("processes")
def test_the_child_stops_when_the_server_app_end_closes():
    handle = EvaluationProcess(SPEC)
    handle.connection.close()  # as when the ServerApp's process dies
    assert handle.process.wait(timeout=60) == 0


@pytest.mark.usefixtures("processes")
def test_a_crashed_child_is_reported_with_its_pid():
    handle = EvaluationProcess(SPEC)
    try:
        os.kill(handle.pid, signal.SIGKILL)
        handle.process.wait(timeout=60)
        with pytest.raises(RuntimeError, match=rf"evaluation process \(pid {handle.pid}\) ended "
                                               r"unexpectedly \(exit code -9\)"):
            handle.evaluate(handle.info["arrays"])
    finally:
        handle.close()


@pytest.mark.usefixtures("processes")
def test_one_child_serves_the_runs_of_one_spec_and_a_dead_one_is_replaced():
    spec = EvaluationSpec(**{**SPEC.__dict__, "seed": 8})
    first = evaluation_process(spec)
    assert evaluation_process(spec) is first
    os.kill(first.pid, signal.SIGKILL)
    first.process.wait(timeout=60)
    second = evaluation_process(spec)
    assert second is not first and second.alive and second.pid != first.pid
    second.connection.close()  # as a request interrupted before its reply: not reused
    assert not second.alive and evaluation_process(spec) is not second


def test_only_the_most_recently_used_specs_keep_their_child(monkeypatch):
    """A test worker runs many configurations: the third spec's child stops the least
    recently used one (each child holds torch, a model and the test set)."""
    import fedapp.evaluation_process as ep

    class Child:
        def __init__(self, spec):
            self.spec, self.alive = spec, True

        def close(self):
            self.alive = False

    monkeypatch.setattr(ep, "EvaluationProcess", Child)
    monkeypatch.setattr(ep, "_KEPT", {})
    a, b, c = (EvaluationSpec(**{**SPEC.__dict__, "seed": s}) for s in (21, 22, 23))
    first_a, first_b = evaluation_process(a), evaluation_process(b)
    assert evaluation_process(a) is first_a  # a is now the most recently used
    third = evaluation_process(c)
    assert not first_b.alive and first_a.alive and third.alive
    assert list(ep._KEPT) == [a, c] and ep.KEEP_SPECS == 2
    assert evaluation_process(b) is not first_b and not first_a.alive

"""Server-side evaluation off the critical path: ``eval-every`` and ``eval-overlap``
(issue #19), through the real ServerApp with an in-process Grid."""

from __future__ import annotations

import hashlib

import pytest
import torch
from flwr.app import Context, RecordDict

from fedapp.checkpoint import load_checkpoint
from fedapp.client_app import app as client_app
from fedapp.run_log import read_rounds
from fedapp.server_app import app as server_app
from strategies import contract as C
from tests.inprocess import InProcessGrid

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# small and fast: Synthetic(1, 1), FedProx's MLP, 4 clients
BASE = {"dataset": "synthetic", "model": "mlp-2nn", "partition": "natural", "local-steps": 2,
        "batch-size": 10, "lr": 0.05, "num-server-rounds": 5, "min-available-nodes": 4,
        "eval-batch-size": 500}


def run(tmp_path, **overrides) -> tuple[list[dict], str]:
    """Run the ServerApp; (its round records, a digest of its final model)."""
    out = tmp_path / "out"
    rc = {**BASE, **overrides, "output-dir": str(out)}
    grid = InProcessGrid(client_app, 4, rc)
    server_app(grid, Context(run_id=3, node_id=0, node_config={}, state=RecordDict(),
                             run_config=dict(rc)))
    (run_dir,) = list(out.iterdir())
    state = torch.load(run_dir / "final_model.pt")
    digest = hashlib.sha256(b"".join(state[k].numpy().tobytes() for k in sorted(state)))
    return read_rounds(run_dir), digest.hexdigest()


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in C.LOG_TIMING_KEYS} for r in records]


@pytest.mark.usefixtures("processes")
def test_overlapped_evaluation_writes_the_same_run_log(tmp_path):
    overlapped, model_a = run(tmp_path / "a", **{"eval-overlap": True})
    in_between, model_b = run(tmp_path / "b", **{"eval-overlap": False})
    assert [r[C.LOG_ROUND] for r in overlapped] == [0, 1, 2, 3, 4, 5]  # in round order
    assert without_timing(overlapped) == without_timing(in_between)
    assert model_a == model_b
    for record in overlapped:  # each round's own model was evaluated, every round
        assert 0.0 <= record[C.LOG_ACCURACY] <= 1.0 and record[C.LOG_EVAL_SECONDS] > 0
        # the ServerApp's memory and that of its evaluation process (torch, the test split)
        assert record[C.LOG_SERVER_MAX_RSS_MB] > 0 and record[C.LOG_EVAL_MAX_RSS_MB] > 0
    # the timing keys are there, and the rounds' wall seconds add up to the elapsed time
    assert overlapped[-1][C.LOG_ELAPSED_SECONDS] == pytest.approx(
        sum(r[C.LOG_WALL_SECONDS] for r in overlapped), rel=1e-9)


@pytest.mark.usefixtures("processes")
def test_eval_every_evaluates_round_zero_every_kth_and_the_last(tmp_path):
    records, _ = run(tmp_path / "k", **{"eval-every": 2})
    every, _ = run(tmp_path / "all")
    assert [r[C.LOG_ROUND] for r in records] == [0, 1, 2, 3, 4, 5]
    assert [C.LOG_ACCURACY in r for r in records] == [True, False, True, False, True, True]
    for skipped in (records[1], records[3]):
        assert C.LOG_LOSS not in skipped and C.LOG_EVAL_SECONDS not in skipped
        assert skipped[C.LOG_CLIENTS_RECEIVED] == 4  # the round's other keys are all there
    for r in (0, 2, 4, 5):  # the evaluated rounds' numbers are those of eval-every=1
        assert without_timing(records)[r] == without_timing(every)[r]


@pytest.mark.usefixtures("processes")
def test_a_checkpoint_holds_the_records_up_to_its_round(tmp_path):
    out = tmp_path / "out"
    rc = {**BASE, "num-server-rounds": 3, "checkpoint-every": 2, "output-dir": str(out)}
    grid = InProcessGrid(client_app, 4, rc)
    server_app(grid, Context(run_id=3, node_id=0, node_config={}, state=RecordDict(),
                             run_config=dict(rc)))
    (run_dir,) = list(out.iterdir())
    payload = load_checkpoint(run_dir)
    assert payload["round"] == 2
    assert payload["records"] == read_rounds(run_dir)[:3]  # rounds 0..2, evaluated


@pytest.mark.usefixtures("processes")
def test_a_failed_background_evaluation_stops_the_run(tmp_path, monkeypatch):
    from fedapp.evaluation_process import EvaluationProcess  # noqa: PLC0415

    real = EvaluationProcess.evaluate

    def failing(self, arrays, background=False):
        if background:
            raise RuntimeError("evaluation failed in the background")
        return real(self, arrays, background)

    monkeypatch.setattr(EvaluationProcess, "evaluate", failing)
    with pytest.raises(RuntimeError, match="evaluation failed in the background"):
        run(tmp_path, **{"num-server-rounds": 2})


@pytest.mark.parametrize("name", ["cnn-mcmahan", "cnn-small", "lenet-gn"])
def test_the_background_evaluation_thread_uses_one_torch_thread_and_the_same_numbers(name):
    """The overlapped evaluation runs on one torch thread (contending least with training);
    the caller keeps its thread count, and the test loss is the same bits as with two."""
    from concurrent.futures import ThreadPoolExecutor

    from fedapp.evaluation_process import background_evaluation_thread
    from task.evaluate import evaluate
    from task.layout import inference_layout
    from task.models import build_model

    torch.manual_seed(0)
    model, x = inference_layout(build_model(name, (1, 28, 28), 10), torch.rand(600, 1, 28, 28))
    y = torch.randint(0, 10, (600,))
    torch.set_num_threads(2)  # restored to 1 by the module's fixture, then to the caller's
    with_two = evaluate(model, x, y, 200)
    with ThreadPoolExecutor(1, initializer=background_evaluation_thread) as worker:
        threads, in_background = worker.submit(
            lambda: (torch.get_num_threads(), evaluate(model, x, y, 200))).result()
    assert threads == 1 and torch.get_num_threads() == 2
    assert (in_background.loss, in_background.accuracy) == (with_two.loss, with_two.accuracy)

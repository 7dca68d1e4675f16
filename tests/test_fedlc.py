"""FedLC (Zhang et al., ICML 2022): the calibrated loss against a number worked out by hand,
the label counts taken once, and the fedhetero ClientApp finding FedLC's client side from
the message alone (tau = 0 is FedAvg bit for bit, tau > 0 trains another model)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedapp.client_app import app as client_app
from fedapp.server_app import app as server_app
from strategies import FedLC
from strategies import contract as C
from strategies.algorithms.fedlc import FEDLC_TAU
from strategies.client.fedlc import LogitCalibration, calibrated_loss
from tests.inprocess import InProcessGrid

RUN = {"dataset": "synthetic", "model": "mlp-2nn", "partition": "dirichlet",
       "dirichlet-alpha": 0.3, "local-steps": 3, "batch-size": 10, "lr": 0.05,
       "eval-batch-size": 2000, "num-server-rounds": 1, "min-available-nodes": 3, "seed": 2,
       "drift-diagnostics": False, "run-plots": False}


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def test_the_calibrated_loss_by_hand():
    # counts 16, 1, 0 -> offsets 16^-1/4 = 0.5, 1, (1e-8)^-1/4 = 100 (tau = 1): the logits
    # (1, 2, 0) become (0.5, 1, -100); at label 1: -log(e^1 / (e^0.5 + e^1 + e^-100))
    logits = torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64)
    loss = calibrated_loss(logits, torch.tensor([1]), [16, 1, 0], 1.0)
    assert float(loss) == pytest.approx(math.log(1 + math.exp(-0.5) + math.exp(-101)))
    # tau = 0 is the plain cross-entropy
    plain = torch.nn.functional.cross_entropy(logits, torch.tensor([1]))
    assert float(calibrated_loss(logits, torch.tensor([1]), [16, 1, 0], 0.0)) == float(plain)


def test_the_hook_counts_the_clients_labels_once():
    msg = Message(RecordDict({C.CONFIG: ConfigRecord({FEDLC_TAU: 1.0})}), dst_node_id=1,
                  message_type="train")
    hook = LogitCalibration(msg, torch.tensor([0, 0, 2, 2, 2, 2]))
    hook.loss_fn(torch.zeros(2, 3), torch.tensor([0, 2]))
    assert hook.counts.tolist() == [2, 0, 4]
    with pytest.raises(ValueError, match=FEDLC_TAU):
        LogitCalibration(Message(RecordDict({C.CONFIG: ConfigRecord({})}), dst_node_id=1,
                                 message_type="train"), torch.tensor([0]))


def final_model(strategy: str, tmp_path, **extra) -> dict[str, np.ndarray]:
    rc = {**RUN, "strategy": strategy, "output-dir": str(tmp_path), **extra}
    grid = InProcessGrid(client_app, 3, rc)
    server_app(grid, Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                             run_config=dict(rc)))
    (run_dir,) = list(tmp_path.iterdir())
    return {k: v.numpy() for k, v in torch.load(run_dir / "final_model.pt").items()}


@pytest.mark.usefixtures("processes")
def test_the_app_finds_fedlcs_client_side_from_the_message(tmp_path):
    torch.set_num_threads(1)
    fedavg = final_model("fedavg", tmp_path / "fedavg")
    zero = final_model("fedlc", tmp_path / "zero", **{"fedlc-tau": 0.0})
    calibrated = final_model("fedlc", tmp_path / "one", **{"fedlc-tau": 1.0})
    assert all(np.array_equal(fedavg[k], zero[k]) for k in fedavg)
    assert any(not np.array_equal(fedavg[k], calibrated[k]) for k in fedavg)


def test_the_constructor_refuses_a_negative_tau():
    with pytest.raises(ValueError, match="tau"):
        FedLC(tau=-1.0)
    assert FedLC(tau=0.5).algorithm.tau == 0.5

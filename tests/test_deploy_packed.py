"""Packed mode on Flower's deployment runtime, loopback: a real SuperLink, two real
SuperNodes each serving a share of 5 virtual clients (cross-silo with many users), and
``flwr run`` (:func:`tests.deployed.run_deployed`: free ports, a private FLWR_HOME, every
process stopped by PID and checked gone). SCAFFOLD, so each virtual client's c_i must follow
it across rounds (client-state rounds 0, 1, 2, nothing resent), and the model learns."""

from __future__ import annotations

import pytest

from fedapp.run_log import read_rounds
from strategies import contract as C
from tests.deployed import run_deployed

pytestmark = pytest.mark.usefixtures("deployment")


@pytest.mark.timeout(600)
def test_two_supernodes_serve_five_virtual_clients(tmp_path):
    out = tmp_path / "runs"
    (result,) = run_deployed(tmp_path, 2, [
        {"num-server-rounds": 3, "strategy": "scaffold", "dataset": "synthetic",
         "model": "mlp-2nn", "partition": "iid", "local-steps": 5, "batch-size": 10,
         "lr": 0.05, "eval-batch-size": 2000, "min-available-nodes": 5,
         "virtual-clients": 5, "drift-diagnostics": False, "output-dir": str(out)}])
    assert result.status == "finished:completed", result.output[-4000:]
    rounds = read_rounds(next(out.iterdir()))
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2, 3]
    assert [r[C.LOG_CLIENTS_RECEIVED] for r in rounds[1:]] == [5, 5, 5]
    assert [r[C.LOG_CLIENT_STATE_ROUNDS] for r in rounds[1:]] == [[0] * 5, [1] * 5, [2] * 5]
    assert all(r[C.LOG_CLIENT_STATE_ATTACHED] == 0 for r in rounds[1:])
    assert rounds[-1][C.LOG_LOSS] < rounds[0][C.LOG_LOSS]

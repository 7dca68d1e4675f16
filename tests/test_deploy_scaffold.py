"""SCAFFOLD on Flower's deployment runtime, loopback: a real SuperLink, two real SuperNodes
and ``flwr run``. A deployed SuperNode starts a new ClientApp process for every message, so
c_i can only carry over in the SuperNode's Context.state: rounds 2 and 3 must start from
the c_i of rounds 1 and 2 without the server resending it, and each reply's state digest
must match the server's copy. Free ports, a private FLWR_HOME and work directory; every
process started is stopped by PID (and checked gone)."""

from __future__ import annotations

import pytest

from deploy.cluster import DeploySpec, LocalDeployment
from deploy.layout import Layout
from deploy.runner import run_on_connection
from fedapp.run_log import read_rounds
from simulation.runtime import descendants, is_alive
from strategies import contract as C

pytestmark = pytest.mark.usefixtures("deployment")


@pytest.mark.timeout(600)
def test_scaffold_keeps_c_i_in_context_state_on_real_supernodes(tmp_path):
    deployment = LocalDeployment(DeploySpec(num_supernodes=2), Layout(tmp_path / "deploy"),
                                 start_timeout=120)
    try:
        deployment.start()
        out = tmp_path / "runs"
        result = run_on_connection(
            deployment.spec.connection, deployment.cli_env,
            {"num-server-rounds": 3, "strategy": "scaffold", "dataset": "synthetic",
             "model": "mlp-2nn", "partition": "iid", "local-steps": 5, "batch-size": 10,
             "lr": 0.05, "momentum": 0.5, "eval-batch-size": 2000, "min-available-nodes": 2,
             "drift-diagnostics": False, "output-dir": str(out)},
            timeout=480, capture=True)
        assert result.status == "finished:completed", result.output[-4000:]
        rounds = read_rounds(next(out.iterdir()))
    finally:
        pids = [p for s in deployment.started for p in [s.proc.pid, *descendants(s.proc.pid)]]
        deployment.stop()
    assert not [pid for pid in pids if is_alive(pid)], "processes left running after stop()"
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2, 3]
    assert [r[C.LOG_CLIENT_STATE_ROUNDS] for r in rounds[1:]] == [[0, 0], [1, 1], [2, 2]]
    assert all(r[C.LOG_CLIENT_STATE_ATTACHED] == 0 and r[C.LOG_CLIENTS_RECEIVED] == 2
               and r[C.LOG_CLIENTS_FAILED] == 0 for r in rounds[1:])
    assert all(r[C.LOG_SCAFFOLD_C_NORM] > 0 for r in rounds[1:])
    assert rounds[-1][C.LOG_LOSS] < rounds[0][C.LOG_LOSS]

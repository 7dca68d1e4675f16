"""Flower's deployment runtime end to end, on loopback: real SuperLink + SuperNodes + ``flwr run``.

Free ports, a private FLWR_HOME and work directory in tmp_path, bounded waits; every
process a test starts is stopped by PID in the fixture's teardown (and checked gone).
"""

from __future__ import annotations

import json
import time

import pytest

from deploy.cluster import DeploySpec, LocalDeployment
from deploy.layout import Layout
from deploy.runner import run_on_connection
from fedapp.run_log import read_rounds
from simulation.runtime import descendants, is_alive
from strategies import contract as C

pytestmark = pytest.mark.usefixtures("deployment")

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # the nodes name it in their node config
TINY_RUN = {"num-server-rounds": 2, "local-steps": 5, "partition": "iid", "model": "cnn-small",
            "min-available-nodes": 2, "eval-batch-size": 2000}


@pytest.fixture
def deployments():
    """Deployments made by a test; stopped after it, and their processes checked gone."""
    made: list[LocalDeployment] = []

    def make(tmp_path, **spec) -> LocalDeployment:
        deployment = LocalDeployment(
            DeploySpec(**spec), Layout(tmp_path / "deploy"), start_timeout=120
        )
        made.append(deployment)
        return deployment

    yield make
    pids = []
    for deployment in made:
        pids += [p for s in deployment.started for p in [s.proc.pid, *descendants(s.proc.pid)]]
        deployment.stop()
    assert not [pid for pid in pids if is_alive(pid)], "processes left running after stop()"


def run_tiny(deployment: LocalDeployment, out, **overrides):
    result = run_on_connection(
        deployment.spec.connection,
        deployment.cli_env,
        {**TINY_RUN, "output-dir": str(out), **overrides},
        timeout=420,
        capture=True,
    )
    assert result.status == "finished:completed", result.output[-4000:]
    listed = json.loads(deployment.flwr("ls", deployment.spec.connection, "--format", "json"))
    assert [r["status"] for r in listed["runs"] if int(r["run-id"]) == result.run_id] == [
        "finished:completed"
    ]
    return result


@pytest.mark.timeout(540)
def test_insecure_two_supernodes_two_rounds_change_the_model(tmp_path, deployments):
    deployment = deployments(tmp_path, num_supernodes=2, data_dir=FASHION_MNIST).start()
    run_tiny(deployment, tmp_path / "runs")
    (run_dir,) = (tmp_path / "runs").iterdir()
    rounds = read_rounds(run_dir)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(r[C.LOG_CLIENTS_RECEIVED] == 2 and r[C.LOG_CLIENTS_FAILED] == 0 for r in rounds[1:])
    assert rounds[-1]["loss"] < rounds[0]["loss"]  # round 0 evaluates the initial model
    assert (run_dir / "final_model.pt").is_file()
    assert json.loads((run_dir / "partitions.json").read_text()).keys() == {"0", "1"}


@pytest.mark.timeout(600)
def test_tls_and_supernode_auth_refuse_a_stranger_and_run(tmp_path, deployments):
    """One TLS + node-auth deployment: a SuperNode whose key pair exists but was never
    registered is refused, and the registered one runs a round over HTTPS."""
    deployment = deployments(tmp_path, num_supernodes=2, tls=True, auth=True).start(supernodes=[0])
    stranger = deployment.start_supernode(1)
    deadline = time.monotonic() + 150  # a refused SuperNode exits in seconds on an idle machine
    while stranger.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stranger.proc.returncode not in (None, 0), stranger.log_tail()
    stranger_log = stranger.log_path.read_text(errors="replace")
    assert "Failed to activate SuperNode" in stranger_log
    assert "Traceback" not in stranger_log, stranger_log
    link_log = (deployment.layout.logs / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in link_log
    assert deployment.node_statuses() == ["online"]  # only the registered SuperNode 0
    # the synthetic data set keeps each ClientApp process (one per message) short
    run_tiny(deployment, tmp_path / "runs", **{"num-server-rounds": 1, "dataset": "synthetic",
                                               "model": "mlp-2nn", "min-available-nodes": 1})
    assert "https://" in (deployment.layout.logs / "superlink.log").read_text()
    assert deployment.node_statuses() == ["online"]

"""Who can reach what on a deployed SuperLink: real SuperLink, Fleet gateway and SuperNodes.

127.0.0.2 stands in for the SuperLink host's public interface and 127.0.0.1 for its
loopback (Linux routes all of 127/8 to lo). An outsider holds only ``ca.crt`` and reaches
the public address. Free ports, a private FLWR_HOME per party, bounded waits; every process
is stopped by PID and checked gone.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import sqlite3
import ssl
import subprocess

import pytest

from deploy.cluster import BIN, DeploySpec, LocalDeployment
from deploy.connection import write_connection
from deploy.layout import Layout
from deploy.runner import run_on_connection
from fedapp.partition_map import read_partition_map
from simulation.runtime import PROJECT_ROOT, descendants, flwr_env, is_alive
from simulation.runtime.flwr_cli import FLWR_COMMAND
from strategies.engine.node_identity import key_fingerprint

pytestmark = pytest.mark.usefixtures("deployment")

PUBLIC = "127.0.0.2"


def flwr(env, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """One ``flwr`` command as the outsider (or admin) whose FLWR_HOME is in ``env`` (Flower's
    CLI as ``flwr run`` is launched here: :mod:`simulation.runtime.flwr_command`)."""
    return subprocess.run([str(BIN / "python"), "-m", FLWR_COMMAND, *args], env=env,
                          cwd=PROJECT_ROOT, text=True,
                          capture_output=True, timeout=timeout, check=False)


def refused(proc: subprocess.CompletedProcess) -> bool:
    """The gateway's 403 reached the CLI and nothing succeeded."""
    out = proc.stdout + proc.stderr
    return "403 Forbidden" in out and '"success": true' not in out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """TLS + SuperNode auth, SuperNodes 0 and 1 on the public address (through the gateway);
    the keys and the partition map cover a third, started only by the node-identity test."""
    tmp = tmp_path_factory.mktemp("exposure")
    deployment = LocalDeployment(
        DeploySpec(num_supernodes=3, tls=True, auth=True, host=PUBLIC),
        Layout(tmp / "deploy"), start_timeout=120)
    try:
        deployment.start(supernodes=[0, 1])
        yield deployment, tmp
    finally:
        pids = [p for s in deployment.started for p in [s.proc.pid, *descendants(s.proc.pid)]]
        deployment.stop()
        assert not [pid for pid in pids if is_alive(pid)], "processes left after stop()"


@pytest.fixture(scope="module")
def outsider(cluster):
    """An FLWR_HOME holding only ca.crt, connections to the public and to the admin address,
    and a key pair of the outsider's own."""
    deployment, tmp = cluster
    home = tmp / "outsider"
    home.mkdir()
    ca = shutil.copy(deployment.layout.ca_cert, home / "ca.crt")
    write_connection(home, "public", deployment.address, ca)
    write_connection(home, "admin", deployment.admin_address, ca, make_default=False)
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f",
                    str(home / "outsider")], check=True, timeout=30)
    return flwr_env(home), home


def admin_json(deployment: LocalDeployment, *args: str) -> dict:
    return json.loads(deployment.flwr(*args, deployment.spec.connection, "--format", "json"))


@pytest.mark.timeout(300)
def test_the_superlink_itself_binds_loopback_only(cluster):
    deployment, _ = cluster
    assert deployment.gateway and deployment.admin_address.startswith("127.0.0.1:")
    with pytest.raises(OSError):  # the Control/Runtime port is not on the public address
        socket.create_connection((PUBLIC, deployment.admin_port), timeout=3).close()
    assert admin_json(deployment, "supernode", "list")["success"] is True


@pytest.mark.timeout(300)
def test_outsider_on_the_public_address_cannot_list_runs(outsider):
    env, _ = outsider
    proc = flwr(env, "ls", "public", "--format", "json")
    assert refused(proc), proc.stdout + proc.stderr


@pytest.mark.timeout(300)
def test_outsider_on_the_public_address_cannot_register_a_key(cluster, outsider):
    deployment, _ = cluster
    env, home = outsider
    proc = flwr(env, "supernode", "register", str(home / "outsider.pub"), "public")
    assert refused(proc), proc.stdout + proc.stderr
    assert len(admin_json(deployment, "supernode", "list")["nodes"]) == 2  # ours only


@pytest.mark.timeout(300)
def test_outsider_on_the_public_address_cannot_start_a_run(cluster, outsider):
    deployment, _ = cluster
    env, _ = outsider
    proc = flwr(env, "run", ".", "public", "--run-config", "num-server-rounds=1")
    assert refused(proc), proc.stdout + proc.stderr
    assert admin_json(deployment, "ls")["runs"] == []


@pytest.mark.timeout(120)
def test_runtime_api_and_docs_are_refused_on_the_public_address(cluster):
    deployment, _ = cluster
    ca_context = ssl.create_default_context(cafile=str(deployment.layout.ca_cert))
    host, port = deployment.address.rsplit(":", 1)
    for method, path in (("POST", "/v1/runtime/acquire-task"), ("POST", "/v1/control/start-run"),
                         ("GET", "/docs"), ("GET", "/openapi.json"),
                         ("POST", "/v1/fleet/../control/list-runs")):
        conn = http.client.HTTPSConnection(host, int(port), context=ca_context, timeout=30)
        try:
            conn.request(method, path, body=b"" if method == "POST" else None)
            reply = conn.getresponse()
            assert reply.status == 403, (path, reply.status, reply.read())
            assert b"serves Flower's Fleet API (SuperNodes) only" in reply.read()
        finally:
            conn.close()


@pytest.mark.timeout(300)
def test_flwr_1_42_control_api_on_loopback_has_no_user_authentication(cluster, outsider):
    """What the gateway cannot close: anyone on the SuperLink host who can read ca.crt lists
    runs through the loopback address (docs/deployment.md, "Threat model"). If Flower adds
    account authentication to its open-source build, this fails: then use it."""
    env, _ = outsider
    proc = flwr(env, "ls", "admin", "--format", "json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["success"] is True, proc.stderr


@pytest.mark.timeout(120)
def test_partition_map_holds_the_keys_flower_stores_for_the_nodes(cluster):
    """The ServerApp's ``grid.get_nodes()`` returns these ``node.public_key`` bytes (flwr's
    get_node_info reads the same column): each maps to the partition its SuperNode serves."""
    deployment, _ = cluster
    mapping = read_partition_map(str(deployment.layout.partition_map)).fingerprints
    with sqlite3.connect(deployment.database) as db:
        stored = [bytes(row[0]) for row in db.execute("SELECT public_key FROM node")]
    assert sorted(mapping.get(key_fingerprint(pem), -1) for pem in stored)[:2] == [0, 1]


@pytest.mark.timeout(540)
def test_stock_supernodes_train_through_the_gateway(cluster, tmp_path):
    deployment, _ = cluster
    result = run_on_connection(
        deployment.spec.connection, deployment.cli_env,
        {"num-server-rounds": 1, "local-steps": 5, "dataset": "synthetic", "model": "mlp-2nn",
         "min-available-nodes": 2, "output-dir": str(tmp_path / "runs")},
        timeout=420, capture=True)
    assert result.status == "finished:completed", result.output[-4000:]
    assert "ERROR" not in (deployment.layout.logs / "fleet-gateway.log").read_text()


@pytest.mark.timeout(540)
def test_a_registered_node_claiming_another_partition_is_refused(cluster, tmp_path):
    """SuperNode 2's key is registered (and mapped to partition 2), but its node config says
    partition-id=0, SuperNode 0's: with the partition map deploy run --auth passes, the
    ServerApp refuses it and trains with the other two."""
    deployment, _ = cluster
    deployment.register(deployment.layout.public_key(2))
    deployment.start_supernode(2, claimed_partition=0)
    try:
        deployment.wait_for_supernodes(3)
        result = run_on_connection(
            deployment.spec.connection, deployment.cli_env,
            {"num-server-rounds": 1, "local-steps": 5, "dataset": "synthetic", "model": "mlp-2nn",
             "min-available-nodes": 3, "output-dir": str(tmp_path / "runs"),
             "partition-map": str(deployment.layout.partition_map)},
            timeout=420, capture=True)
    finally:
        deployment.stop_supernode(2)
    assert result.status == "finished:completed", result.output[-4000:]
    assert ("refused: 'partition-id' = 0 is not its partition: its registered key may serve "
            "partition-id=2 only" in result.output), result.output[-4000:]
    assert "sampled 2 of 2 nodes" in result.output, result.output[-4000:]


@pytest.mark.timeout(300)
def test_without_tls_the_gateway_still_serves_the_fleet_api_only(tmp_path):
    """127.0.0.2 is loopback, so no --tls is needed; the plain-HTTP gateway refuses the same."""
    deployment = LocalDeployment(DeploySpec(num_supernodes=1, host=PUBLIC),
                                 Layout(tmp_path / "deploy"), start_timeout=120)
    try:
        deployment.start()  # returns once the SuperNode joined through the gateway
        home = tmp_path / "outsider"
        write_connection(home, "public", deployment.address)
        proc = flwr(flwr_env(home), "ls", "public", "--format", "json")
        assert refused(proc), proc.stdout + proc.stderr
        assert admin_json(deployment, "supernode", "list")["nodes"][0]["status"] == "online"
    finally:
        pids = [p for s in deployment.started for p in [s.proc.pid, *descendants(s.proc.pid)]]
        deployment.stop()
        assert not [pid for pid in pids if is_alive(pid)], "processes left after stop()"

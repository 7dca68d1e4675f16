"""``num-threads`` in the node config sets torch's intra-op threads inside the ClientApp."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from flwr.app import Context, RecordDict
from flwr.supercore.task_identity import TaskIdentity

import fedapp.client_app as client_app
from fedapp.config import ConfigError
from tests.messages import instruction

pytestmark = pytest.mark.usefixtures("deployment")


@pytest.fixture(autouse=True)
def task_identity():
    """Messages are built outside a running task (as the in-process Grids do)."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def context(**node) -> Context:
    return Context(run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 2,
                                                     **node},
                   state=RecordDict(), run_config={})


def test_num_threads_is_set_before_the_handler_works(monkeypatch):
    before = torch.get_num_threads()
    seen = []

    def spy(ctx):  # the data step runs after apply_threads: record torch's threads there
        seen.append(torch.get_num_threads())
        raise RuntimeError("stop here")

    monkeypatch.setattr(client_app, "local_data", spy)
    try:
        torch.set_num_threads(2)
        with pytest.raises(RuntimeError, match="stop here"):
            client_app.train(instruction(5), context(**{"num-threads": 1}))
        assert seen == [1] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_clientapp_call_trains_with_num_threads(monkeypatch, tmp_path):
    """Through ClientApp.__call__ (as Flower calls it) on a real train message."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType

    from task.models import build_model

    seen = []
    real = client_app.local_data

    def spy(ctx):
        seen.append(torch.get_num_threads())
        return real(ctx)

    monkeypatch.setattr(client_app, "local_data", spy)
    model = build_model("mlp-2nn", (1, 1, 60), 10)
    msg = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "config": ConfigRecord({"server-round": 1, "local-steps": 2})}),
                  dst_node_id=5, message_type=MessageType.TRAIN)
    ctx = context(**{"num-threads": 1, "data-cache-dir": str(tmp_path)})
    ctx.run_config.update({"dataset": "synthetic", "partition": "iid", "model": "mlp-2nn"})
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        reply = client_app.app(msg, ctx)
        assert not reply.has_error(), reply.error
        assert seen == [1]
    finally:
        torch.set_num_threads(before)


def test_no_key_leaves_torch_alone():
    before = torch.get_num_threads()
    client_app.apply_threads(context())
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("bad", [0, -2, "two", 1.5, True])
def test_a_bad_value_names_the_key_the_value_and_the_fix(bad):
    with pytest.raises(ConfigError) as err:
        client_app.apply_threads(context(**{"num-threads": bad}))
    text = str(err.value)
    assert "num-threads" in text and repr(bad) in text and "--node-config 'num-threads=1'" in text


def test_a_string_number_from_the_cli_is_accepted():
    assert client_app.num_threads(context(**{"num-threads": "3"})) == 3


def test_deploy_shares_the_cores_among_supernodes(monkeypatch, tmp_path):
    from deploy import cluster
    from deploy.layout import Layout

    assert cluster.threads_per_supernode(3, cpus=8) == 2
    assert cluster.threads_per_supernode(4, cpus=2) == 1
    started = []

    def start_process(name, argv, env, cwd, log):
        started.append((name, argv, env))
        return SimpleNamespace(name=name, proc=SimpleNamespace(pid=4242))

    monkeypatch.setattr(cluster, "start_process", start_process)
    deployment = cluster.LocalDeployment(cluster.DeploySpec(num_supernodes=2, num_threads=3),
                                         Layout(tmp_path))
    deployment.start_supernode(0)
    (node, argv, env), (superexec, exec_argv, _) = started
    assert "num-threads=3" in argv[argv.index("--node-config") + 1]
    assert env[cluster.TASK_POLL_ENV] == cluster.TASK_POLL_SECONDS
    # the SuperNode's ClientApps come from its warm SuperExec, which exits with it
    assert (node, superexec) == ("SuperNode 0", "SuperExec 0")
    assert argv[argv.index("--isolation") + 1] == "process"
    assert exec_argv[exec_argv.index("--parent-pid") + 1] == "4242"
    with pytest.raises(ValueError, match="--num-threads"):
        cluster.DeploySpec(num_threads=-1)
    for port in (-5, 70000):  # refused before a SuperLink is started on it
        with pytest.raises(ValueError, match=rf"port={port} \(--port\): give a TCP port"):
            cluster.DeploySpec(port=port)
    assert cluster.DeploySpec(port=0).port == 0 and cluster.DeploySpec(port=9092).port == 9092

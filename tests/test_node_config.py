"""The ClientApp's node-config folders (data-dir, data-cache-dir): a bad value is one error
naming the key, the value and the fix; a good one is used."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

import fedapp.client_app as client_app
from fedapp.config import ConfigError
from tests.test_data import write_tiny_fashion_mnist


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def context(**node) -> Context:
    return Context(run_id=1, node_id=5, state=RecordDict(),
                   node_config={"partition-id": 0, "num-partitions": 2, **node},
                   run_config={"partition": "iid", "allow-download": False})


def query(ctx: Context) -> Message:
    msg = Message(RecordDict({"config": ConfigRecord({"query": "client-info"})}), dst_node_id=5,
                  message_type=MessageType.QUERY)
    return client_app.app(msg, ctx)


@pytest.mark.parametrize("key, value, says", [
    ("data-dir", "/no/such/fedhetero/folder", "the node's data is missing"),
    ("data-dir", "relative/folder", "an absolute folder"),
    ("data-cache-dir", "cache", "an absolute folder"),
    ("data-cache-dir", 3, "an absolute folder"),
])
def test_a_bad_folder_names_the_key_the_value_and_the_fix(key, value, says):
    with pytest.raises(ConfigError) as err:
        client_app.node_partition(context(**{key: value}))
    text = str(err.value)
    assert f"{key}={value!r}" in text and says in text and "--node-config" in text
    with pytest.raises(ConfigError, match="--node-config"):  # Flower makes it an error reply
        query(context(**{key: value}))


def test_the_node_folders_are_used(tmp_path):
    write_tiny_fashion_mnist(tmp_path / "data", n_train=40)
    ctx = context(**{"data-dir": str(tmp_path / "data"), "data-cache-dir": str(tmp_path / "c")})
    part, _ = client_app.node_partition(ctx)
    assert part.source == str(tmp_path / "data") and len(part.y) == 20
    assert any((tmp_path / "c").iterdir())  # the node's cache folder holds the entries
    reply = query(ctx)
    assert not reply.has_error() and reply.content["metrics"]["num-examples"] == 20

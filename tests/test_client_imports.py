"""A deployed SuperNode starts a new ClientApp process for every message: that process
imports only what the message needs (a fresh interpreter per test, as Flower starts one)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.test_data import write_tiny_fashion_mnist

pytestmark = pytest.mark.usefixtures("processes")

TORCH = ("torch", "torchvision", "task.models", "task.train", "task.evaluate")

QUERY = """
import json, sys
from flwr.supercore.task_identity import TaskIdentity
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
import fedapp.client_app as client_app
msg = Message(RecordDict({"config": ConfigRecord({"query": "client-info"})}), dst_node_id=5,
              message_type=MessageType.QUERY)
context = Context(run_id=1, node_id=5, state=RecordDict(), node_config=json.loads(sys.argv[1]),
                  run_config={"partition": "dirichlet", "dirichlet-alpha": 0.5,
                              "min-partition-size": 1, "allow-download": False})
reply = client_app.app(msg, context)
print(json.dumps({"error": reply.error.reason if reply.has_error() else None,
                  "metrics": None if reply.has_error() else dict(reply.content["metrics"]),
                  "torch": [m for m in %r if m in sys.modules]}))
""" % (TORCH,)


def fresh_process(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return (out.stdout.strip().splitlines() or [""])[-1]


def test_importing_the_clientapp_loads_no_torch():
    code = ("import sys, fedapp.client_app; "
            f"print(','.join(m for m in {TORCH!r} if m in sys.modules))")
    assert fresh_process(code) == "", "imported at module level"


def test_a_query_on_a_cached_partition_loads_no_torch(tmp_path):
    write_tiny_fashion_mnist(tmp_path / "data", n_train=40)
    node = json.dumps({"partition-id": 1, "num-partitions": 2, "data-dir": str(tmp_path / "data"),
                       "data-cache-dir": str(tmp_path / "cache")})
    first = json.loads(fresh_process(QUERY, node))  # decodes and partitions, fills the cache
    second = json.loads(fresh_process(QUERY, node))  # maps the cache
    assert first["error"] is None and first["metrics"]["partition-id"] == 1
    assert second == {**first, "torch": []}
    assert sum(second["metrics"]["label-counts"]) == second["metrics"]["num-examples"] > 0

"""Node identity in process: a partition map binds each registered key to one partition, and
the ServerApp refuses a client-info claim the node's key does not allow (every strategy
that queries its clients). The Grid is the in-process one, whose ``get_nodes`` here returns
public keys as Flower's deployment Grid does."""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=no-name-in-module
from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes

from fedapp.client_app import app as client_app
from fedapp.config import ConfigError
from fedapp.partition_map import bind_partition_map, partition_map_text, read_partition_map
from fedapp.registry import Built
from fedapp.server_app import app as server_app
from strategies import FedAvg
from strategies.engine import trust_gate
from strategies.engine.node_identity import PartitionMap, key_fingerprint, parse_partition_map
from tests.inprocess import InProcessGrid
from tests.messages import instruction
from tests.reliability_common import config, warnings_of

REFUSED = "Client-info reply from node"


def pem() -> bytes:
    """A fresh public key as Flower stores it (PEM SubjectPublicKeyInfo)."""
    return public_key_to_bytes(generate_key_pairs()[1])


class KeyedGrid(InProcessGrid):
    """In-process nodes whose ``get_nodes`` carries a public key per node (b'': none)."""

    def __init__(self, num_nodes: int, run_config: dict, keys: list[bytes]) -> None:
        super().__init__(client_app, num_nodes, run_config)
        self.keys = dict(zip(self.node_ids, keys))

    def get_nodes(self):
        return [NodeInfo(node_id=n, public_key=self.keys.get(n, b"")) for n in self.node_ids]


@pytest.fixture(scope="module")
def keys():
    return [pem() for _ in range(4)]


def write_map(path, bound: dict[int, bytes]):
    path.write_text(partition_map_text(bound)[0])
    return str(path)


# ----------------------------------------------------------------- the file (hostile input)
def test_the_written_text_reads_back(keys, tmp_path):
    path = write_map(tmp_path / "partitions.json", {0: keys[0], 3: keys[1]})
    assert read_partition_map(path).fingerprints == {key_fingerprint(keys[0]): 0,
                                                     key_fingerprint(keys[1]): 3}
    with pytest.raises(ValueError, match="two partitions share one public key"):
        partition_map_text({0: keys[0], 1: keys[0]})


FP = "ab" * 32
HOSTILE = {
    "empty": ("", "not JSON"),
    "a list": ("[]", "exactly 'version' and 'partitions'"),
    "null": ("null", "exactly 'version' and 'partitions'"),
    "no partitions": ('{"version": 1}', "exactly 'version' and 'partitions'"),
    "an extra key": ('{"version": 1, "partitions": {}, "x": 1}', "exactly"),
    "version as text": ('{"version": "1", "partitions": {}}', "'version' is '1'"),
    "version true": ('{"version": true, "partitions": {}}', "'version' is True"),
    "version 2": ('{"version": 2, "partitions": {}}', "expected 1"),
    "partitions a list": ('{"version": 1, "partitions": []}', "'partitions' is a list"),
    "upper-case hex": (f'{{"version": 1, "partitions": {{"{FP.upper()}": 0}}}}',
                       "not a sha256 fingerprint"),
    "short key": ('{"version": 1, "partitions": {"abcd": 0}}', "not a sha256 fingerprint"),
    "negative": (f'{{"version": 1, "partitions": {{"{FP}": -1}}}}', "is -1"),
    "a float": (f'{{"version": 1, "partitions": {{"{FP}": 1.0}}}}', "is 1.0"),
    "a bool": (f'{{"version": 1, "partitions": {{"{FP}": true}}}}', "is True"),
    "huge": (f'{{"version": 1, "partitions": {{"{FP}": {2**24}}}}}', "0..16777215"),
    "a key twice": (f'{{"version": 1, "partitions": {{"{FP}": 0, "{FP}": 1}}}}',
                    "appears twice"),
    "deep nesting": ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
    "NaN": (f'{{"version": 1, "partitions": {{"{FP}": NaN}}}}', "is nan"),
}


@pytest.mark.parametrize("text, said", HOSTILE.values(), ids=HOSTILE)
def test_a_hostile_map_is_refused_saying_why(text, said):
    with pytest.raises(ValueError) as caught:
        parse_partition_map(text)
    assert said in str(caught.value)


@pytest.mark.parametrize("content", [None, "dir", b"\xff\xfe{}", '{"version": 1}',
                                     '{"version": 1, "partitions": {}}'])
def test_an_unusable_map_file_is_a_config_error_naming_key_path_and_fix(tmp_path, content):
    path = tmp_path / "partitions.json"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        read_partition_map(str(path))
    message = str(caught.value)
    assert f"partition-map='{path}'" in message
    assert "python -m deploy run --auth" in message and "partition-map=''" in message


def test_a_map_file_larger_than_the_cap_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr("fedapp.partition_map.MAX_BYTES", 100)
    path = tmp_path / "partitions.json"
    path.write_text(" " * 101)
    with pytest.raises(ConfigError, match="larger than"):
        read_partition_map(str(path))


# ----------------------------------------------------------------- the claim
def test_a_node_may_claim_only_its_keys_partition(keys):
    bound = PartitionMap({key_fingerprint(keys[0]): 0, key_fingerprint(keys[1]): 1},
                         source="partition-map=/p.json")
    nodes = [NodeInfo(node_id=10, public_key=keys[0]), NodeInfo(node_id=11, public_key=keys[1]),
             NodeInfo(node_id=12, public_key=keys[2]),
             NodeInfo(node_id=13, public_key=b"\x01" * 32),  # the simulation engine's kind
             NodeInfo(node_id=14)]  # Flower's base Grid.get_nodes: no key
    partitions = bound.node_partitions(nodes)
    assert partitions[10] == 0 and partitions[11] == 1
    assert bound.claim_problem(10, 0, partitions) is None
    assert bound.claim_problem(10, 1, partitions) == (
        "is not its partition: its registered key may serve partition-id=0 only "
        "(partition-map=/p.json)")
    assert bound.claim_problem(10, None, partitions).startswith("reports no partition-id")
    assert "is not in partition-map=/p.json" in bound.claim_problem(12, 2, partitions)
    for keyless in (13, 14, 99):
        assert "may serve no partition" in bound.claim_problem(keyless, 0, partitions)


# ----------------------------------------------------------------- the ServerApp
def serve(strategy: str, tmp_path, keys, partition_map: str, **overrides) -> KeyedGrid:
    """One round on 4 nodes (partitions 0..3); nodes 0 and 1 hold keys bound to their own
    partitions, node 2's key is bound to partition 5, node 3's key is in no map."""
    rc = config(strategy, tmp_path / "runs", **{"num-server-rounds": 1,
                                                "min-available-nodes": 4,
                                                "partition-map": partition_map, **overrides})
    grid = KeyedGrid(4, rc, keys)
    server_app(grid, Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                             run_config=dict(rc)))
    return grid


def trained(grid: KeyedGrid) -> set[int]:
    """The partition ids of the nodes sent a train message."""
    return {grid.contexts[n].node_config["partition-id"] for n, kind in grid.calls
            if kind == "train"}


@pytest.mark.parametrize("strategy", ["fedavg", "dynamicfl", "fedbuff"])
@pytest.mark.usefixtures("processes")
def test_the_serverapp_refuses_a_claim_the_nodes_key_does_not_allow(strategy, tmp_path, keys,
                                                                    caplog):
    path = write_map(tmp_path / "partitions.json", {0: keys[0], 1: keys[1], 5: keys[2]})
    caplog.set_level(logging.WARNING)
    grid = serve(strategy, tmp_path, keys, path)
    assert trained(grid) == {0, 1}  # the refused nodes are never selected
    refused = [w for w in warnings_of(caplog) if w.startswith(REFUSED)]
    node2, node3 = grid.node_ids[2], grid.node_ids[3]
    assert refused == [
        f"{REFUSED} {node2} refused: 'partition-id' = 2 is not its partition: its registered "
        f"key may serve partition-id=5 only (partition-map={path}); the node is treated as one "
        f"that did not answer. Start that SuperNode with --node-config \"partition-id=5\", or "
        f"give it the key registered for the partition it claims",
        f"{REFUSED} {node3} refused: 'partition-id' = 3 is not its partition: its key (sha256 "
        f"{key_fingerprint(keys[3])[:16]}...) is not in partition-map={path}, so it may serve "
        f"no partition; the node is treated as one that did not answer. Register the "
        f"SuperNode's key with `flwr supernode register` and add its sha256 to "
        f"partition-map={path} (deploy run --auth writes keys/partitions.json)"]
    assert list((tmp_path / "runs").glob("*/final_model.pt"))  # the run completed


@pytest.mark.usefixtures("processes")
def test_without_a_partition_map_no_claim_is_checked(tmp_path, keys, caplog):
    caplog.set_level(logging.WARNING)
    grid = serve("fedavg", tmp_path, keys, "")
    assert trained(grid) == {0, 1, 2, 3}
    assert not [w for w in warnings_of(caplog) if w.startswith(REFUSED)]


def test_a_node_that_joins_later_is_checked_with_the_keys_read_then(tmp_path, keys, caplog):
    """get_nodes() is read at each client-info query: a node registered and connected after
    the first query is bound by its own key."""
    path = write_map(tmp_path / "partitions.json", {i: keys[i] for i in range(3)})
    rc = {"dataset": "synthetic", "partition": "iid", "partition-map": path}
    grid = KeyedGrid(3, rc, keys)
    late = grid.node_ids.pop()
    strategy = FedAvg(query_client_info=True, min_available_nodes=2)
    bind_partition_map(Built(strategy, {}), path)
    caplog.set_level(logging.WARNING)
    assert strategy.participation.connected(grid) == sorted(grid.node_ids)
    grid.node_ids.append(late)
    assert strategy.participation.connected(grid) == sorted(grid.node_ids)
    assert strategy.participation.info(late).partition_id == 2
    assert not warnings_of(caplog)


@pytest.mark.usefixtures("processes")
def test_a_strategy_without_the_query_cannot_take_a_map(tmp_path, keys):
    path = write_map(tmp_path / "partitions.json", {0: keys[0]})
    with pytest.raises(ConfigError, match="partition-map=.*needs a strategy that asks its "
                                          "clients for their partition id"):
        bind_partition_map(Built(FedAvg(query_client_info=False), {}), path)
    assert bind_partition_map(Built(FedAvg(query_client_info=True), {}), "") is None


def test_an_evaluate_reply_of_a_refused_node_is_refused(caplog):
    reply = Message(RecordDict({"metrics": MetricRecord({"num-examples": 5, "accuracy": 1.0})}),
                    reply_to=instruction(7))
    from strategies.engine.records import ClientInfo  # noqa: PLC0415

    caplog.set_level(logging.WARNING)
    assert trust_gate.aggregate_evaluate([reply], {7: ClientInfo(refused=True, unbound=True)}) \
        is None
    assert any("does not allow the partition it claimed" in w for w in warnings_of(caplog))
    assert trust_gate.aggregate_evaluate([reply], {7: ClientInfo()})["accuracy"] == 1.0


def test_the_map_json_is_what_deploy_writes(keys):
    text, mapping = partition_map_text({0: keys[0], 1: keys[1]})
    assert json.loads(text) == {"version": 1, "partitions": mapping}

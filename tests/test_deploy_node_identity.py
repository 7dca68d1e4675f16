"""The partition map deploy writes for registered SuperNode keys, and the claim check."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from flwr.cli.supernode.register import try_load_public_key

from deploy.layout import Layout, ensure_keys
from deploy.node_identity import (allowed_partitions, key_fingerprint, partition_claim_problem,
                                  read_partition_map, write_partition_map)


@dataclass
class Node:  # the two fields of Flower's NodeInfo that the check reads
    node_id: int
    public_key: bytes


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    layout = Layout(tmp_path_factory.mktemp("identity"))
    ensure_keys(layout, 3)
    return layout


def test_map_keys_are_the_pem_flwr_registers(keys):
    mapping = write_partition_map(keys.partition_map, {i: keys.public_key(i) for i in range(3)})
    assert read_partition_map(keys.partition_map) == mapping
    for i in range(3):  # what `flwr supernode register` stores, and grid.get_nodes() returns
        assert mapping[key_fingerprint(try_load_public_key(keys.public_key(i)))] == i


def test_a_reply_may_claim_only_its_keys_partition(keys):
    mapping = write_partition_map(keys.partition_map, {i: keys.public_key(i) for i in range(3)})
    nodes = [Node(100 + i, try_load_public_key(keys.public_key(i))) for i in range(3)]
    stranger = Node(999, b"-----BEGIN PUBLIC KEY-----\nnot registered\n-----END PUBLIC KEY-----\n")
    allowed = allowed_partitions([*nodes, stranger], mapping)
    assert allowed == {100: 0, 101: 1, 102: 2}
    assert partition_claim_problem(101, 1, allowed) is None
    assert partition_claim_problem(101, 0, allowed) == (
        "node 101 claims partition-id=0, but its registered key may serve partition-id=1 only")
    assert "not in the partition map" in partition_claim_problem(999, 0, allowed)


def test_one_key_for_two_partitions_is_refused(keys, tmp_path):
    with pytest.raises(ValueError, match="share one public key"):
        write_partition_map(tmp_path / "p.json", {0: keys.public_key(0), 1: keys.public_key(0)})


@pytest.mark.parametrize("text", ["", "{}", '{"version": 2, "partitions": {}}',
                                  '{"version": 1, "partitions": {"ab": "x"}}'])
def test_a_bad_map_file_is_named_with_the_fix(tmp_path, text):
    path = tmp_path / "partitions.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="partitions.json cannot be used .*write_partition_map"):
        read_partition_map(path)

"""The partition map deploy writes for registered SuperNode keys, and ``deploy run --auth``
passing it to the ServerApp (run-config ``partition-map``)."""

from __future__ import annotations

import argparse

import pytest
from flwr.cli.supernode.register import try_load_public_key

from deploy.layout import Layout, ensure_keys
from deploy.node_identity import write_partition_map
from deploy.run import add_arguments, spec_of
from fedapp.partition_map import read_partition_map
from strategies.engine.node_identity import key_fingerprint


@pytest.fixture(scope="module")
def keys(processes, tmp_path_factory):
    layout = Layout(tmp_path_factory.mktemp("identity"))
    ensure_keys(layout, 3)
    return layout


def test_map_keys_are_the_pem_flwr_registers(keys):
    mapping = write_partition_map(keys.partition_map, {i: keys.public_key(i) for i in range(3)})
    assert read_partition_map(str(keys.partition_map)).fingerprints == mapping
    for i in range(3):  # what `flwr supernode register` stores, and grid.get_nodes() returns
        assert mapping[key_fingerprint(try_load_public_key(keys.public_key(i)))] == i


def test_one_key_for_two_partitions_is_refused(keys, tmp_path):
    with pytest.raises(ValueError, match="share one public key"):
        write_partition_map(tmp_path / "p.json", {0: keys.public_key(0), 1: keys.public_key(0)})


def options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_deploy_run_with_auth_binds_node_identities_by_default(tmp_path):
    _, overrides = spec_of(options("--tls", "--auth", "--workdir", str(tmp_path)))
    assert overrides["partition-map"] == str(tmp_path.resolve() / "keys" / "partitions.json")
    _, overrides = spec_of(options("--tls", "--auth", "--workdir", str(tmp_path),
                                   "-c", 'partition-map=""', "-c", "strategy=fedadam"))
    assert overrides["partition-map"] == ""  # opted out: Flower's own strategies need it
    _, overrides = spec_of(options("--workdir", str(tmp_path)))
    assert "partition-map" not in overrides  # without --auth nodes have throw-away keys


def test_deploy_run_with_auth_and_a_flower_strategy_says_how_to_opt_out(tmp_path):
    with pytest.raises(ValueError, match="partition-map=.*strategy='fedadam'.*sends no "
                                         "client-info query.*partition-map=''"):
        spec_of(options("--tls", "--auth", "--workdir", str(tmp_path), "-c", "strategy=fedadam"))

"""Run-config ``partition-map``: the file binding each registered SuperNode key to the
partition it may serve, read once by the ServerApp and handed to the participation model
(:mod:`strategies.engine.node_identity`; ``deploy run --auth`` writes and passes it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from strategies.engine.node_identity import PartitionMap, key_fingerprint, map_text, parse_partition_map

from .config import ConfigError, flwr_run_fix

KEY = "partition-map"
MAX_BYTES = 64 << 20  # 64 MiB: ~600,000 keys; a larger file is not a partition map


def partition_map_text(public_keys: Mapping[int, bytes]) -> tuple[str, dict[str, int]]:
    """The text of a partition-map file binding each key ({partition id: the PEM Flower
    stores at ``flwr supernode register``}) to its partition, and the map itself
    ({sha256: partition id}); ValueError when two partitions share one key."""
    mapping = {key_fingerprint(pem): pid for pid, pem in sorted(public_keys.items())}
    if len(mapping) != len(public_keys):
        raise ValueError(f"two partitions share one public key (partitions "
                         f"{sorted(public_keys)}): give every SuperNode its own key pair")
    return map_text(mapping), mapping


def _refusal(path: str, why: str) -> ConfigError:
    return ConfigError(
        f"run config: {KEY}={path!r}: {why}. Write it again with deploy "
        f"(`python -m deploy run --auth` makes keys/partitions.json; "
        f"deploy.node_identity.write_partition_map), or turn the check off with "
        f"{flwr_run_fix({KEY: ''})}")


def read_partition_map(path: str) -> PartitionMap:
    """The map in file ``path``; a ConfigError naming the key, the path, what is wrong and
    the fix when it is missing, unreadable, too large or not exactly a partition map
    (:func:`strategies.engine.node_identity.parse_partition_map`: the file may be hostile)."""
    file = Path(path)
    try:
        with file.open("rb") as stream:
            raw = stream.read(MAX_BYTES + 1)
    except OSError as err:
        raise _refusal(path, f"the file cannot be read ({err.strerror or err})") from None
    if len(raw) > MAX_BYTES:
        raise _refusal(path, f"the file is larger than {MAX_BYTES >> 20} MiB")
    try:
        fingerprints = parse_partition_map(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _refusal(path, "the file is not UTF-8 text") from None
    except ValueError as err:
        raise _refusal(path, f"not a partition map: {err}") from None
    if not fingerprints:
        raise _refusal(path, "it binds no key (every node would be refused)")
    return PartitionMap(fingerprints, source=f"{KEY}={path}")


def bind_partition_map(built, path: str) -> PartitionMap | None:
    """Give the built strategy's participation model (:class:`fedapp.registry.Built`) the
    map in ``path`` ('': none, nothing changes): from then on each node's claimed partition
    is checked against its registered key at every client-info query. ConfigError for a
    strategy without the client-info query (Flower's own classes) or a map that does not
    read (:func:`read_partition_map`)."""
    if not path:
        return None
    participation, strategy = built.participation, built.strategy
    if participation is None or not participation.query_client_info:
        raise ConfigError(
            f"run config: {KEY}={path!r} needs a strategy that asks its clients for their "
            f"partition id (the client-info query); {type(strategy).__name__} does not. "
            f"Use a fedhetero strategy (fedavg, fedprox, ..., fedbuff, fedasync), or "
            f"{flwr_run_fix({KEY: ''})}")
    participation.partition_map = read_partition_map(path)
    return participation.partition_map

"""The partition map ``deploy run --auth`` writes: {sha256 of each registered SuperNode key:
the partition that SuperNode serves}, next to the keys (keys/partitions.json).

``deploy run --auth`` passes it to the ServerApp as run-config ``partition-map``, which then
refuses a node whose registered key may not serve the partition it claims
(:mod:`strategies.engine.node_identity` has the check and why Flower's ``grid.get_nodes()`` can be
trusted with it; :mod:`fedapp.partition_map` writes and reads the file's text).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedapp import partition_map_text  # the app's public entry point


def pem_of_openssh_key(public_key_file: Path) -> bytes:
    """The PEM bytes Flower stores for ``flwr supernode register <public_key_file>``
    (Flower's own loader: ``flwr/cli/supernode/register.py``, ``try_load_public_key``)."""
    from flwr.cli.supernode.register import try_load_public_key

    return try_load_public_key(Path(public_key_file))


def write_partition_map(path: Path, public_keys: Mapping[int, Path]) -> dict[str, int]:
    """Write {fingerprint: partition id} for ``public_keys`` ({partition id: .pub file});
    the map written. ValueError when two partitions share one key."""
    try:
        text, mapping = partition_map_text(
            {pid: pem_of_openssh_key(pub) for pid, pub in public_keys.items()})
    except ValueError as err:
        raise ValueError(f"{err} (deploy/make_keys.sh; {dict(public_keys)})") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return mapping

"""Which partition each registered SuperNode key may serve, and the check of a claim.

Flower 1.42 ties a SuperNode's node id to its registered public key: with
``--enable-supernode-auth`` every Fleet call is signed with the key and its node id must be
the one registered for that key (``flwr/superlink/routers/fleet/node_auth.py``,
``authenticate_node``), and a reply is stored only when its ``src_node_id`` is the node
the instruction went to (``flwr/server/superlink/linkstate/sql_linkstate.py``,
``store_message``). The ServerApp sees each node's key: ``grid.get_nodes()`` returns
``NodeInfo`` with ``public_key`` (the PEM Flower stored at ``flwr supernode register``;
``flwr/superlink/grid/http_grid.py``, ``HttpGrid.get_nodes`` ->
``flwr/superlink/servicer/runtime/runtime_handlers.py``, ``get_nodes``).

So ``deploy`` writes a map {sha256 of the key (DER): partition id} next to the keys, and
:func:`partition_claim_problem` tells the server whether a reply's claimed partition is the
one its sender's key may serve. The check side needs the standard library only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

MAP_VERSION = 1


class NodeKey(Protocol):
    """What :func:`allowed_partitions` reads of Flower's ``NodeInfo``."""

    node_id: int
    public_key: bytes


def key_fingerprint(pem: bytes) -> str:
    """sha256 (hex) of a public key as Flower stores it (PEM SubjectPublicKeyInfo), taken
    over its DER bytes so that line breaks do not matter; ValueError if it is not PEM."""
    lines = pem.decode("ascii", errors="replace").strip().splitlines()
    if len(lines) < 3 or not lines[0].startswith("-----BEGIN ") or not lines[-1].startswith(
            "-----END "):
        raise ValueError("not a PEM public key (expected -----BEGIN PUBLIC KEY----- ...)")
    try:
        der = base64.b64decode("".join(lines[1:-1]), validate=True)
    except binascii.Error as err:
        raise ValueError(f"not a PEM public key ({err})") from err
    return hashlib.sha256(der).hexdigest()


def pem_of_openssh_key(public_key_file: Path) -> bytes:
    """The PEM bytes Flower stores for ``flwr supernode register <public_key_file>``
    (Flower's own loader: ``flwr/cli/supernode/register.py``, ``try_load_public_key``)."""
    from flwr.cli.supernode.register import try_load_public_key

    return try_load_public_key(Path(public_key_file))


def write_partition_map(path: Path, public_keys: Mapping[int, Path]) -> dict[str, int]:
    """Write {fingerprint: partition id} for ``public_keys`` ({partition id: .pub file});
    the map written."""
    mapping = {key_fingerprint(pem_of_openssh_key(pub)): pid
               for pid, pub in sorted(public_keys.items())}
    if len(mapping) != len(public_keys):
        raise ValueError(f"two partitions share one public key in {dict(public_keys)}: give "
                         "every SuperNode its own key pair (deploy/make_keys.sh)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": MAP_VERSION, "partitions": mapping}, indent=1))
    tmp.replace(path)
    return mapping


def read_partition_map(path: Path) -> dict[str, int]:
    """{fingerprint: partition id} from a file :func:`write_partition_map` wrote."""
    try:
        data = json.loads(Path(path).read_text())
        if data.get("version") != MAP_VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {MAP_VERSION}")
        mapping = {str(k): int(v) for k, v in data["partitions"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"partition map {path} cannot be used ({err}); write it again with "
                         "deploy.node_identity.write_partition_map (deploy run --auth does)"
                         ) from err
    return mapping


def allowed_partitions(nodes: Iterable[NodeKey], mapping: Mapping[str, int]) -> dict[int, int]:
    """{node id: the partition it may serve} for the nodes whose key is in ``mapping``
    (``nodes``: ``grid.get_nodes()``)."""
    allowed = {}
    for node in nodes:
        try:
            fingerprint = key_fingerprint(node.public_key)
        except ValueError:  # no key (a node without authentication): allowed nothing
            continue
        if fingerprint in mapping:
            allowed[node.node_id] = mapping[fingerprint]
    return allowed


def partition_claim_problem(node_id: int, claimed: int,
                            allowed: Mapping[int, int]) -> str | None:
    """Why node ``node_id`` may not claim partition ``claimed`` (None: it may)."""
    if node_id not in allowed:
        return (f"node {node_id} claims partition-id={claimed}, but its key is not in the "
                "partition map (register it with deploy, or add it to the map)")
    if allowed[node_id] != claimed:
        return (f"node {node_id} claims partition-id={claimed}, but its registered key may "
                f"serve partition-id={allowed[node_id]} only")
    return None

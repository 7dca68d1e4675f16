"""Node identity: which partition each connected node's registered public key may serve.

Flower 1.42 ties a SuperNode's node id to its registered public key: with
``--enable-supernode-auth`` every Fleet call is signed with the key and its node id must be
the one registered for that key (``flwr/superlink/routers/fleet/node_auth.py``,
``authenticate_node``), and a reply is stored only when its ``src_node_id`` is the node the
instruction went to (``flwr/server/superlink/linkstate/sql_linkstate.py``,
``store_message``). The ServerApp sees each node's key: ``grid.get_nodes()`` returns
``NodeInfo`` with ``public_key``, the PEM Flower stored at ``flwr supernode register``
(``HttpGrid.get_nodes`` -> the Runtime API's ``get_nodes``). The simulation engine's
``InMemoryGrid`` returns 32 random bytes per virtual node instead (no authentication), and
Flower's base ``Grid.get_nodes`` (an in-process test Grid) ``NodeInfo`` without a key.

A partition map binds each registered key (sha256 of its DER bytes) to the one partition it
may serve. :class:`PartitionMap` answers, at each client-info query, which partition each
connected node may claim; :func:`strategies.engine.records.enter_clients` refuses a claim its key
does not allow. ``deploy`` writes the map (``deploy run --auth``: keys/partitions.json), the
ServerApp reads it (run-config ``partition-map``). The standard library only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Protocol

MAP_VERSION = 1
"""The ``version`` of the map file: ``{"version": 1, "partitions": {sha256 hex: partition}}``."""

MAX_PARTITION = (1 << 24) - 1
"""The largest partition id a map may bind (the trust gate's ``MAX_PARTITION_ID``)."""

FINGERPRINT = re.compile(r"[0-9a-f]{64}")
"""A key's fingerprint in the map: 64 lower-case hex digits (sha256)."""


class NodeKey(Protocol):
    """What :meth:`PartitionMap.node_partitions` reads of Flower's ``NodeInfo``."""

    node_id: int
    public_key: bytes


def key_fingerprint(pem: bytes) -> str:
    """sha256 (hex) of a public key as Flower stores it (PEM SubjectPublicKeyInfo), taken
    over its DER bytes so that line breaks do not matter; ValueError if it is not PEM."""
    lines = bytes(pem).decode("ascii", errors="replace").strip().splitlines()
    if len(lines) < 3 or not lines[0].startswith("-----BEGIN ") or not lines[-1].startswith(
            "-----END "):
        raise ValueError("not a PEM public key (expected -----BEGIN PUBLIC KEY----- ...)")
    try:
        der = base64.b64decode("".join(lines[1:-1]), validate=True)
    except binascii.Error as err:
        raise ValueError(f"not a PEM public key ({err})") from err
    return hashlib.sha256(der).hexdigest()


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"the key {twice[0][:80]!r} appears twice")
    return dict(pairs)


def parse_partition_map(text: str) -> dict[str, int]:
    """{fingerprint: partition id} of a map file's text; ValueError saying what is wrong.

    Accepted is exactly a JSON object ``{"version": 1, "partitions": {...}}`` whose
    ``partitions`` maps 64 lower-case hex digits (a key's sha256) to an integer partition id
    in 0..:data:`MAX_PARTITION`; no key twice, nothing else (the file may be hostile).
    """
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise ValueError("it nests too deeply to be a partition map") from None
    except ValueError as err:  # json.JSONDecodeError, or a duplicate key
        raise ValueError(f"it is not JSON a partition map can be ({err})") from None
    if not isinstance(data, dict) or set(data) != {"version", "partitions"}:
        got = sorted(data)[:5] if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"expected a JSON object with exactly 'version' and 'partitions', "
                         f"got {got}")
    if type(data["version"]) is not int or data["version"] != MAP_VERSION:
        raise ValueError(f"'version' is {data['version']!r:.40}, expected {MAP_VERSION}")
    partitions = data["partitions"]
    if not isinstance(partitions, dict):
        raise ValueError(f"'partitions' is a {type(partitions).__name__}, expected an object "
                         f"{{sha256 hex: partition id}}")
    for key, value in partitions.items():
        if not FINGERPRINT.fullmatch(key):
            raise ValueError(f"key {key[:80]!r} is not a sha256 fingerprint (64 lower-case hex "
                             f"digits)")
        if type(value) is not int or not 0 <= value <= MAX_PARTITION:
            raise ValueError(f"partition of key {key[:12]}... is {value!r:.40}, expected an "
                             f"integer in 0..{MAX_PARTITION}")
    return dict(partitions)


def map_text(mapping: Mapping[str, int]) -> str:
    """The file text of ``mapping`` ({fingerprint: partition id})."""
    return json.dumps({"version": MAP_VERSION, "partitions": dict(mapping)}, indent=1)


class PartitionMap:
    """{key fingerprint: the partition it may serve}, and the check of a node's claim.

    ``source`` names where the map came from (the run-config key and file), for messages.
    """

    def __init__(self, fingerprints: Mapping[str, int], source: str = "the partition map"
                 ) -> None:
        self.fingerprints = dict(fingerprints)
        self.source = source

    def node_partitions(self, nodes: Iterable[NodeKey]) -> dict[int, int | str]:
        """{node id: the partition its key may serve, or (a str) why it may serve none} for
        ``nodes`` (``grid.get_nodes()``)."""
        partitions: dict[int, int | str] = {}
        for node in nodes:
            try:
                fingerprint = key_fingerprint(node.public_key)
            except (ValueError, TypeError):
                partitions[int(node.node_id)] = (
                    "it has no public key Flower authenticated (a SuperLink without "
                    "--enable-supernode-auth, or the simulation engine's nodes)")
                continue
            partitions[int(node.node_id)] = self.fingerprints.get(
                fingerprint, f"its key (sha256 {fingerprint[:16]}...) is not in {self.source}")
        return partitions

    def claim_problem(self, node: int, claimed: int | None,
                      partitions: Mapping[int, int | str]) -> str | None:
        """Why ``node`` may not claim partition ``claimed`` (None: no claim), given
        :meth:`node_partitions`; None when it may."""
        allowed = partitions.get(node, "Flower's grid.get_nodes() does not list it")
        if allowed == claimed:
            return None
        said = "reports no partition-id" if claimed is None else "is not its partition"
        if isinstance(allowed, str):
            return f"{said}: {allowed}, so it may serve no partition"
        return f"{said}: its registered key may serve partition-id={allowed} only ({self.source})"

    def fix(self, node: int, partitions: Mapping[int, int | str]) -> str:
        """What makes ``node`` acceptable (the end of its WARNING)."""
        allowed = partitions.get(node)
        if isinstance(allowed, int):
            return (f"start that SuperNode with --node-config \"partition-id={allowed}\", or "
                    f"give it the key registered for the partition it claims")
        return (f"register the SuperNode's key with `flwr supernode register` and add its "
                f"sha256 to {self.source} (deploy run --auth writes keys/partitions.json)")

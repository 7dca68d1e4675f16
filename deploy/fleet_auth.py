"""Flower 1.42's SuperNode signature on a Fleet HTTP call, checked from its headers alone
(what the SuperLink's ``NodeAuthMiddleware`` checks of every Fleet call, with or without
``--enable-supernode-auth``, after it has read the body): :func:`auth_problem`, and the
authorised public keys (:class:`AuthorizedKeys`) of ``deploy run --auth``. Only the
timestamp is signed, not the body. ``cryptography`` (Flower's own dependency) verifies."""

from __future__ import annotations

import base64
import binascii
import datetime
import logging
import threading
import time
from collections.abc import Iterable
from email.message import Message
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

LOG = logging.getLogger("fleet_gateway")

# Flower 1.42's SuperNode authentication on Fleet HTTP calls: the SuperNode sends
# (flwr/supernode/node_auth_http_interceptor.py, NodeAuthHttpInterceptor.intercept)
PUBLIC_KEY_HEADER = "flwr-public-key"  # base64 of its PEM public key (flwr/supercore/constant.py)
SIGNATURE_HEADER = "flwr-signature"  # base64 of ECDSA-SHA256(timestamp) (same file)
TIMESTAMP_HEADER = "flwr-timestamp"  # datetime.now(UTC).isoformat() (flwr/common/constant.py)
# the SuperLink accepts -SYSTEM_TIME_TOLERANCE < age < TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE
# seconds (flwr/superlink/routers/fleet/node_auth.py, authenticate_node; flwr/common/constant.py)
MIN_AGE_S = -5.0
MAX_AGE_S = 300.0 + 5.0


def ec_public_key(data: bytes, pem_only: bool = False) -> ec.EllipticCurvePublicKey:
    """The elliptic-curve public key in ``data``: PEM (what a SuperNode's header holds) or,
    unless ``pem_only``, an OpenSSH ``.pub`` line; ValueError when it is neither."""
    try:
        if pem_only or data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_ssh_public_key(data.strip())
    except UnsupportedAlgorithm as err:
        raise ValueError(f"unsupported key type ({err})") from err
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError(f"not an elliptic-curve key ({type(key).__name__})")
    return key


def der_of(key: ec.EllipticCurvePublicKey) -> bytes:
    """``key`` as DER SubjectPublicKeyInfo: one spelling for keys read from either format."""
    return key.public_bytes(serialization.Encoding.DER,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


class AuthorizedKeys:
    """The public keys SuperNodes may sign with: ``*.pub`` files, or folders of them (as
    ``deploy/make_keys.sh`` writes); read again, at most once a second, when a key is not
    among them (a key made after the gateway started)."""

    RELOAD_SECONDS = 1.0

    def __init__(self, paths: Iterable[str | Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self._lock = threading.Lock()
        self._keys = self._load()
        self._loaded_at = time.monotonic()
        if not self._keys:
            raise ValueError(f"no public keys (*.pub) in {', '.join(map(str, self.paths))}")

    def _files(self) -> list[Path]:
        files: list[Path] = []
        for path in self.paths:
            files += sorted(path.glob("*.pub")) if path.is_dir() else [path]
        return files

    def _load(self, warn: bool = True) -> frozenset[bytes]:
        keys = set()
        for file in self._files():
            try:
                keys.add(der_of(ec_public_key(file.read_bytes())))
            except (OSError, ValueError) as err:
                if warn:  # once, at start: a reload may come every second
                    LOG.warning("skipped %s: not a readable EC public key (%s)", file, err)
        return frozenset(keys)

    def __contains__(self, der: object) -> bool:
        if der in self._keys:
            return True
        with self._lock:
            if time.monotonic() - self._loaded_at >= self.RELOAD_SECONDS:
                self._keys = self._load(warn=False)
                self._loaded_at = time.monotonic()
        return der in self._keys

    def __len__(self) -> int:
        return len(self._keys)


def auth_problem(headers: Message, authorized: AuthorizedKeys | None,
                 now: datetime.datetime | None = None) -> str | None:
    """Why the Fleet call's SuperNode signature is refused (None: it is accepted), from its
    headers alone, as the SuperLink checks it (``authenticate_node``, module constants), plus
    ``authorized`` (None: any key, as Flower without ``--enable-supernode-auth``)."""
    values = {}
    for name in (PUBLIC_KEY_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER):
        found = headers.get_all(name) or []
        if len(found) != 1:
            return f"send one {name} header (got {len(found)})"
        values[name] = found[0]
    try:
        timestamp = values[TIMESTAMP_HEADER]
        signed_at = datetime.datetime.fromisoformat(timestamp)
        age = ((now or datetime.datetime.now(datetime.UTC)) - signed_at).total_seconds()
        if not MIN_AGE_S < age < MAX_AGE_S:
            return f"{TIMESTAMP_HEADER} is {age:.0f} s old, outside ({MIN_AGE_S:g}, {MAX_AGE_S:g})"
        key_pem = base64.b64decode(values[PUBLIC_KEY_HEADER], validate=True)
        signature = base64.b64decode(values[SIGNATURE_HEADER], validate=True)
        key = ec_public_key(key_pem, pem_only=True)  # as flwr's bytes_to_public_key
        if authorized is not None and der_of(key) not in authorized:
            return "the public key is not one of the authorised SuperNode keys"
        key.verify(signature, timestamp.encode("ascii"), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return f"{SIGNATURE_HEADER} is not the key's signature of {TIMESTAMP_HEADER}"
    except (ValueError, TypeError, UnicodeError, binascii.Error) as err:
        return f"malformed SuperNode authentication headers ({type(err).__name__})"
    return None

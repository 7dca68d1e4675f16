"""The run log's per-round model digest (fedapp.run_log.model_sha256)."""

from __future__ import annotations

import hashlib

import numpy as np
from flwr.app import ArrayRecord

from fedapp.run_log import model_sha256
from tests.messages import record


def by_hand(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for key in sorted(arrays):
        digest.update(f"{key}|{arrays[key].dtype}|{arrays[key].shape}|".encode())
        digest.update(np.ascontiguousarray(arrays[key]).tobytes())
    return digest.hexdigest()


def test_digest_of_keys_dtypes_shapes_and_bytes():
    arrays = {"b.bias": np.arange(3, dtype=np.float32),
              "a.weight": np.ones((2, 3), np.float32),
              "n": np.array(7, np.int64)}
    assert model_sha256(record(arrays)) == by_hand(arrays)
    assert model_sha256(record(dict(reversed(arrays.items())))) == by_hand(arrays)  # key order


def test_one_flipped_bit_or_a_new_shape_changes_it():
    arrays = {"w": np.linspace(0, 1, 12, dtype=np.float32)}
    base = model_sha256(record(arrays))
    flipped = arrays["w"].copy()
    flipped.view(np.uint32)[5] ^= 1
    assert model_sha256(record({"w": flipped})) != base
    assert model_sha256(record({"w": arrays["w"].reshape(3, 4)})) != base
    assert model_sha256(ArrayRecord()) == hashlib.sha256().hexdigest()

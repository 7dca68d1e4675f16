"""Minibatch orders that depend only on a seed, shared by every local solver.

* :func:`client_seed` turns (run seed, round, partition id) into one 63-bit seed, so a
  client's batch order is reproducible and independent of every other client's;
* :func:`batch_indices` is the endless minibatch stream of McMahan et al.'s
  ClientUpdate (Alg. 1) as fedhetero runs it: minibatches of exactly B cut from fresh
  permutations, one per epoch (FedAvg, FedProx, FedNova, FedVeca);
* :func:`batch_stream` is DynamicFL's round stream (Le et al., Alg. 1): the same idea
  with numpy, materialised so that any chunk [s, s + k) of the round can be cut from it.

torch is imported inside the functions that need it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np


def client_seed(seed: int, server_round: int, partition_id: int) -> int:
    """A 63-bit seed for the (run seed, round, partition) batch stream."""
    state = np.random.SeedSequence([seed, server_round, partition_id]).generate_state(1, np.uint64)
    return int(state[0] >> 1)


def batch_indices(num_examples: int, batch_size: int, generator: Any) -> Iterator[Any]:
    """Endless stream of minibatches (torch int64 tensors) of exactly B indices.

    The minibatches are cut from a concatenation of fresh random permutations (one per
    epoch, ``torch.randperm(n, generator=generator)``), so E epochs are floor(E n / B)
    steps of B examples each and every example is used E times up to the last partial
    batch. ``batch_size`` 0 (or >= n) yields the full local batch (a fresh permutation of
    all n) every time.
    """
    import torch  # noqa: PLC0415  (lazy: strategies never needs torch at import)

    if batch_size <= 0 or batch_size >= num_examples:
        while True:
            yield torch.randperm(num_examples, generator=generator)
    buffer = torch.empty(0, dtype=torch.int64)
    while True:
        while len(buffer) < batch_size:
            buffer = torch.cat([buffer, torch.randperm(num_examples, generator=generator)])
        yield buffer[:batch_size]
        buffer = buffer[batch_size:]


@functools.lru_cache(maxsize=64)
def batch_stream(num_examples: int, batch_size: int, num_steps: int, seed: int) -> np.ndarray:
    """The (num_steps, B) minibatch indices of one client's DynamicFL round.

    Concatenated reshuffled passes over ``range(num_examples)`` (one ``rng.permutation``
    per pass, ``rng = default_rng(seed)``), cut into rows of B. The first k rows do not
    depend on ``num_steps``, so any chunk [s, s + k) can be cut from a stream of length
    >= s + k. ``batch_size`` 0 or >= n means full batch: every row is a fresh pass.
    Read-only (cached).
    """
    if num_examples <= 0 or num_steps < 0:
        raise ValueError(f"need num_examples > 0 and num_steps >= 0, "
                         f"got {num_examples}, {num_steps}")
    b = num_examples if batch_size <= 0 or batch_size >= num_examples else batch_size
    rng = np.random.default_rng(seed)
    need = num_steps * b
    passes = max(1, math.ceil(need / num_examples))
    perms = [rng.permutation(num_examples) for _ in range(passes)]
    stream = np.concatenate(perms)[:need].reshape(num_steps, b)
    stream.setflags(write=False)
    return stream

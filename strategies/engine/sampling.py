"""Pure sampling: who trains in a round, who straggles, and how much local work that is.

No Flower types. Clients are positions 0..K-1 in a fixed order (the strategies sort
nodes by the ``partition-id`` they report, so the order survives a restart); every
draw comes from ``numpy.random.default_rng`` seeded by ``(seed, server_round, ...)``,
so a round's sample depends on nothing but the seed, the round and K.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np


def num_to_sample(fraction: float, num_clients: int) -> int:
    """m = max(floor(C K), 1) clients per round (McMahan et al. 2017, Algorithm 1).

    A tolerance of 1e-9 keeps e.g. 0.29 * 100 = 28.999999999999996 at 29.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    return max(min(int(math.floor(fraction * num_clients + 1e-9)), num_clients), 1)


def sample_without_replacement(rng: np.random.Generator, num_clients: int, m: int) -> np.ndarray:
    """Positions of m distinct clients out of ``num_clients``, uniformly, sorted."""
    return np.sort(rng.choice(num_clients, size=m, replace=False))


def sample_with_replacement(
    rng: np.random.Generator, probabilities: Sequence[float], num_draws: int
) -> np.ndarray:
    """K draws with replacement, client k with probability p_k (Li et al. 2020, Scheme I).

    Returns the draw count of every client (length N, sums to ``num_draws``).
    """
    p = np.asarray(probabilities, dtype=np.float64)
    draws = rng.choice(len(p), size=num_draws, replace=True, p=p / p.sum())
    return np.bincount(draws, minlength=len(p))


def sample_round(
    seed: int, server_round: int, num_clients: int, fraction: float,
    probabilities: Sequence[float] | None = None, num_sampled: int | None = None,
) -> dict[int, int]:
    """Position -> number of draws of the clients that train in ``server_round``.

    m = :func:`num_to_sample` clients, drawn with ``default_rng([seed, server_round])``:
    without replacement and uniformly (McMahan et al. Algorithm 1; Li et al. Scheme II),
    or, given ``probabilities`` p_k, m draws with replacement (Li et al. Scheme I, where
    a client can be drawn more than once). ``num_sampled`` sets m instead (at most
    ``num_clients``; the simulated clock samples m = max(floor(C K), 1) of all K connected
    clients among the ones online).
    """
    m = num_to_sample(fraction, num_clients) if num_sampled is None else num_sampled
    if not 1 <= m <= num_clients:
        raise ValueError(f"num_sampled must be in 1..{num_clients}, got {m}")
    rng = np.random.default_rng([seed, server_round])
    if probabilities is not None:
        counts = sample_with_replacement(rng, probabilities, m)
        return {k: int(c) for k, c in enumerate(counts) if c > 0}
    return {int(k): 1 for k in sample_without_replacement(rng, num_clients, m)}


def choose_stragglers(rng: np.random.Generator, num_sampled: int, fraction: float) -> np.ndarray:
    """Boolean mask: floor(f m) of the m sampled clients straggle (Li et al. 2020, Sec. 5.2)."""
    count = min(int(math.floor(fraction * num_sampled + 1e-9)), num_sampled)
    mask = np.zeros(num_sampled, dtype=bool)
    mask[rng.choice(num_sampled, size=count, replace=False)] = True
    return mask


def straggler_steps(rng: np.random.Generator, full_steps: Sequence[int]) -> np.ndarray:
    """A straggler's local work: uniform in 1..full_i (FedProx's x ~ U[1, E], Sec. 5.2, here
    at step granularity so that E = 1 or 2 still gives variable work)."""
    full = np.maximum(np.asarray(full_steps, dtype=np.int64), 1)
    return rng.integers(1, full + 1)


def round_stragglers(
    seed: int, server_round: int, num_sampled: int, fraction: float,
    full_work: Callable[[list[int]], Sequence[int]],
) -> dict[int, int]:
    """Position (among the sampled) -> reduced local work of this round's stragglers.

    One ``default_rng([seed, server_round, 1])`` draws the stragglers
    (:func:`choose_stragglers`), then their work (:func:`straggler_steps`) below the full
    work ``full_work(positions)`` of each chosen client. Empty for ``fraction`` = 0.
    """
    if fraction <= 0:
        return {}
    rng = np.random.default_rng([seed, server_round, 1])
    mask = choose_stragglers(rng, num_sampled, fraction)
    chosen = [i for i in range(num_sampled) if mask[i]]
    full = list(full_work(chosen))
    return {i: int(s) for i, s in zip(chosen, straggler_steps(rng, full))}


def dataloader_steps(num_examples: int, batch_size: int, epochs: float, *,
                     drop_last: bool = False) -> int:
    """SGD steps of a stock PyTorch loop, ``for _ in range(E): for batch in DataLoader(...)``.

    Batches per epoch b = ceil(n_i / B) (``drop_last=False``, PyTorch's default) or
    floor(n_i / B) (``drop_last=True``); B = 0 means one full batch (b = 1). The loop runs
    tau_i = E b steps. A fractional E (not expressible in such a loop) gives
    floor(E b), E taken as the decimal it prints as. 0 when the loop takes no step
    (``drop_last`` with n_i < B, E b < 1, n_i = 0).
    """
    if num_examples <= 0 or epochs <= 0:
        return 0
    if batch_size <= 0:
        per_epoch = 1
    elif drop_last:
        per_epoch = num_examples // batch_size
    else:
        per_epoch = -(-num_examples // batch_size)
    if isinstance(epochs, int) or float(epochs).is_integer():
        return int(epochs) * per_epoch
    return math.floor(Fraction(repr(float(epochs))) * per_epoch)

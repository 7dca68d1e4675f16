"""Test oracle of DynaComm (Le et al., DynamicFL, Eq. 5): the exact minimiser by enumeration.

Not product code: :func:`strategies.algorithms.dynacomm.dynacomm` is checked against it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from strategies.algorithms.dynacomm import Selection, checked_inputs, pooled_kl

BRUTE_FORCE_MAX_CLIENTS = 20


def brute_force(
    counts: Sequence[Sequence[float]],
    q: Sequence[float],
    *,
    eligible: Sequence[bool] | None = None,
    k_max: int | None = None,
    min_size: int = 1,
    max_clients: int = BRUTE_FORCE_MAX_CLIENTS,
) -> Selection:
    """The exact minimiser of Eq. 5 by enumerating every subset of the eligible clients.

    2^n_eligible subsets, vectorised in blocks of 2^12; at most ``max_clients`` (20)
    eligible clients. Ties go to the subset with the smallest bit mask (lowest positions
    first in binary order).
    """
    arr, q_arr, ok, cap = checked_inputs(counts, q, eligible, k_max)
    idx = np.flatnonzero(ok)
    n_e = len(idx)
    if n_e > max_clients:
        raise ValueError(f"brute force over {n_e} eligible clients (2^{n_e} subsets) is too "
                         f"slow; the limit is {max_clients}: use dynacomm() instead")
    if n_e == 0 or cap < max(min_size, 1):
        return Selection((), math.inf)
    x = arr[idx]
    lo = min(n_e, 12)
    hi = n_e - lo
    low_bits = (np.arange(1 << lo)[:, None] >> np.arange(lo)) & 1
    low_sums = low_bits @ x[:lo]
    low_size = low_bits.sum(axis=1)
    with np.errstate(divide="ignore"):
        log_q = np.log(q_arr)
    best_kl, best_mask = math.inf, -1
    for h in range(1 << hi):
        high_bits = (h >> np.arange(hi)) & 1
        sums = low_sums + high_bits @ x[lo:]
        size = low_size + int(high_bits.sum())
        totals = sums.sum(axis=1)
        valid = (size >= max(min_size, 1)) & (size <= cap) & (totals > 0)
        if not valid.any():
            continue
        p = sums[valid] / totals[valid, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - log_q), 0.0)
        kls = terms.sum(axis=1)
        k = int(np.argmin(kls))
        if kls[k] < best_kl:
            best_kl = float(kls[k])
            best_mask = (h << lo) | int(np.flatnonzero(valid)[k])
    if best_mask < 0:
        return Selection((), math.inf)
    members = tuple(int(idx[b]) for b in range(n_e) if (best_mask >> b) & 1)
    # recompute exactly like dynacomm does, so the two solvers' KLs compare bit for bit
    return Selection(members, pooled_kl(arr, members, q_arr))

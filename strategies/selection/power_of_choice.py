"""Power-of-Choice selection (Cho, Wang and Joshi, "Towards Understanding Biased Client
Selection in Federated Learning", AISTATS 2022, Algorithm 1, pow-d).

Per round:

1. sample a candidate set A of d clients without replacement, client k with probability
   p_k = n_k / n (its fraction of the data);
2. send them the current global model and ask for their local loss F_k(w) (here: Flower
   ``evaluate`` messages, which stock ClientApps answer with their loss and num-examples;
   the messages and bytes are counted in the run log);
3. take the m clients of A with the largest loss.

d = 2m by default (``candidates=0``); the paper studies several d >= m (d = m is random
selection by data size). A candidate without a usable answer counts as having the lowest
loss (it is taken only if fewer than m answered); the policy says so once.

Averaging. The paper's server update (Sec. 2) averages the m selected clients' local
models with equal weights, w^(t+1) = (1/m) sum_{k in S(t)} w_k^(t+1): the data sizes
already entered through step 1's p_k = n_k / n, so weighting the average by n_k as well
would count them twice. ``weighting="uniform"`` (the default) is that plain mean;
``weighting="examples"`` (FedAvg's n_k / sum n_k over the chosen) is kept as an explicit
option. The round engine reads the policy's ``weighting`` through
:func:`strategies.selection.policy.selection_weighting`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import WARNING

import numpy as np
from flwr.common.logger import log

from .policy import SelectionSection, Candidate, Choice, LossQuery, Outcome

__all__ = ["POC_WEIGHTINGS", "PowerOfChoice", "candidate_set", "largest_losses"]

POC_TAG = 0x90C  # rng stream of the candidate draws
POC_WEIGHTINGS = ("uniform", "examples")  # the paper's plain mean first (the default)


def candidate_set(rng: np.random.Generator, sizes: Sequence[int | None], d: int) -> list[int]:
    """Step 1: positions of d clients drawn without replacement with p_k = n_k / n (uniform
    when a size is unknown), sorted."""
    d = min(d, len(sizes))
    if any(not s for s in sizes):
        p = np.full(len(sizes), 1.0 / len(sizes))
    else:
        n = np.asarray(sizes, dtype=np.float64)
        p = n / n.sum()
    return sorted(int(k) for k in rng.choice(len(sizes), size=d, replace=False, p=p))


def largest_losses(losses: Mapping[int, float | None], m: int) -> list[int]:
    """Step 3: the m positions with the largest loss (ties: lower position first); those
    without a loss last."""
    order = sorted(losses, key=lambda k: (losses[k] is None, -(losses[k] or 0.0), k))
    return order[:m]


class PowerOfChoice:
    """pow-d (module docstring).

    Parameters
    ----------
    seed : int
        Candidate draws from ``default_rng([seed, round, POC_TAG])``.
    candidates : int
        d, the candidate set's size (0: 2m); at least m is used.
    weighting : str
        How the engine averages the m chosen clients' models: ``"uniform"`` 1/m, the
        paper's update (Sec. 2; default), or ``"examples"`` n_k / sum n_k (FedAvg's, which
        counts the data sizes a second time after the candidate draw by p_k).
    """

    name = "power-of-choice"
    needs_clock = False
    queries_losses = True

    def __init__(self, seed: int = 0, candidates: int = 0, *,
                 weighting: str = "uniform") -> None:
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 0:
            raise ValueError(f"PowerOfChoice: candidates (d) must be a whole number >= 0 "
                             f"(0: 2m), got {candidates!r}")
        if weighting not in POC_WEIGHTINGS:
            raise ValueError(f"PowerOfChoice: weighting={weighting!r} is not known; use "
                             f"'uniform' (the paper's plain mean of the m chosen, the default) "
                             f"or 'examples' (n_k / sum n_k)")
        self.seed, self.d = int(seed), int(candidates)
        self.weighting = weighting
        self.warned = False

    def choose(self, server_round: int, candidates: Sequence[Candidate], m: int,
               query: LossQuery | None) -> Choice:
        """Steps 1-3; ``query`` asks the candidates for their loss."""
        if query is None:
            raise ValueError("PowerOfChoice needs a loss query (the participation model "
                             "passes one; call it through Participation)")
        d = max(self.d or 2 * m, m)
        rng = np.random.default_rng([self.seed, server_round, POC_TAG])
        pool = candidate_set(rng, [c.num_examples for c in candidates], d)
        answers = query(pool)
        losses = {k: answers.get(k) for k in pool}
        if any(v is None for v in losses.values()) and not self.warned:
            log(WARNING, "power-of-choice selection: some candidates gave no usable loss on "
                "the global model (an evaluate reply with 'eval-loss' or 'eval_loss'); they "
                "count as the lowest loss")
            self.warned = True
        chosen = largest_losses(losses, m)
        keys = [c.key for c in candidates]
        section = SelectionSection(
            policy=self.name, candidates=len(candidates), chosen=[keys[k] for k in chosen],
            losses={keys[k]: losses[k] for k in pool})
        return Choice({k: 1 for k in chosen}, section)

    def feedback(self, server_round: int, outcomes: Sequence[Outcome]) -> None:
        """Nothing to learn: the losses are asked afresh every round."""

    def state_dict(self) -> dict:
        """None: every draw comes from the seed and the round."""
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        """Nothing to restore."""

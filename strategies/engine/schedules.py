"""Per-round learning-rate schedules: lr_t for server round t = 1, 2, ... from lr_0.

Pure functions (stdlib only); the strategies call them through :class:`LRSchedule`.
The client's lr is constant within a round, so t counts server rounds, not SGD steps.

* ``constant``: lr_t = lr_0.
* ``exponential``: lr_t = lr_0 d^(t-1); McMahan et al. 2017 ("Communication-Efficient
  Learning of Deep Networks from Decentralized Data"), Sec. 3, CIFAR experiments,
  Fig. 4: FedAvg with a learning-rate decay of 0.99 per round (FedSGD 0.9934).
* ``inverse``: lr_t = lr_0 / (1 + a (t - 1)); the decaying step size eta_t = beta / (t + gamma)
  of Li et al. 2020 ("On the Convergence of FedAvg on Non-IID Data", ICLR 2020, Thm. 1),
  with beta = lr_0 / a and gamma = 1 / a - 1 (Li et al. count t in SGD steps).
* ``step``: lr_t = lr_0 d^floor((t-1) / k), d every k rounds.
* ``cosine``: lr_t = lr_min + (lr_0 - lr_min)(1 + cos(pi (t - 1) / T)) / 2, cosine
  annealing stepped once per round with T_max = T rounds (DynamicFL, Le et al., official
  code).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["SCHEDULES", "LRSchedule", "as_schedule", "constant_lr", "cosine_lr",
           "exponential_lr", "inverse_lr", "round_lr", "step_lr"]

SCHEDULES = ("constant", "exponential", "inverse", "step", "cosine")
DECAYING = ("exponential", "step")  # d must be in (0, 1]

Schedule = Callable[[int, float], float]
"""A schedule: (server_round t >= 1, lr_0) -> lr_t."""


def _t(server_round: int) -> int:
    return max(int(server_round), 1)


def constant_lr(server_round: int, lr0: float) -> float:
    """lr_t = lr_0."""
    return float(lr0)


def exponential_lr(server_round: int, lr0: float, decay: float) -> float:
    """lr_t = lr_0 d^(t-1) (McMahan et al. 2017, Sec. 3, Fig. 4: d = 0.99 per round)."""
    return lr0 * decay ** (_t(server_round) - 1)


def inverse_lr(server_round: int, lr0: float, decay: float) -> float:
    """lr_t = lr_0 / (1 + a (t - 1)) = beta / (t + gamma), beta = lr_0 / a, gamma = 1 / a - 1
    (Li et al. 2020, "On the Convergence of FedAvg on Non-IID Data", Thm. 1's eta_t)."""
    return lr0 / (1 + decay * (_t(server_round) - 1))


def step_lr(server_round: int, lr0: float, decay: float, every: int) -> float:
    """lr_t = lr_0 d^floor((t-1) / k): multiplied by d after every k rounds."""
    return lr0 * decay ** ((_t(server_round) - 1) // every)


def cosine_lr(server_round: int, num_rounds: int, lr0: float, lr_min: float = 1e-4) -> float:
    """eta_t = eta_min + (eta_0 - eta_min)(1 + cos(pi (t - 1) / T)) / 2, constant within a round
    (DynamicFL's official code: cosine annealing stepped once per round, T_max = T)."""
    t = _t(server_round)
    return lr_min + (lr0 - lr_min) * (1 + math.cos(math.pi * (t - 1) / max(num_rounds, 1))) / 2


@dataclass(frozen=True)
class LRSchedule:
    """A named schedule with its parameters; ``schedule(t, lr_0)`` is lr_t.

    Parameters
    ----------
    name : str
        One of :data:`SCHEDULES` (module docstring).
    decay : float
        d of ``exponential`` / ``step`` (in (0, 1]; 0.99 is McMahan et al.'s per-round
        decay), a of ``inverse`` (> 0).
    step_every : int
        k of ``step``: rounds between two decays (>= 1).
    lr_min : float
        lr_min of ``cosine`` (>= 0).
    num_rounds : int, optional
        T of ``cosine``, the run's number of rounds. DynamicFL fills it in from ``start``;
        FedAvg's ``configure_train`` does not know T, so it needs it here.

    Every parameter is checked whichever schedule reads it, so a bad value is an error
    even where it is not used.
    """

    name: str = "constant"
    decay: float = 0.99
    step_every: int = 10
    lr_min: float = 1e-4
    num_rounds: int | None = None

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ValueError(f"lr_schedule={self.name!r} is not known; use one of "
                             f"{', '.join(SCHEDULES)}")
        if not (math.isfinite(self.decay) and self.decay > 0):
            raise ValueError(f"decay must be a finite number > 0, got {self.decay!r}")
        if self.name in DECAYING and self.decay > 1:
            raise ValueError(f"decay must be in (0, 1] for the {self.name!r} schedule (lr_t "
                             f"would grow), got {self.decay!r}")
        if isinstance(self.step_every, bool) or int(self.step_every) != self.step_every \
                or self.step_every < 1:
            raise ValueError(f"step_every must be an integer >= 1, got {self.step_every!r}")
        if not (math.isfinite(self.lr_min) and self.lr_min >= 0):
            raise ValueError(f"lr_min must be a finite number >= 0, got {self.lr_min!r}")
        if self.num_rounds is not None and self.num_rounds < 1:
            raise ValueError(f"num_rounds must be >= 1, got {self.num_rounds!r}")

    def __call__(self, server_round: int, lr0: float) -> float:
        """lr_t of round ``server_round`` (1-based) from lr_0."""
        if self.name == "exponential":
            return exponential_lr(server_round, lr0, self.decay)
        if self.name == "inverse":
            return inverse_lr(server_round, lr0, self.decay)
        if self.name == "step":
            return step_lr(server_round, lr0, self.decay, int(self.step_every))
        if self.name == "cosine":
            if self.num_rounds is None:
                raise ValueError("the 'cosine' schedule needs num_rounds (T)")
            return cosine_lr(server_round, self.num_rounds, lr0, self.lr_min)
        return constant_lr(server_round, lr0)


def as_schedule(value: LRSchedule | Schedule | str | None) -> Schedule | None:
    """A strategy's ``lr_schedule`` argument as a schedule: None (send the train config's
    ``lr`` as it is), a name of :data:`SCHEDULES` (its default parameters), an
    :class:`LRSchedule` or any callable ``(server_round, lr_0) -> lr_t``."""
    if value is None or isinstance(value, LRSchedule):
        return value
    if isinstance(value, str):
        return LRSchedule(value)
    if not callable(value):
        raise ValueError(f"lr_schedule must be None, a name ({', '.join(SCHEDULES)}), an "
                         f"LRSchedule or a callable (server_round, lr0) -> lr; got {value!r}")
    return value


def round_lr(schedule: Schedule, server_round: int, lr0: float) -> float:
    """lr_t = ``schedule(server_round, lr0)``, checked to be a finite number > 0."""
    lr = float(schedule(server_round, lr0))
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr schedule {schedule!r} gave lr={lr!r} for round {server_round} "
                         f"(lr_0 = {lr0!r}); it must be a finite number > 0")
    return lr

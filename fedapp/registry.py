"""Strategy registry: run-config ``strategy`` name -> (strategy, train config).

Later strategies plug in by adding an entry to ``STRATEGIES``.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.serverapp.strategy import Strategy

from strategies import FedAvg
from strategies import contract as C

from .config import ConfigError, RunConfig


def train_config(cfg: RunConfig) -> dict[str, int | float | bool | str]:
    """The ConfigRecord every train message carries (strategies may add to it)."""
    return {
        C.LR: cfg.lr,
        C.LOCAL_EPOCHS: cfg.local_epochs,
        C.LOCAL_STEPS: cfg.local_steps,
        C.BATCH_SIZE: 0 if cfg.full_batch else cfg.batch_size,
        C.MOMENTUM: cfg.momentum,
        C.WEIGHT_DECAY: cfg.weight_decay,
        C.SEED: cfg.seed,
    }


def _fedavg(cfg: RunConfig) -> tuple[Strategy, dict]:
    strategy = FedAvg(
        fraction_train=cfg.fraction_train,
        fraction_evaluate=cfg.fraction_evaluate,
        weighting=cfg.weighting,
        server_lr=cfg.server_lr,
        seed=cfg.seed,
        min_available_nodes=cfg.min_available_nodes,
    )
    return strategy, train_config(cfg)


def _fedsgd(cfg: RunConfig) -> tuple[Strategy, dict]:
    """FedSGD preset (McMahan et al. Sec. 2): E = 1, B = full local batch."""
    strategy, config = _fedavg(cfg)
    config.update({C.LOCAL_EPOCHS: 1, C.LOCAL_STEPS: 0, C.BATCH_SIZE: 0})
    return strategy, config


STRATEGIES: dict[str, Callable[[RunConfig], tuple[Strategy, dict]]] = {
    "fedavg": _fedavg,
    "fedsgd": _fedsgd,
}


def build_strategy(cfg: RunConfig) -> tuple[Strategy, dict]:
    """The strategy named by ``cfg.strategy`` and its train ConfigRecord contents."""
    if cfg.strategy not in STRATEGIES:
        raise ConfigError(
            f"run config: strategy={cfg.strategy!r} is not allowed; it must be one of "
            f"{', '.join(STRATEGIES)}. Set it with: flwr run . --run-config \"strategy='fedavg'\""
        )
    return STRATEGIES[cfg.strategy](cfg)

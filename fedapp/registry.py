"""Strategy registry: run-config ``strategy`` name -> (strategy, train config).

Later strategies plug in by adding an entry to ``STRATEGIES``.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.serverapp.strategy import Strategy

from strategies import DynamicFL, FedAvg, FedNova, FedProx, FedVeca
from strategies import contract as C

from .config import ConfigError, RunConfig


def train_config(cfg: RunConfig) -> dict[str, int | float | bool | str]:
    """The ConfigRecord every train message carries (strategies may add to it)."""
    return {
        C.LR: cfg.lr,
        C.LOCAL_EPOCHS: int(cfg.local_epochs) if float(cfg.local_epochs).is_integer() else cfg.local_epochs,
        C.LOCAL_STEPS: cfg.local_steps,
        C.BATCH_SIZE: 0 if cfg.full_batch else cfg.batch_size,
        C.MOMENTUM: cfg.momentum,
        C.WEIGHT_DECAY: cfg.weight_decay,
        C.SEED: cfg.seed,
    }


def _common(cfg: RunConfig, default_policy: str) -> dict:
    """Constructor arguments every strategy of the FedAvg family takes."""
    policy = default_policy if cfg.straggler_policy == "auto" else cfg.straggler_policy
    return {
        "fraction_train": cfg.fraction_train,
        "fraction_evaluate": cfg.fraction_evaluate,
        "seed": cfg.seed,
        "min_available_nodes": cfg.min_available_nodes,
        "straggler_fraction": cfg.straggler_fraction,
        "straggler_policy": policy,
        "straggler_unit": cfg.straggler_unit,
        "drift_diagnostics": cfg.drift_diagnostics,
    }


def _fedavg(cfg: RunConfig) -> tuple[Strategy, dict]:
    strategy = FedAvg(weighting=cfg.weighting, server_lr=cfg.server_lr, **_common(cfg, "drop"))
    return strategy, train_config(cfg)


def _fedsgd(cfg: RunConfig) -> tuple[Strategy, dict]:
    """FedSGD preset (McMahan et al. Sec. 2): E = 1, B = full local batch."""
    strategy, config = _fedavg(cfg)
    config.update({C.LOCAL_EPOCHS: 1, C.LOCAL_STEPS: 0, C.BATCH_SIZE: 0})
    return strategy, config


def _fedprox(cfg: RunConfig) -> tuple[Strategy, dict]:
    strategy = FedProx(proximal_mu=cfg.proximal_mu, weighting=cfg.weighting, server_lr=cfg.server_lr,
                       **_common(cfg, "partial"))
    return strategy, train_config(cfg)


def _fednova(cfg: RunConfig) -> tuple[Strategy, dict]:
    if cfg.weighting != "examples":
        raise ConfigError(f"run config: weighting={cfg.weighting!r} is not allowed with strategy='fednova'; "
                          "FedNova weights clients by num-examples. Set --run-config \"weighting='examples'\"")
    strategy = FedNova(server_momentum=cfg.server_momentum, local_epochs=train_config(cfg)[C.LOCAL_EPOCHS],
                       server_lr=cfg.server_lr,
                       batch_size=0 if cfg.full_batch else cfg.batch_size, **_common(cfg, "partial"))
    return strategy, train_config(cfg)


def _fedveca(cfg: RunConfig) -> tuple[Strategy, dict]:
    """FedVeca (Luo et al.): per-client adaptive local steps, FedNova's eq. (5), plain local SGD."""
    neutral = {"momentum": (cfg.momentum, 0.0), "weight-decay": (cfg.weight_decay, 0.0),
               "server-momentum": (cfg.server_momentum, 0.0), "server-lr": (cfg.server_lr, 1.0),
               "straggler-fraction": (cfg.straggler_fraction, 0.0), "weighting": (cfg.weighting, "examples")}
    for key, (value, wanted) in neutral.items():
        if value != wanted:
            raise ConfigError(f"run config: {key}={value!r} is not allowed with strategy='fedveca' (plain local "
                              f"SGD, eq. 5, and FedVeca sets every client's local steps itself). Set "
                              f"--run-config \"{key}={wanted!r}\"")
    strategy = FedVeca(tau_init=cfg.fedveca_tau_init, tau_max=cfg.fedveca_tau_max, alpha=cfg.fedveca_alpha,
                       beta_mode=cfg.fedveca_beta_mode, grad_subsample=cfg.fedveca_grad_subsample, lr=cfg.lr,
                       **_common(cfg, "partial"))
    return strategy, train_config(cfg)


def _dynamicfl(cfg: RunConfig, intervals: str | None = None) -> tuple[Strategy, dict]:
    """DynamicFL (Le et al.): DynaComm's high group syncs often, the rest rarely; L steps per round."""
    name = cfg.strategy
    neutral = {"straggler-fraction": (cfg.straggler_fraction, 0.0), "weighting": (cfg.weighting, "examples"),
               "server-lr": (cfg.server_lr, 1.0), "server-momentum": (cfg.server_momentum, 0.0)}
    for key, (value, wanted) in neutral.items():
        if value != wanted:
            raise ConfigError(f"run config: {key}={value!r} is not allowed with strategy={name!r} (every active "
                              f"client does exactly L local steps and each sync event sets W to the "
                              f"num-examples-weighted average). Set --run-config \"{key}={wanted!r}\"")
    strategy = DynamicFL(
        intervals=intervals or cfg.dynamicfl_intervals, local_steps=cfg.dynamicfl_local_steps,
        budget_mode=cfg.dynamicfl_budget_mode, beta=cfg.dynamicfl_beta,
        server_budget=cfg.dynamicfl_server_budget or None, n_ens=cfg.dynamicfl_n_ens,
        x_star_mode=cfg.dynamicfl_x_star_mode, fraction_train=cfg.fraction_train,
        fraction_evaluate=cfg.fraction_evaluate, seed=cfg.seed, min_available_nodes=cfg.min_available_nodes,
        drift_diagnostics=cfg.drift_diagnostics)
    return strategy, train_config(cfg)


def _dynamicsgd(cfg: RunConfig) -> tuple[Strategy, dict]:
    """DynamicSGD preset: every active client syncs after every local step (dynamicfl-intervals='a')."""
    return _dynamicfl(cfg, intervals="a")


STRATEGIES: dict[str, Callable[[RunConfig], tuple[Strategy, dict]]] = {
    "fedavg": _fedavg,
    "fedsgd": _fedsgd,
    "fedprox": _fedprox,
    "fednova": _fednova,
    "fedveca": _fedveca,
    "dynamicfl": _dynamicfl,
    "dynamicsgd": _dynamicsgd,
}


def build_strategy(cfg: RunConfig) -> tuple[Strategy, dict]:
    """The strategy named by ``cfg.strategy`` and its train ConfigRecord contents."""
    if cfg.strategy not in STRATEGIES:
        raise ConfigError(
            f"run config: strategy={cfg.strategy!r} is not allowed; it must be one of "
            f"{', '.join(STRATEGIES)}. Set it with: flwr run . --run-config \"strategy='fedavg'\""
        )
    return STRATEGIES[cfg.strategy](cfg)

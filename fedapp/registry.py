"""The one strategy-name and compatibility table: run-config ``strategy`` -> strategy.

A strategy's own parameters are checked by its constructor (library users need the
same rules); :func:`build_strategy` turns the constructor's ``ValueError`` into a
:class:`~fedapp.config.ConfigError` that names the run-config key, its value and the
``--run-config`` that fixes it. :data:`NEUTRAL_ONLY` holds the app's own rules: keys a
strategy's run path never reads, so any value but the neutral one would be ignored.
Later strategies plug in by adding an entry to :data:`STRATEGIES`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from flwr.common.logger import FLOWER_LOGGER
from flwr.serverapp.strategy import Strategy

from strategies import DynamicFL, FedAvg, FedNova, FedProx, FedVeca
from strategies import contract as C
from strategies.clock import SimClock
from strategies.devices import FLEETS, GeneratedFleet, load_trace
from strategies.schedules import LRSchedule

from .config import ConfigError, RunConfig, default, flwr_run_fix

Builder = Callable[[RunConfig], tuple[Strategy, dict]]


def train_config(cfg: RunConfig) -> dict[str, int | float | bool | str]:
    """The ConfigRecord every train message carries (strategies may add to it)."""
    epochs = cfg.local_epochs
    return {
        C.LR: cfg.lr,
        C.LOCAL_EPOCHS: int(epochs) if float(epochs).is_integer() else epochs,
        C.LOCAL_STEPS: cfg.local_steps,
        C.BATCH_SIZE: 0 if cfg.full_batch else cfg.batch_size,
        C.MOMENTUM: cfg.momentum,
        C.WEIGHT_DECAY: cfg.weight_decay,
        C.SEED: cfg.seed,
    }


def lr_schedule(cfg: RunConfig) -> LRSchedule:
    """``lr-schedule`` and its parameters (``lr-decay``, ``lr-step-every``, ``lr-min``; T =
    ``num-server-rounds``); checked by :class:`~strategies.schedules.LRSchedule`."""
    return LRSchedule(cfg.lr_schedule, decay=cfg.lr_decay, step_every=cfg.lr_step_every,
                      lr_min=cfg.lr_min, num_rounds=cfg.num_server_rounds)


def device_clock(cfg: RunConfig) -> SimClock | None:
    """The simulated clock of ``device-profiles`` (None for ``none``), not yet calibrated
    (the ServerApp gives it the model's cost). The generator's keys are checked whatever
    ``device-profiles`` says; a trace must be an absolute .csv / .json path."""
    kind = cfg.device_profiles
    generated = GeneratedFleet(
        kind if kind in FLEETS else "homogeneous", seed=cfg.seed,
        downlink_mbps=cfg.device_downlink_mbps, uplink_mbps=cfg.device_uplink_mbps,
        sigma=cfg.device_sigma, rich_fraction=cfg.device_rich_fraction,
        poor_factor=cfg.device_poor_factor, availability=cfg.device_availability)
    if kind == "none":
        return None
    if kind in FLEETS:
        return SimClock(generated)
    if not Path(kind).is_absolute():
        raise ValueError(f"device profiles {kind!r}: use none, {', '.join(FLEETS)}, or the "
                         f"absolute path of a .csv / .json device trace")
    return SimClock(load_trace(kind))


def _common(cfg: RunConfig) -> dict:
    """Constructor arguments of the FedAvg family; straggler-policy 'auto' = the class default.

    fedhetero's ClientApp answers the client-info query, so it is always on here.
    """
    kwargs = {
        "query_client_info": True,
        "fraction_train": cfg.fraction_train,
        "fraction_evaluate": cfg.fraction_evaluate,
        "seed": cfg.seed,
        "min_available_nodes": cfg.min_available_nodes,
        "straggler_fraction": cfg.straggler_fraction,
        "straggler_unit": cfg.straggler_unit,
        "drift_diagnostics": cfg.drift_diagnostics,
        "weighting": cfg.weighting,
        "server_lr": cfg.server_lr,
        "lr_schedule": lr_schedule(cfg),
        "clock": device_clock(cfg),
        "round_deadline": cfg.round_deadline or None,
    }
    if cfg.straggler_policy != "auto":
        kwargs["straggler_policy"] = cfg.straggler_policy
    return kwargs


def _fedavg(cfg: RunConfig) -> tuple[Strategy, dict]:
    return FedAvg(**_common(cfg)), train_config(cfg)


def _fedsgd(cfg: RunConfig) -> tuple[Strategy, dict]:
    """FedSGD preset (McMahan et al. Sec. 2): E = 1, B = full local batch."""
    strategy, config = _fedavg(cfg)
    config.update({C.LOCAL_EPOCHS: 1, C.LOCAL_STEPS: 0, C.BATCH_SIZE: 0})
    return strategy, config


def _fedprox(cfg: RunConfig) -> tuple[Strategy, dict]:
    return FedProx(proximal_mu=cfg.proximal_mu, **_common(cfg)), train_config(cfg)


def _fednova_args(cfg: RunConfig) -> dict:
    config = train_config(cfg)
    return {"server_momentum": cfg.server_momentum, "local_epochs": config[C.LOCAL_EPOCHS],
            "batch_size": config[C.BATCH_SIZE], **_common(cfg)}


def _fednova(cfg: RunConfig) -> tuple[Strategy, dict]:
    return FedNova(**_fednova_args(cfg)), train_config(cfg)


def _fedveca(cfg: RunConfig) -> tuple[Strategy, dict]:
    """FedVeca (Luo et al.): per-client adaptive local steps, FedNova's eq. (5)."""
    strategy = FedVeca(tau_init=cfg.fedveca_tau_init, tau_max=cfg.fedveca_tau_max,
                       alpha=cfg.fedveca_alpha, beta_mode=cfg.fedveca_beta_mode,
                       grad_subsample=cfg.fedveca_grad_subsample, lr=cfg.lr,
                       **{k: v for k, v in _fednova_args(cfg).items()
                          if k not in ("local_epochs", "batch_size")})
    return strategy, train_config(cfg)


def _dynamicfl(cfg: RunConfig, intervals: str | None = None) -> tuple[Strategy, dict]:
    """DynamicFL (Le et al.): DynaComm's high group syncs often, the rest rarely."""
    strategy = DynamicFL(
        intervals=intervals or cfg.dynamicfl_intervals, local_steps=cfg.dynamicfl_local_steps,
        budget_mode=cfg.dynamicfl_budget_mode, beta=cfg.dynamicfl_beta,
        server_budget=cfg.dynamicfl_server_budget or None, n_ens=cfg.dynamicfl_n_ens,
        x_star_mode=cfg.dynamicfl_x_star_mode, fraction_train=cfg.fraction_train,
        fraction_evaluate=cfg.fraction_evaluate, seed=cfg.seed,
        min_available_nodes=cfg.min_available_nodes, drift_diagnostics=cfg.drift_diagnostics,
        lr_schedule=lr_schedule(cfg), query_client_info=True, clock=device_clock(cfg),
        budget_seconds=cfg.dynamicfl_budget_seconds)
    return strategy, train_config(cfg)


def _dynamicsgd(cfg: RunConfig) -> tuple[Strategy, dict]:
    """DynamicSGD preset: every active client syncs after every local step (intervals 'a')."""
    return _dynamicfl(cfg, intervals="a")


STRATEGIES: dict[str, Builder] = {
    "fedavg": _fedavg,
    "fedsgd": _fedsgd,
    "fedprox": _fedprox,
    "fednova": _fednova,
    "fedveca": _fedveca,
    "dynamicfl": _dynamicfl,
    "dynamicsgd": _dynamicsgd,
}

_DYNAMICFL_NEUTRAL = ({"straggler-fraction": 0.0, "weighting": "examples", "server-lr": 1.0,
                      "server-momentum": 0.0, "round-deadline": 0.0},
                     "every active client does exactly L local steps and each sync event sets W "
                     "to the num-examples-weighted average")

# strategy -> (keys its run path never reads, each with the one value that means "off"; why)
NEUTRAL_ONLY: dict[str, tuple[dict[str, object], str]] = {
    "fedveca": ({"momentum": 0.0, "weight-decay": 0.0},
                "FedVeca's clients run plain local SGD, eq. 1"),
    "dynamicfl": _DYNAMICFL_NEUTRAL,
    "dynamicsgd": _DYNAMICFL_NEUTRAL,
}


# run-config key prefix -> (the strategies that read those keys, the one that checks them)
FAMILY_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "fedveca-": (("fedveca",), "fedveca"),
    "dynamicfl-": (("dynamicfl", "dynamicsgd"), "dynamicfl"),
    "proximal-mu": (("fedprox",), "fedprox"),
}


def build_strategy(cfg: RunConfig) -> tuple[Strategy, dict]:
    """The strategy named by ``cfg.strategy`` and its train ConfigRecord contents.

    Raises
    ------
    ConfigError
        An unknown strategy, a key the strategy cannot honour, or a value its
        constructor rejects; the message names the run-config key(s) and the fix.
    """
    if cfg.strategy not in STRATEGIES:
        raise ConfigError(
            f"run config: strategy={cfg.strategy!r} is not allowed; it must be one of "
            f"{', '.join(STRATEGIES)}. Set it with: {flwr_run_fix({'strategy': 'fedavg'})}"
        )
    _check_neutral(cfg)
    _check_other_families(cfg)
    try:
        return STRATEGIES[cfg.strategy](cfg)
    except ConfigError:
        raise
    except ValueError as exc:
        raise _constructor_error(cfg, exc) from exc


def _check_other_families(cfg: RunConfig) -> None:
    """A key only another strategy reads (``fedveca-*`` with FedAvg) is not used, but a
    bad value is still an error: it is checked by building the strategy that reads it
    from the defaults plus that family's keys (all of them: some rules span two keys)."""
    values = cfg.to_dict()
    for prefix, (readers, checker) in FAMILY_KEYS.items():
        family = {k: v for k, v in values.items() if k.startswith(prefix)}
        changed = {k: v for k, v in family.items() if v != default(k)}
        if cfg.strategy in readers or not changed:
            continue
        devices = {k: v for k, v in values.items() if k.startswith("device-")}  # the clock
        probe = dataclasses.replace(RunConfig(), strategy=checker,
                                    **{k.replace("-", "_"): v
                                       for k, v in {**devices, **family}.items()})
        try:
            with _quiet():
                STRATEGIES[checker](probe)
        except ValueError as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in changed.items())
            raise ConfigError(
                f"run config: {shown}: not a valid value ({exc}); strategy={cfg.strategy!r} "
                f"does not read it, but a bad value is still an error. Set it with: "
                f"{flwr_run_fix({k: default(k) for k in changed})}") from exc


def check_run_config(user_config: Mapping[str, object]) -> RunConfig:
    """Every run-config rule the ServerApp checks before training, without data or checkpoint.

    ``RunConfig.from_user_config`` plus the strategy's own checks (the strategy is
    built and dropped). Sweep planners and tests use this to reject a run up front.
    """
    cfg = RunConfig.from_user_config(user_config)
    with _quiet():
        build_strategy(cfg)
    return cfg


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Mute Flower's logger (constructors log, e.g. "fraction_evaluate is set to 0.0")."""
    was_disabled, FLOWER_LOGGER.disabled = FLOWER_LOGGER.disabled, True
    try:
        yield
    finally:
        FLOWER_LOGGER.disabled = was_disabled


def _check_neutral(cfg: RunConfig) -> None:
    neutral, why = NEUTRAL_ONLY.get(cfg.strategy, ({}, ""))
    values = cfg.to_dict()
    for key, wanted in neutral.items():
        if values[key] != wanted:
            raise ConfigError(
                f"run config: {key}={values[key]!r} is not allowed with "
                f"strategy={cfg.strategy!r} ({why}). Set it with: {flwr_run_fix({key: wanted})}"
            )


def _builds(cfg: RunConfig) -> bool:
    try:
        with _quiet():
            _check_neutral(cfg)
            STRATEGIES[cfg.strategy](cfg)
    except ValueError:
        return False
    return True


def _culprits(cfg: RunConfig) -> list[str]:
    """The set keys that, put back to their default, let the strategy build.

    One key at a time first (every key that fixes it alone is named: a cross-key rule
    names both sides); else all set keys together; else none.
    """
    values = cfg.to_dict()
    changed = [k for k, v in values.items() if k != "strategy" and v != default(k)]

    def reset(keys: list[str]) -> RunConfig:
        return dataclasses.replace(cfg, **{k.replace("-", "_"): default(k) for k in keys})

    single = [k for k in changed if _builds(reset([k]))]
    if single:
        return single
    return changed if changed and _builds(reset(changed)) else []


def _constructor_error(cfg: RunConfig, exc: ValueError) -> ConfigError:
    """The constructor's complaint, told in run-config keys, with a fix that builds."""
    name, values = cfg.strategy, cfg.to_dict()
    keys = _culprits(cfg)
    said = f"{type(exc).__name__}: {exc}" if type(exc) is not ValueError else str(exc)
    if not keys:
        return ConfigError(f"run config: strategy={name!r} cannot be built from this run "
                           f"config: {said}. Change the key it names (README \"Run-config "
                           f"keys\") with: flwr run . --run-config \"<key>=<value>\"")
    shown = ", ".join(f"{k}={values[k]!r}" for k in keys)
    if len(keys) == 1:
        head = f"{shown} is not allowed with strategy={name!r}"
    else:
        head = f"{shown} are not allowed together with strategy={name!r}"
    first = dataclasses.replace(cfg, **{keys[0].replace("-", "_"): default(keys[0])})
    fix = {keys[0]: default(keys[0])} if _builds(first) else {k: default(k) for k in keys}
    return ConfigError(f"run config: {head}: {said}. Set it with: {flwr_run_fix(fix)}")

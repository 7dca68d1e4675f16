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

from logging import WARNING

from flwr.common.logger import FLOWER_LOGGER, log
from flwr.serverapp.strategy import Strategy

from strategies import DynamicFL, FedAvg, FedDyn, FedNova, FedProx, FedVeca, Moon, Scaffold
from strategies import contract as C
from strategies import server_optimizers as flower
from strategies.clock import SimClock
from strategies.devices import FLEETS, GeneratedFleet, load_trace
from strategies.schedules import LRSchedule
from task.model_names import REPRESENTATION_MODELS

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


def _scaffold(cfg: RunConfig) -> tuple[Strategy, dict]:
    """SCAFFOLD (Karimireddy et al., Alg. 1, option II): eta_g = ``server-lr``; the run
    config's ``weighting`` averages delta y_i (the app's default 'examples' is NIID-Bench's
    form; 'uniform' is Alg. 1 line 16)."""
    return Scaffold(**_common(cfg)), train_config(cfg)


def _feddyn(cfg: RunConfig) -> tuple[Strategy, dict]:
    """FedDyn (Acar et al., Alg. 1): alpha = ``feddyn-alpha``; the run config's ``weighting``
    averages theta_k ('uniform' is Alg. 1's mean, 'examples' FedAvg's)."""
    return FedDyn(alpha=cfg.feddyn_alpha, **_common(cfg)), train_config(cfg)


def _moon(cfg: RunConfig) -> tuple[Strategy, dict]:
    """MOON (Li, He and Song, Alg. 1): mu = ``moon-mu``, tau = ``moon-temperature``; FedAvg's
    server (the app's 'examples' weighting is Alg. 1's |D^k| / |D|)."""
    return Moon(mu=cfg.moon_mu, temperature=cfg.moon_temperature, **_common(cfg)), \
        train_config(cfg)


def _flower_common(cfg: RunConfig) -> dict:
    """Constructor arguments of Flower's own strategies. ``min_train_nodes`` 1 keeps the
    app's m = max(floor(C K), 1) (Flower's default is 2). The ``lr-*`` keys are not read
    (Flower's configure_train sends ``lr`` as given) but still checked."""
    lr_schedule(cfg)
    return {"fraction_train": cfg.fraction_train, "fraction_evaluate": cfg.fraction_evaluate,
            "min_available_nodes": cfg.min_available_nodes, "min_train_nodes": 1,
            "min_evaluate_nodes": 1}


def _fedavgm(cfg: RunConfig) -> tuple[Strategy, dict]:
    """Flower's FedAvgM (Hsu et al.): ``server-lr``, ``server-momentum``."""
    return flower.FedAvgM(server_learning_rate=cfg.server_lr,
                          server_momentum=cfg.server_momentum,
                          **_flower_common(cfg)), train_config(cfg)


def _adaptive(cls, cfg: RunConfig, betas: bool = True) -> tuple[Strategy, dict]:
    """Flower's FedAdam / FedYogi / FedAdagrad (Reddi et al., Alg. 2): eta = ``server-lr``,
    eta_l = ``lr``, beta_1 / beta_2 = ``server-beta1`` / ``server-beta2``, tau = ``server-tau``."""
    kwargs = {"eta": cfg.server_lr, "eta_l": cfg.lr, "tau": cfg.server_tau}
    if betas:
        kwargs.update(beta_1=cfg.server_beta1, beta_2=cfg.server_beta2)
    strategy = cls(**kwargs, **_flower_common(cfg))
    if cfg.server_lr == default("server-lr"):
        flower_default = flower.flower_default(cls, "eta")
        log(WARNING, "%s: eta = server-lr = %s, the default of plain averaging; Flower's "
            "default for %s is %s (set it with %s)", cls.__name__, cfg.server_lr, cls.__name__,
            flower_default, flwr_run_fix({"server-lr": flower_default}))
    return strategy, train_config(cfg)


STRATEGIES: dict[str, Builder] = {
    "fedavg": _fedavg,
    "fedsgd": _fedsgd,
    "fedprox": _fedprox,
    "fednova": _fednova,
    "fedveca": _fedveca,
    "dynamicfl": _dynamicfl,
    "dynamicsgd": _dynamicsgd,
    "scaffold": _scaffold,
    "feddyn": _feddyn,
    "moon": _moon,
    "fedavgm": _fedavgm,
    "fedadam": lambda cfg: _adaptive(flower.FedAdam, cfg),
    "fedyogi": lambda cfg: _adaptive(flower.FedYogi, cfg),
    "fedadagrad": lambda cfg: _adaptive(flower.FedAdagrad, cfg, betas=False),
}

# Flower's own classes (strategies.server_optimizers): no client table, no per-round
# diagnostics, Flower's reply handling; the reliability suites cover fedhetero's own.
FLOWER_STRATEGIES = ("fedavgm", "fedadam", "fedyogi", "fedadagrad")

_DYNAMICFL_NEUTRAL = ({"straggler-fraction": 0.0, "weighting": "examples", "server-lr": 1.0,
                      "server-momentum": 0.0, "round-deadline": 0.0},
                     "every active client does exactly L local steps and each sync event sets W "
                     "to the num-examples-weighted average")

_FLOWER_NEUTRAL = {"weighting": "examples", "straggler-fraction": 0.0, "lr-schedule": "constant",
                   "device-profiles": "none", "round-deadline": 0.0}
_FLOWER_WHY = ("Flower's own class: it weights by num-examples, has no simulated stragglers or "
               "simulated clock and sends lr as given")

# strategy -> (keys its run path never reads, each with the one value that means "off"; why)
NEUTRAL_ONLY: dict[str, tuple[dict[str, object], str]] = {
    "fedveca": ({"momentum": 0.0, "weight-decay": 0.0},
                "FedVeca's clients run plain local SGD, eq. 1"),
    "dynamicfl": _DYNAMICFL_NEUTRAL,
    "dynamicsgd": _DYNAMICFL_NEUTRAL,
    "scaffold": ({"server-momentum": 0.0}, "SCAFFOLD's server step is x + eta_g mean delta y_i, "
                 "Alg. 1 line 17"),
    "feddyn": ({"server-momentum": 0.0}, "FedDyn's server model is the mean of the theta_k "
               "minus h / alpha, Alg. 1"),
    "moon": ({"server-momentum": 0.0}, "MOON's server is FedAvg's weighted average, Alg. 1"),
    "fedavgm": (_FLOWER_NEUTRAL, _FLOWER_WHY),
    "fedadam": ({**_FLOWER_NEUTRAL, "server-momentum": 0.0}, _FLOWER_WHY + "; beta_1 is its "
                "momentum (server-beta1)"),
    "fedyogi": ({**_FLOWER_NEUTRAL, "server-momentum": 0.0}, _FLOWER_WHY + "; beta_1 is its "
                "momentum (server-beta1)"),
    "fedadagrad": ({**_FLOWER_NEUTRAL, "server-momentum": 0.0, "server-beta1": 0.9,
                    "server-beta2": 0.99},
                   _FLOWER_WHY + "; FedAdagrad has no beta_1 / beta_2 (Reddi et al., Alg. 2)"),
}


# strategy -> (the models it can train, why): the model must provide what its client needs
MODELS_ONLY: dict[str, tuple[tuple[str, ...], str]] = {
    "moon": (REPRESENTATION_MODELS, "MOON's contrastive loss (Li et al. 2021, Eq. 3) needs the "
             "representation R_w(x) of a projection head, which these models expose"),
}

# run-config key prefix -> (the strategies that read those keys, the one that checks them)
FAMILY_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "fedveca-": (("fedveca",), "fedveca"),
    "dynamicfl-": (("dynamicfl", "dynamicsgd"), "dynamicfl"),
    "proximal-mu": (("fedprox",), "fedprox"),
    "feddyn-": (("feddyn",), "feddyn"),
    "moon-": (("moon",), "moon"),
    "server-beta": (("fedadam", "fedyogi"), "fedadam"),
    "server-tau": (("fedadam", "fedyogi", "fedadagrad"), "fedadam"),
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
    _check_model(cfg)
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


def _check_model(cfg: RunConfig) -> None:
    models, why = MODELS_ONLY.get(cfg.strategy, ((), ""))
    if models and cfg.model not in models:
        raise ConfigError(
            f"run config: model={cfg.model!r} is not allowed with strategy={cfg.strategy!r} "
            f"({why}: {', '.join(models)}). Set it with: {flwr_run_fix({'model': models[0]})}")


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

"""The one strategy-name table: run-config ``strategy`` -> the wiring that builds it.

Each builder passes run-config values to a strategy's constructor. What a key may take
(bounds, keys a strategy cannot honour, rules across keys) is declared in
:mod:`fedapp.config_keys` and checked by :meth:`RunConfig.validate` before any builder runs;
the constructors keep their own checks for library users, and the two are kept in agreement
by tests/test_config_keys.py. Later strategies plug in by adding an entry to
:data:`STRATEGIES` (and their keys to the table).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from logging import WARNING

from flwr.common.logger import FLOWER_LOGGER, log
from flwr.serverapp.strategy import Strategy

from strategies import (DynamicFL, FedAsync, FedAvg, FedBuff, FedDyn, FedNova, FedProx, FedRolex,
                        FedVeca, FjORD, HeteroFL, Moon, OortSelection, PowerOfChoice, Scaffold,
                        TiFLSelection)
from strategies import SELECTIONS
from strategies import contract as C
from strategies.algorithms import flower_optimizers as flower
from strategies.engine.clock import SimClock
from strategies.engine.devices import FLEETS, GeneratedFleet, load_trace
from strategies.engine.schedules import LRSchedule

from .config import ConfigError, RunConfig, default, flwr_run_fix
from .config_keys import FLOWER, width_levels

Builder = Callable[[RunConfig], tuple[Strategy, dict]]


@dataclass(frozen=True)
class ModelFacts:
    """What the ServerApp measured of the model before building the strategy: the simulated
    clock's training seconds per example, and for width strategies the model's width spec
    and each level's training-FLOPs share (the evaluation process counts them)."""

    seconds_per_example: float | None = None
    width_spec: Mapping | None = None
    width_compute: Mapping[float, float] | None = None


MODEL: ContextVar[ModelFacts] = ContextVar("fedhetero_model_facts", default=ModelFacts())


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
    ``num-server-rounds``) as the FedAvg family and DynamicFL take them."""
    return LRSchedule(cfg.lr_schedule, decay=cfg.lr_decay, step_every=cfg.lr_step_every,
                      lr_min=cfg.lr_min, num_rounds=cfg.num_server_rounds)


def device_clock(cfg: RunConfig) -> SimClock | None:
    """The simulated clock of ``device-profiles`` (None for ``none``), calibrated with the
    model's cost when the ServerApp measured it (:class:`ModelFacts`). A trace that does not
    load is a ConfigError naming ``device-profiles``."""
    kind = cfg.device_profiles
    cost = MODEL.get().seconds_per_example
    if kind == "none":
        return None
    if kind in FLEETS:
        return SimClock(GeneratedFleet(
            kind, seed=cfg.seed, downlink_mbps=cfg.device_downlink_mbps,
            uplink_mbps=cfg.device_uplink_mbps, sigma=cfg.device_sigma,
            rich_fraction=cfg.device_rich_fraction, poor_factor=cfg.device_poor_factor,
            availability=cfg.device_availability, tiers=cfg.device_tiers), cost)
    try:
        return SimClock(load_trace(kind), cost)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"run config: device-profiles={kind!r}: the device trace does not "
                          f"load ({exc}). Set it with: "
                          f"{flwr_run_fix({'device-profiles': default('device-profiles')})}"
                          ) from exc


def selection_policy(cfg: RunConfig, rounds: int | None) -> object | None:
    """The ``selection`` policy (None: random, the participation model's default) with
    ``oort-preferred-duration``, ``poc-candidates`` and ``tifl-tiers``; TiFL's credits per
    tier are ceil(``rounds`` / tiers) (None: unlimited, the asynchronous strategies)."""
    name, preferred = cfg.selection, cfg.oort_preferred_duration
    candidates, tiers = cfg.poc_candidates, cfg.tifl_tiers
    if name == "oort":
        return OortSelection(cfg.seed, preferred)
    if name == "power-of-choice":
        return PowerOfChoice(cfg.seed, candidates)
    if name == "tifl":
        return TiFLSelection(cfg.seed, tiers, -(-rounds // tiers) if rounds else None)
    if name != "random":
        raise ValueError(f"selection={name!r} is not known; use one of {', '.join(SELECTIONS)}")
    return None


def _common(cfg: RunConfig, drift: bool = True) -> dict:
    """Constructor arguments of the FedAvg family; straggler-policy 'auto' = the class default;
    ``drift``: pass ``drift-diagnostics`` (False: the strategy compares no updates).

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
        "drift_diagnostics": cfg.drift_diagnostics if drift else False,
        "weighting": cfg.weighting,
        "server_lr": cfg.server_lr,
        "lr_schedule": lr_schedule(cfg),
        "clock": device_clock(cfg),
        "round_deadline": cfg.round_deadline or None,
        "over_commitment": cfg.over_commitment,
        "selection": selection_policy(cfg, cfg.num_server_rounds),
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


def _width(cls, cfg: RunConfig) -> tuple[Strategy, dict]:
    """HeteroFL / FjORD / FedRolex: ``width-levels``, ``width-rule`` (``auto``: the class's
    choice), ``width-scaler`` (``auto``: the class's default). The model's width spec and
    each level's FLOPs come from the ServerApp (``use_model``) once it knows the model."""
    facts = MODEL.get()
    kwargs = {**_common(cfg, drift=False), "levels": width_levels(cfg.width_levels),
              "width_spec": facts.width_spec, "level_compute": facts.width_compute}
    if cfg.width_rule != "auto":
        kwargs["width_rule"] = cfg.width_rule
    scaler = cfg.width_scaler
    if scaler != "auto":
        if scaler not in ("on", "off"):
            raise ValueError(f"width-scaler={scaler!r}: use 'auto', 'on' or 'off'")
        kwargs["scaler"] = scaler == "on"
    return cls(**kwargs), train_config(cfg)


def _async_common(cfg: RunConfig, default_staleness: str) -> dict:
    """Constructor arguments of FedBuff and FedAsync (the client-info query is on: the
    clock's profiles and a resume's in-flight tasks are keyed by partition id)."""
    staleness = cfg.async_staleness
    return {
        "concurrency": cfg.async_concurrency,
        "arrival": cfg.async_arrival,
        "staleness": default_staleness if staleness == "auto" else staleness,
        "fraction_evaluate": cfg.fraction_evaluate,
        "seed": cfg.seed,
        "min_available_nodes": cfg.min_available_nodes,
        "query_client_info": True,
        "clock": device_clock(cfg),
        "selection": selection_policy(cfg, None),
    }


def _fedbuff(cfg: RunConfig) -> tuple[Strategy, dict]:
    return FedBuff(buffer_size=cfg.fedbuff_buffer_size, server_lr=cfg.server_lr,
                   server_momentum=cfg.server_momentum,
                   **_async_common(cfg, "fedbuff")), train_config(cfg)


def _fedasync(cfg: RunConfig) -> tuple[Strategy, dict]:
    return FedAsync(alpha=cfg.fedasync_alpha, updates_per_round=cfg.fedasync_updates_per_round,
                    rho=cfg.fedasync_rho, **_async_common(cfg, "polynomial")), train_config(cfg)


def _flower_common(cfg: RunConfig) -> dict:
    """Constructor arguments of Flower's own strategies. ``min_train_nodes`` 1 keeps the
    app's m = max(floor(C K), 1) (Flower's default is 2)."""
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
    "heterofl": lambda cfg: _width(HeteroFL, cfg),
    "fjord": lambda cfg: _width(FjORD, cfg),
    "fedrolex": lambda cfg: _width(FedRolex, cfg),
    "fedbuff": _fedbuff,
    "fedasync": _fedasync,
    "fedavgm": _fedavgm,
    "fedadam": lambda cfg: _adaptive(flower.FedAdam, cfg),
    "fedyogi": lambda cfg: _adaptive(flower.FedYogi, cfg),
    "fedadagrad": lambda cfg: _adaptive(flower.FedAdagrad, cfg, betas=False),
}

# Flower's own classes (strategies.algorithms.flower_optimizers): no client table, no per-round
# diagnostics, Flower's reply handling; the reliability suites cover fedhetero's own.
FLOWER_STRATEGIES = FLOWER


def build_strategy(cfg: RunConfig, model: ModelFacts | None = None) -> tuple[Strategy, dict]:
    """The strategy named by ``cfg.strategy`` and its train ConfigRecord contents; with
    ``model``, the facts the ServerApp measured (a calibrated clock, the width spec).

    ``cfg`` has passed the table's checks (:meth:`RunConfig.validate`), so the constructor
    sees values it accepts (tests/test_config_keys.py keeps the two in agreement).

    Raises
    ------
    ConfigError
        An unknown strategy, a device trace that does not load, or (a bug: the table allows
        what the constructor refuses) the constructor's complaint.
    """
    if cfg.strategy not in STRATEGIES:
        raise ConfigError(
            f"run config: strategy={cfg.strategy!r} is not allowed; it must be one of "
            f"{', '.join(STRATEGIES)}. Set it with: {flwr_run_fix({'strategy': 'fedavg'})}"
        )
    token = MODEL.set(model or ModelFacts())
    try:
        return STRATEGIES[cfg.strategy](cfg)
    except ConfigError:
        raise
    except ValueError as exc:
        said = f"{type(exc).__name__}: {exc}" if type(exc) is not ValueError else str(exc)
        raise ConfigError(f"run config: strategy={cfg.strategy!r} cannot be built from this "
                          f"run config: {said}. Change the key it names (docs/config.md \"Run-config "
                          f"keys\") with: flwr run . --run-config \"<key>=<value>\"") from exc
    finally:
        MODEL.reset(token)


def check_run_config(user_config: Mapping[str, object]) -> RunConfig:
    """Every run-config rule the ServerApp checks before training, without data or checkpoint.

    ``RunConfig.from_user_config`` (the table's checks) plus building the strategy once
    (its name; a device trace must load). Sweep planners and tests use this to reject a run
    up front.
    """
    cfg = RunConfig.from_user_config(user_config)
    was_disabled, FLOWER_LOGGER.disabled = FLOWER_LOGGER.disabled, True  # constructors log
    try:
        build_strategy(cfg)
    finally:
        FLOWER_LOGGER.disabled = was_disabled
    return cfg

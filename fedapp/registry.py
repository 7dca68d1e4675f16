"""The strategies by name: run config -> the registered strategy, built by one generic builder.

Every strategy comes from its algorithm module's registration
(:mod:`strategies.engine.registry`): its class, its engine, its own run-config keys (each
with the constructor argument it sets), the shared keys it takes. :func:`build_strategy`
passes each key the strategy reads (:mod:`fedapp.config_keys`: its engine family's, its own,
its ``reads``) to its constructor, plus what its engine needs beyond single keys (the
simulated clock, the selection policy, the learning-rate schedule, the robust rule:
:data:`ENGINE_PARTS`).
What a key may take is declared with the key and checked by :meth:`RunConfig.validate`
before any builder runs; the constructors keep their own checks for library users, and the
two are kept in agreement by tests/test_config_keys.py. A new strategy needs nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from logging import WARNING
from typing import NamedTuple

from flwr.common.logger import FLOWER_LOGGER, log
from flwr.serverapp.strategy import Strategy

from strategies import SELECTIONS, OortSelection, PowerOfChoice, TiFLSelection
from strategies import contract as C
from strategies.engine.clock import SimClock
from strategies.engine.devices import FLEETS, GeneratedFleet, load_trace
from strategies.engine.flash_fleet import FLASH, FlashFleet
from strategies.engine.participation import Participation
from strategies.engine.robust import RobustRule, robust_rule
from strategies.engine.registry import Registration
from strategies.engine.schedules import LRSchedule

from .config import ConfigError, RunConfig, default, flwr_run_fix, with_fix_as
from .config_keys import FLOWER, KEYS, REGISTRATIONS

__all__ = ["Built", "FLOWER_STRATEGIES", "ModelFacts", "STRATEGIES", "build_strategy",
           "check_run_config", "device_clock", "lr_schedule", "robust_aggregation",
           "selection_policy", "train_config"]


@dataclass(frozen=True)
class ModelFacts:
    """What the ServerApp measured of the model before building the strategy: the simulated
    clock's training seconds per example, and for width strategies the model's width spec
    and each level's training-FLOPs share (the evaluation process counts them)."""

    seconds_per_example: float | None = None
    width_spec: Mapping | None = None
    width_compute: Mapping[float, float] | None = None


class Built(NamedTuple):
    """A built strategy and the train ConfigRecord contents of its run."""

    strategy: Strategy
    train_config: dict

    @property
    def participation(self) -> Participation | None:
        """The strategy's participation model (who takes part, the simulated clock); None
        for Flower's own classes, which sample with Flower's ClientManager."""
        return getattr(self.strategy, "participation", None)


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


def device_clock(cfg: RunConfig, cost: float | None = None) -> SimClock | None:
    """The simulated clock of ``device-profiles`` (None for ``none``) with ``device-dropout``,
    calibrated with the model's training seconds per example ``cost`` when the ServerApp
    measured it; ``flash`` reads ``device-speed-noise`` and ``device-partition-correlation``
    (:class:`~strategies.engine.flash_fleet.FlashFleet`). A trace
    that does not load is a ConfigError naming ``device-profiles``."""
    kind = cfg.device_profiles
    if kind == "none":
        return None
    dropout, noise = cfg.device_dropout, cfg.device_speed_noise
    correlation = cfg.device_partition_correlation
    if kind == FLASH:
        return SimClock(FlashFleet(seed=cfg.seed, speed_noise=noise, correlation=correlation,
                                   availability=cfg.device_availability), cost, dropout)
    if kind in FLEETS:
        return SimClock(GeneratedFleet(
            kind, seed=cfg.seed, downlink_mbps=cfg.device_downlink_mbps,
            uplink_mbps=cfg.device_uplink_mbps, sigma=cfg.device_sigma,
            rich_fraction=cfg.device_rich_fraction, poor_factor=cfg.device_poor_factor,
            availability=cfg.device_availability, tiers=cfg.device_tiers), cost, dropout)
    try:
        trace = load_trace(kind)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"run config: device-profiles={kind!r}: the device trace does not "
                          f"load ({exc}). Set it with: "
                          f"{flwr_run_fix({'device-profiles': default('device-profiles')})}"
                          ) from exc
    return SimClock(trace, cost, dropout)


def selection_policy(cfg: RunConfig, rounds: int | None) -> object | None:
    """The ``selection`` policy (None: random, the participation model's default) with
    ``oort-preferred-duration``, ``poc-candidates``, ``poc-weighting`` and ``tifl-tiers``; TiFL's credits per
    tier are ceil(``rounds`` / tiers) (None: unlimited, the asynchronous strategies)."""
    name, preferred = cfg.selection, cfg.oort_preferred_duration
    candidates, tiers, poc_weighting = cfg.poc_candidates, cfg.tifl_tiers, cfg.poc_weighting
    if name == "oort":
        return OortSelection(cfg.seed, preferred)
    if name == "power-of-choice":
        return PowerOfChoice(cfg.seed, candidates, weighting=poc_weighting)
    if name == "tifl":
        return TiFLSelection(cfg.seed, tiers, -(-rounds // tiers) if rounds else None)
    if name != "random":
        raise ValueError(f"selection={name!r} is not known; use one of {', '.join(SELECTIONS)}")
    return None


def robust_aggregation(cfg: RunConfig) -> RobustRule | None:
    """The ``robust-aggregation`` rule (None: the weighted average) with ``robust-trim`` as
    the trimmed mean's beta (checked whatever the rule)."""
    return robust_rule(cfg.robust_aggregation, cfg.robust_trim)


def engine_parts(cfg: RunConfig, registration: Registration, model: ModelFacts
                 ) -> dict[str, object]:
    """What a strategy's engine needs beyond single keys (:data:`ENGINE_PARTS`)."""
    engine = registration.engine
    if engine == "flower":  # Flower's own classes: m = max(floor(C K), 1), as the app's
        return {"min_train_nodes": 1, "min_evaluate_nodes": 1}
    parts: dict[str, object] = {"query_client_info": True,  # fedhetero's ClientApp answers
                                "clock": device_clock(cfg, model.seconds_per_example)}
    if engine in ("round", "events"):
        parts["lr_schedule"] = lr_schedule(cfg)
    if engine in ("round", "async"):
        parts["selection"] = selection_policy(cfg, cfg.num_server_rounds if engine == "round"
                                              else None)
        rule = robust_aggregation(cfg)
        if rule is not None:
            parts["robust"] = rule
    if registration.model == "width":
        parts.update(width_spec=model.width_spec, level_compute=model.width_compute)
    return parts


def constructor_arguments(cfg: RunConfig, registration: Registration) -> dict[str, object]:
    """Each key the strategy reads that sets a constructor argument (its own keys' ``arg``,
    its ``reads`` for shared keys), converted; ``auto`` values left to the class."""
    kwargs: dict[str, object] = {}
    for key in KEYS:
        arg = registration.reads.get(key.name, key.arg)
        if arg is not None and registration.name in key.used_by:
            kwargs.update(key.arguments(getattr(cfg, key.field), arg))
    return kwargs


def build_named(name: str, cfg: RunConfig, model: ModelFacts | None = None) -> Built:
    """Strategy ``name`` (registered) from ``cfg``: its arguments, its engine's parts, its
    preset."""
    registration = REGISTRATIONS[name]
    kwargs = {**constructor_arguments(cfg, registration),
              **engine_parts(cfg, registration, model or ModelFacts()), **registration.fixed}
    if registration.reads.get("server-lr") == "eta" and cfg.server_lr == default("server-lr"):
        flower_default = flower_default_of(registration.strategy, "eta")
        log(WARNING, "%s: eta = server-lr = %s, the default of plain averaging; Flower's "
            "default for %s is %s (set it with %s)", registration.strategy.__name__,
            cfg.server_lr, registration.strategy.__name__, flower_default,
            flwr_run_fix({"server-lr": flower_default}))
    config = {**train_config(cfg), **registration.train_config}
    return Built(registration.strategy(**kwargs), config)


def flower_default_of(cls: type, parameter: str) -> object:
    """The default of ``parameter`` in the Flower class ``cls`` wraps."""
    import inspect  # noqa: PLC0415

    flower_class = getattr(cls, "FLOWER_CLASS", cls)
    return inspect.signature(flower_class.__init__).parameters[parameter].default


STRATEGIES: dict[str, Callable[[RunConfig], Built]] = {
    name: partial(build_named, name) for name in REGISTRATIONS}
"""Run-config ``strategy`` -> its builder (every registered strategy)."""
FLOWER_STRATEGIES = FLOWER  # Flower's own classes, behind the trust gate


def build_strategy(cfg: RunConfig, model: ModelFacts | None = None) -> Built:
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
            f"{', '.join(STRATEGIES)}. Set it with: {flwr_run_fix({'strategy': 'fedavg'})}",
            {"strategy": "fedavg"})
    try:
        return build_named(cfg.strategy, cfg, model)
    except ConfigError:
        raise
    except ValueError as exc:
        said = f"{type(exc).__name__}: {exc}" if type(exc) is not ValueError else str(exc)
        raise ConfigError(f"run config: strategy={cfg.strategy!r} cannot be built from this "
                          f"run config: {said}. Change the key it names (docs/config.md \"Run-config "
                          f"keys\") with: flwr run . --run-config \"<key>=<value>\"") from exc


def check_run_config(user_config: Mapping[str, object],
                     fix_as: Callable[[Mapping[str, object]], str] | None = None) -> RunConfig:
    """Every run-config rule the ServerApp checks before training, without data or checkpoint.

    ``RunConfig.from_user_config`` (the table's checks) plus building the strategy once
    (its name; a device trace must load). Sweep planners and tests use this to reject a run
    up front. ``fix_as`` writes a ConfigError's fix in the caller's syntax (e.g.
    :func:`fedapp.config.cli_fix`: ``-c key=value``; None: ``flwr run --run-config``).
    """
    try:
        cfg = RunConfig.from_user_config(user_config)
    except ConfigError as exc:
        if fix_as is None:
            raise
        raise ConfigError(with_fix_as(exc, fix_as), exc.fix) from None
    was_disabled, FLOWER_LOGGER.disabled = FLOWER_LOGGER.disabled, True  # constructors log
    try:
        build_strategy(cfg)
    finally:
        FLOWER_LOGGER.disabled = was_disabled
    return cfg

"""What a report calls each compared variant: its strategy and the run-config keys that tell
it apart from the others ("fedprox mu=0.1", "fedavg alpha=0.1" beside "fedavg alpha=1"),
read from each run's ``config.json``.

A key tells variants apart when it takes two or more values among the variants whose
strategy reads it (``used_by`` of :mod:`fedapp.config_keys`; a scheme's keys only under that
scheme, :data:`ONLY_WHEN`), counting "varies" as one value where a variant's runs differ
(so two loose runs that differ only in their seed are told apart by it, and a variant with
a fixed ``partition-seed`` stands out among variants whose partition follows the seed). A
sweep variant's ``seed`` is never part of its label: its seeds are averaged, and the tables
say how many. A value in :data:`UNSAID` tells variants apart without being written.
:data:`NEVER_DISTINGUISH` lists keys that never tell experiments apart (where a run's
files go, how it is tracked, ...). Two variants left with one label get their sweep variant
name, else their run directory's start time, else a number.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from fedapp.config_keys import APP, BY_NAME
from fedapp.run_outputs import read_config, started_at

from .preflight import SCHEME_KEYS

Runs = Mapping[str, list[tuple[Path, list[dict]]]]
NEVER_DISTINGUISH = frozenset({
    "output-dir", "resume-from", "data-dir", "allow-download", "tracking", "tracking-dir",
    "run-plots", "checkpoint-every", "device", "eval-overlap", "eval-batch-size",
    "drift-diagnostics", "round-timeout", "silence-timeout",
    "min-available-nodes"})
SHORT_NAMES = {"dirichlet-alpha": "alpha", "proximal-mu": "mu"}  # as papers write them
UNSAID = {"partition-seed": -1}  # the value that means "as usual" (here: the run's seed)
SCHEME_OF = {key: tuple(s for s, keys in SCHEME_KEYS.items() if key in keys)
             for keys in SCHEME_KEYS.values() for key in keys}
ONLY_WHEN: dict[str, Callable[[Mapping], bool]] = {
    **{key: (lambda c, schemes=schemes: c.get("partition") in schemes)
       for key, schemes in SCHEME_OF.items()},
    "synthetic-alpha": lambda c: c.get("dataset") == "synthetic",
    "synthetic-beta": lambda c: c.get("dataset") == "synthetic",
    **{key: (lambda c: c.get("device-profiles", "none") != "none")
       for key in BY_NAME if key.startswith("device-") and key != "device-profiles"},
    "oort-preferred-duration": lambda c: c.get("selection") == "oort",
    "poc-candidates": lambda c: c.get("selection") == "power-of-choice",
    "tifl-tiers": lambda c: c.get("selection") == "tifl",
    "robust-trim": lambda c: c.get("robust-aggregation", "none") != "none",
}
KEY_ORDER = {name: index for index, name in enumerate(BY_NAME)}
VARIES = "(varies)"  # a key whose value differs between the runs of one variant


def run_config(run_dir: Path) -> dict:
    """The ``run-config`` of a run directory's config.json ({} without one), a key it lacks
    (a run from before the key existed) at the key's default."""
    config = read_config(run_dir).get("run-config")
    if not isinstance(config, dict) or not config:
        return {}
    return {**{name: key.default for name, key in BY_NAME.items()}, **config}


def reads(config: Mapping, key: str) -> bool:
    """Whether a run with this run config is affected by ``key`` (module docstring)."""
    if key in NEVER_DISTINGUISH or key == "strategy":
        return False
    declared = BY_NAME.get(key)
    if declared is not None and APP not in declared.used_by \
            and config.get("strategy") not in declared.used_by:
        return False
    return ONLY_WHEN.get(key, lambda _: True)(config)


def shared_config(configs: list[dict]) -> dict:
    """A variant's run config: each key's value where all its runs agree, else
    :data:`VARIES` ({} when a run has no config)."""
    if not configs or not all(configs):
        return {}
    keys = dict.fromkeys(key for config in configs for key in config)
    return {key: configs[0][key] if all(key in c and c[key] == configs[0].get(key)
                                        for c in configs) else VARIES for key in keys}


def value_text(value: object) -> str:
    """A run-config value as a label writes it: 0.1, true, lognormal, [1, 2]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return value if isinstance(value, str) else json.dumps(value)


def distinguishing_keys(configs: Mapping[str, dict]) -> list[str]:
    """The keys that tell the variants' shared configs apart, in the key table's order."""
    keys = {key for config in configs.values() for key in config}
    found = []
    for key in keys:
        values = {json.dumps(c[key], sort_keys=True) for c in configs.values()
                  if key in c and reads(c, key)}
        if len(values) > 1:
            found.append(key)
    return sorted(found, key=lambda k: (KEY_ORDER.get(k, len(KEY_ORDER)), k))


def label_of(config: dict, keys: list[str]) -> str:
    """"<strategy> key=value ..." of one variant."""
    parts = [str(config["strategy"])]
    parts += [f"{SHORT_NAMES.get(k, k)}={value_text(config[k])}" for k in keys
              if config.get(k, VARIES) not in (VARIES, UNSAID.get(k, VARIES))
              and reads(config, k)]
    return " ".join(parts)


def variant_configs(runs: Runs) -> dict[str, dict]:
    """variant -> the run config its runs share ({} where a run has no config.json; a sweep
    variant's ``seed`` is :data:`VARIES`)."""
    configs = {}
    for variant, items in runs.items():
        config = shared_config([run_config(d) for d, _ in items])
        if config and any(in_sweep_layout(d) for d, _ in items):
            config["seed"] = VARIES
        configs[variant] = config
    return configs


def in_sweep_layout(run_dir: Path) -> bool:
    """Whether a run directory sits in a sweep's ``<variant>/seed<k>/<run>`` layout."""
    return run_dir.parent.name.startswith("seed")


def tie_breaker(variant: str, runs: Runs) -> str:
    """What tells apart two variants with one label: the sweep variant name, else the run
    directory's start time (seconds included), else its name."""
    run_dir = runs[variant][0][0]
    if in_sweep_layout(run_dir):
        return variant
    return started_at(run_dir.name, seconds=True) or run_dir.name


def variant_labels(runs: Runs) -> dict[str, str]:
    """variant -> its label (module docstring); a variant without a config (or strategy)
    keeps its name, and labels left equal get :func:`tie_breaker`, then a number."""
    configs = variant_configs(runs)
    known = {v: c for v, c in configs.items() if c.get("strategy")}
    keys = distinguishing_keys(known)
    labels = {v: label_of(known[v], keys) if v in known else v for v in runs}
    for label in set(labels.values()):
        same = [v for v in runs if labels[v] == label]
        if len(same) > 1:
            for variant in same:
                labels[variant] = f"{label} ({tie_breaker(variant, runs)})"
    for label in set(labels.values()):
        same = [v for v in runs if labels[v] == label]
        for number, variant in enumerate(same[1:], start=2):
            labels[variant] = f"{label} #{number}"
    return labels

"""One typed, validated view of the run config ([tool.flwr.app.config]).

:class:`RunConfig` is made from :data:`fedapp.config_keys.KEYS`: one field per key
(kebab-case key = snake_case field) with the key's default, checked against the table's
bounds, choices, checks, :class:`~fedapp.config_keys.Only` entries and rules. A bad value
raises :class:`ConfigError`, whose message names the key, the value, what is allowed and the
``--run-config`` that fixes it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from task.data import DataSource

from .config_keys import BY_NAME, INT64_MAX, KEYS, RULES, Rule, Value

INT64 = (-(2**63), INT64_MAX)


class ConfigError(ValueError):
    """A run-config value is wrong; the message says which, and what to use instead:
    ``fix``, the values to set, which the message shows as a ``flwr run`` command line
    (:func:`flwr_run_fix`) and a command line of fedhetero's shows as ``-c key=value``
    (:func:`with_fix_as`)."""

    def __init__(self, message: str, fix: Mapping[str, object] | None = None) -> None:
        super().__init__(message)
        self.fix = dict(fix) if fix else None


def with_fix_as(exc: Exception,
                syntax: Callable[[Mapping[str, object]], str] | None) -> str:
    """``exc``'s message, the ``flwr run`` fix of a ConfigError written in another ``syntax``
    (None: as it is)."""
    fix = exc.fix if isinstance(exc, ConfigError) else None
    if syntax is None or not fix:
        return str(exc)
    return str(exc).replace(flwr_run_fix(fix), syntax(fix))


def cli_fix(values: Mapping[str, object]) -> str:
    """``-c key=value`` options that set ``values`` (fedhetero run, python -m simulation): a
    bool as true / false, an empty string as ''."""
    def shown(value: object) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        return "''" if value == "" else str(value)
    return " ".join(f"-c {key}={shown(value)}" for key, value in values.items())


# names of Flower's templates and examples -> ours
FLOWER_TEMPLATE_NAMES = {"learning-rate": "lr", "fraction-fit": "fraction-train",
                         "num-rounds": "num-server-rounds", "epochs": "local-epochs"}


class _RunConfigMethods:
    """The methods of :class:`RunConfig` (its fields come from the table)."""

    @classmethod
    def from_user_config(cls, user_config: Mapping[str, object]) -> RunConfig:
        """Build and validate from ``context.run_config``; unknown keys are an error."""
        unknown = sorted(set(user_config) - set(BY_NAME))
        if unknown:
            raise ConfigError(
                f"run config: unknown key(s) {', '.join(_with_hint(k) for k in unknown)}; "
                f"the {len(BY_NAME)} known keys: fedhetero keys (docs/config.md)")
        config = cls(**{BY_NAME[key].field: _typed(key, value)
                        for key, value in user_config.items()})
        config.validate()
        return config

    def to_dict(self) -> dict[str, Value]:
        """Kebab-case keys, as in pyproject.toml."""
        return {key.name: getattr(self, key.field) for key in KEYS}

    def validate(self) -> None:
        """Raise ConfigError on the first value the table does not allow: a key's bounds,
        then the rules across keys, then the values a key may take with ``strategy``."""
        values = self.to_dict()
        for key in KEYS:
            why = key.refusal(values[key.name])
            if why is not None:
                meant = _meant_choice(key.choices, values[key.name])
                fix = {key.name: key.default if meant is None else meant}
                why = f"did you mean {meant!r}?" if meant is not None else why
                raise ConfigError(
                    f"run config: {key.name}={values[key.name]!r} is not allowed"
                    f"{f' ({why})' if why else ''}; it must be {key.allowed()}. Set it with: "
                    f"{flwr_run_fix(fix)}", fix)
        for rule in RULES:
            if not rule.holds(values):
                shown = ", ".join(f"{k}={values[k]!r}" for k in rule.keys)
                fix = _fix(rule, values)
                raise ConfigError(f"run config: {shown} are not allowed together; it must be "
                                  f"{rule.allowed}. Set it with: {flwr_run_fix(fix)}", fix)
        strategy = values["strategy"]
        for key in KEYS:
            for only in key.only:
                if strategy in only.strategies and values[key.name] not in only.values:
                    wanted = key.default if key.default in only.values else only.values[0]
                    raise ConfigError(
                        f"run config: {key.name}={values[key.name]!r} is not allowed with "
                        f"strategy={strategy!r} ({only.why}); use "
                        f"{' or '.join(repr(v) for v in only.values)}. Set it with: "
                        f"{flwr_run_fix({key.name: wanted})}", {key.name: wanted})

    @property
    def partition_data_seed(self) -> int:
        """The seed of the partition: ``partition-seed``, or the run's ``seed`` at -1 (so a
        sweep can keep one partition across seeds, as NIID-Bench's tables did)."""
        return self.seed if self.partition_seed == -1 else self.partition_seed

    @property
    def held_out_fraction(self) -> float:
        """The share of the training set held out for validation: ``validation-fraction``
        with ``evaluation-split = "validation"``, else 0.0 (nothing held out)."""
        return self.validation_fraction if self.evaluation_split == "validation" else 0.0

    def data_source(self, data_dir: str) -> DataSource:
        """The data a ClientApp (or the ServerApp) of this run reads, from ``data_dir``."""
        return DataSource(self.dataset, data_dir, self.allow_download, self.synthetic_alpha,
                          self.synthetic_beta, self.normalize, self.held_out_fraction)

    def resolved_output_dir(self) -> Path:
        """output-dir, or $XDG_DATA_HOME/fedhetero/runs (default ~/.local/share/fedhetero/runs)."""
        if self.output_dir:
            return Path(self.output_dir)
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "fedhetero" / "runs"


RunConfig = dataclasses.make_dataclass(
    "RunConfig", [(key.field, key.type, dataclasses.field(default=key.default)) for key in KEYS],
    bases=(_RunConfigMethods,), frozen=True, namespace={"__module__": __name__})
RunConfig.__doc__ = """The run config, typed: one field per key of fedapp.config_keys.KEYS
(docs/config.md), with the key's default."""


def default(key: str) -> Value:
    """The default of run-config ``key`` (pyproject.toml's value)."""
    return BY_NAME[key].default


def toml_value(value: object) -> str:
    """``value`` as ``flwr run --run-config`` reads it (TOML: true, 'text', 0.5)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("'", "") + "'"
    return repr(value)


def flwr_run_fix(values: Mapping[str, object]) -> str:
    """The ``flwr run`` command line that sets ``values``."""
    pairs = " ".join(f"{key}={toml_value(value)}" for key, value in values.items())
    return f'flwr run . --run-config "{pairs}"'


def _fix(rule: Rule, values: Mapping[str, Value]) -> dict[str, Value]:
    """The first of the rule's set keys whose default makes it hold, else all of them."""
    changed = [k for k in rule.keys if values[k] != default(k)] or list(rule.keys)
    for key in changed:
        if rule.holds({**values, key: default(key)}):
            return {key: default(key)}
    return {key: default(key) for key in changed}


def _meant_choice(choices: Sequence[str], value: object) -> str | None:
    """The choice a mistyped string ``value`` most likely means, or None."""
    if not choices or not isinstance(value, str):
        return None
    close = difflib.get_close_matches(value.lower().replace("_", "-"), list(choices), 1, 0.75)
    return close[0] if close else None


def _with_hint(key: str) -> str:
    """``key`` with the known key it most likely means: ours for a name from Flower's
    templates, the hyphenated spelling of an underscored one, else the closest by spelling."""
    guess = FLOWER_TEMPLATE_NAMES.get(key) or FLOWER_TEMPLATE_NAMES.get(key.replace("_", "-"))
    if guess is None:
        close = difflib.get_close_matches(key.replace("_", "-"), list(BY_NAME), 1)
        guess = close[0] if close else None
    return f"{key} (did you mean {guess}?)" if guess in BY_NAME else key


def _typed(key: str, value: object) -> Value:
    """``value`` as the key's type (an int for a float is fine, an integral float for an int
    too, nothing else); a float must be finite, an int fit in 64 bits."""
    wanted = BY_NAME[key].type
    values = {key: BY_NAME[key].default}
    fix = flwr_run_fix(values)
    if wanted is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if wanted is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, wanted) or (wanted is not bool and isinstance(value, bool)):
        hint = " Strings need quotes inside the --run-config string." if wanted is str else ""
        raise ConfigError(f"run config: {key}={value!r} has type {type(value).__name__}, "
                          f"expected {wanted.__name__}.{hint} Set it with: {fix}", values)
    if wanted is float and not math.isfinite(value):
        raise ConfigError(f"run config: {key}={value!r} is not allowed; it must be a finite "
                          f"number. Set it with: {fix}", values)
    if wanted is int and not INT64[0] <= value <= INT64[1]:
        raise ConfigError(f"run config: {key}={value!r} is not allowed; it must fit in 64 "
                          f"bits. Set it with: {fix}", values)
    return value

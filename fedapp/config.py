"""One typed, validated view of the run config ([tool.flwr.app.config]).

Every key of pyproject.toml's ``[tool.flwr.app.config]`` is a field here (kebab-case
key = snake_case field) with the same default; ``tests/test_config.py`` keeps the
two in step. Bad values raise :class:`ConfigError`, whose message names the key,
the value, what is allowed and how to set it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from strategies.fedavg import STRAGGLER_POLICIES, STRAGGLER_UNITS, WEIGHTINGS
from strategies.dynacomm import BUDGET_MODES as DYNAMICFL_BUDGET_MODES
from strategies.dynamicfl_schedule import X_STAR_MODES as DYNAMICFL_X_STAR_MODES
from strategies.dynamicfl_schedule import parse_interval_spec
from strategies.fedveca_math import BETA_MODES as FEDVECA_BETA_MODES
from task.data import DATASET_NAMES, check_dataset_name
from task.models import MODEL_NAMES
from task.partition import PARTITION_NAMES


class ConfigError(ValueError):
    """A run-config value is wrong; the message says which, and what to use instead."""


@dataclass(frozen=True)
class RunConfig:
    """The run config, typed. See README "Run-config keys" for each key's meaning."""

    num_server_rounds: int = 10
    strategy: str = "fedavg"
    weighting: str = "examples"
    fraction_train: float = 1.0
    fraction_evaluate: float = 0.0
    min_available_nodes: int = 2
    server_lr: float = 1.0
    proximal_mu: float = 0.01
    server_momentum: float = 0.0
    straggler_fraction: float = 0.0
    straggler_policy: str = "auto"
    straggler_unit: str = "steps"
    drift_diagnostics: bool = True
    fedveca_tau_init: int = 20
    fedveca_tau_max: int = 50
    fedveca_alpha: float = 0.95
    fedveca_beta_mode: str = "same-batch"
    fedveca_grad_subsample: int = 0
    dynamicfl_intervals: str = "a-g"
    dynamicfl_local_steps: int = 0
    dynamicfl_budget_mode: str = "dynamic"
    dynamicfl_beta: float = 0.3
    dynamicfl_server_budget: float = 0.0
    dynamicfl_n_ens: int = 10
    dynamicfl_x_star_mode: str = "paper"
    dataset: str = "fashion-mnist"
    data_dir: str = ""
    allow_download: bool = True
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    partition: str = "dirichlet"
    dirichlet_alpha: float = 0.5
    min_partition_size: int = 10
    classes_per_partition: int = 2
    shards_per_partition: int = 2
    quantity_sigma: float = 0.5
    model: str = "cnn-small"
    local_epochs: float = 2.0
    local_steps: int = 0
    batch_size: int = 32
    full_batch: bool = False
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "auto"
    eval_batch_size: int = 128
    fault_crash_prob: float = 0.0
    fault_late_prob: float = 0.0
    round_timeout: float = 3600.0
    checkpoint_every: int = 0
    resume_from: str = ""
    output_dir: str = ""

    @classmethod
    def from_user_config(cls, user_config: Mapping[str, object]) -> RunConfig:
        """Build and validate from ``context.run_config``; unknown keys are an error."""
        fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}
        unknown = sorted(set(user_config) - set(fields))
        if unknown:
            raise ConfigError(
                f"run config: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(fields)}"
            )
        values = {}
        for key, field in fields.items():
            if key in user_config:
                values[field.name] = _typed(key, user_config[key], type(field.default))
        config = cls(**values)
        config.validate()
        return config

    def to_dict(self) -> dict[str, object]:
        """Kebab-case keys, as in pyproject.toml."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self)}

    def validate(self) -> None:
        """Raise ConfigError on the first bad value."""
        _check("num-server-rounds", self.num_server_rounds, self.num_server_rounds >= 1, "an integer >= 1")
        _check("weighting", self.weighting, self.weighting in WEIGHTINGS, f"one of {', '.join(WEIGHTINGS)}")
        _check("fraction-train", self.fraction_train, 0 < self.fraction_train <= 1, "a number in (0, 1]")
        _check("fraction-evaluate", self.fraction_evaluate, 0 <= self.fraction_evaluate <= 1, "a number in [0, 1]")
        _check("min-available-nodes", self.min_available_nodes, self.min_available_nodes >= 1, "an integer >= 1")
        _check("server-lr", self.server_lr, self.server_lr > 0, "a number > 0")
        _check("proximal-mu", self.proximal_mu, self.proximal_mu >= 0, "a number >= 0")
        _check("server-momentum", self.server_momentum, 0 <= self.server_momentum < 1, "a number in [0, 1)")
        _check("straggler-fraction", self.straggler_fraction, 0 <= self.straggler_fraction <= 1,
               "a number in [0, 1]")
        _check("straggler-unit", self.straggler_unit, self.straggler_unit in STRAGGLER_UNITS,
               "steps (1..tau_i local steps) or epochs (1..E epochs, the FedProx paper)")
        _check("straggler-policy", self.straggler_policy, self.straggler_policy in ("auto",) + STRAGGLER_POLICIES,
               "auto (drop for fedavg/fedsgd, partial for fedprox/fednova), drop or partial")
        _check("fedveca-tau-max", self.fedveca_tau_max, self.fedveca_tau_max >= 2, "an integer >= 2 (paper: 50)")
        _check("fedveca-tau-init", self.fedveca_tau_init, 2 <= self.fedveca_tau_init <= self.fedveca_tau_max,
               f"an integer in [2, fedveca-tau-max={self.fedveca_tau_max}] (delta needs two local steps)")
        _check("fedveca-alpha", self.fedveca_alpha, math.isfinite(self.fedveca_alpha) and self.fedveca_alpha > 0,
               "a number > 0 (paper: 0.95; Theorem 2 needs < 1)")
        _check("fedveca-beta-mode", self.fedveca_beta_mode,
               self.fedveca_beta_mode.replace("_", "-") in FEDVECA_BETA_MODES, "same-batch or literal")
        _check("fedveca-grad-subsample", self.fedveca_grad_subsample, self.fedveca_grad_subsample >= 0,
               "an integer >= 0 (0 = the whole local set)")
        try:
            parse_interval_spec(self.dynamicfl_intervals)
            intervals_ok = True
        except ValueError:
            intervals_ok = False
        _check("dynamicfl-intervals", self.dynamicfl_intervals, intervals_ok,
               "'<high>-<low>' with levels a-g (= 1, 4, 16, 32, 64, 128, 256 steps) or step counts, high <= low "
               "(e.g. 'a-g', 'b-g', '4-300'), one level for everyone ('a' = DynamicSGD), or '<level>*' "
               "(only the high group trains)")
        _check("dynamicfl-local-steps", self.dynamicfl_local_steps, self.dynamicfl_local_steps >= 0,
               "an integer >= 0: L, local steps per round (0 = Eq. 4: sum |D_m| E / (M B))")
        _check("dynamicfl-budget-mode", self.dynamicfl_budget_mode,
               self.dynamicfl_budget_mode in DYNAMICFL_BUDGET_MODES, f"one of {', '.join(DYNAMICFL_BUDGET_MODES)}")
        _check("dynamicfl-beta", self.dynamicfl_beta, 0 <= self.dynamicfl_beta <= 1,
               "a number in [0, 1] (the paper's Dynamic-0.3 / Fix-0.3 use 0.3)")
        _check("dynamicfl-server-budget", self.dynamicfl_server_budget,
               math.isfinite(self.dynamicfl_server_budget) and self.dynamicfl_server_budget >= 0,
               "a number of bytes per round >= 0 (0 = no server budget; used by dynamicfl-budget-mode='budget')")
        _check("dynamicfl-n-ens", self.dynamicfl_n_ens, self.dynamicfl_n_ens >= 1,
               "an integer >= 1 (DynaComm's random orderings; the paper uses 10)")
        _check("dynamicfl-x-star-mode", self.dynamicfl_x_star_mode,
               self.dynamicfl_x_star_mode in DYNAMICFL_X_STAR_MODES, f"one of {', '.join(DYNAMICFL_X_STAR_MODES)}")
        try:
            check_dataset_name(self.dataset)
        except ValueError:
            _check("dataset", self.dataset, False, f"one of {', '.join(DATASET_NAMES)}")
        _check("synthetic-alpha", self.synthetic_alpha, self.synthetic_alpha >= 0, "a number >= 0")
        _check("synthetic-beta", self.synthetic_beta, self.synthetic_beta >= 0, "a number >= 0")
        _check("partition", self.partition, self.partition in PARTITION_NAMES, f"one of {', '.join(PARTITION_NAMES)}")
        _check("dirichlet-alpha", self.dirichlet_alpha, self.dirichlet_alpha > 0, "a number > 0 (smaller = more label skew)")
        _check("min-partition-size", self.min_partition_size, self.min_partition_size >= 0, "an integer >= 0")
        _check("classes-per-partition", self.classes_per_partition, self.classes_per_partition >= 1, "an integer >= 1")
        _check("shards-per-partition", self.shards_per_partition, self.shards_per_partition >= 1, "an integer >= 1")
        _check("quantity-sigma", self.quantity_sigma, self.quantity_sigma >= 0, "a number >= 0 (0 = balanced)")
        _check("model", self.model, self.model in MODEL_NAMES, f"one of {', '.join(MODEL_NAMES)}")
        _check("local-epochs", self.local_epochs, math.isfinite(self.local_epochs) and self.local_epochs > 0,
               "a number > 0: an integer >= 1 for whole epochs, or a fraction (tau_i = max(1, floor(E n_i / B)))")
        _check("local-steps", self.local_steps, self.local_steps >= 0, "an integer >= 0 (0 = use local-epochs)")
        _check("batch-size", self.batch_size, self.batch_size >= 1, "an integer >= 1 (for B = full local data set full-batch=true)")
        _check("lr", self.lr, self.lr > 0, "a number > 0")
        _check("momentum", self.momentum, 0 <= self.momentum < 1, "a number in [0, 1)")
        _check("weight-decay", self.weight_decay, self.weight_decay >= 0, "a number >= 0")
        device_ok = self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", self.device) is not None
        _check("device", self.device, device_ok, "auto, cpu, cuda or cuda:N")
        _check("data-dir", self.data_dir, self.data_dir == "" or Path(self.data_dir).is_absolute(),
               "an absolute path, or '' for the default lookup (app processes do not run in your cwd)")
        _check("eval-batch-size", self.eval_batch_size, self.eval_batch_size >= 1, "an integer >= 1")
        _check("fault-crash-prob", self.fault_crash_prob, 0 <= self.fault_crash_prob <= 1, "a number in [0, 1]")
        _check("fault-late-prob", self.fault_late_prob,
               0 <= self.fault_late_prob <= 1 - self.fault_crash_prob,
               f"a number in [0, 1 - fault-crash-prob = {1 - self.fault_crash_prob}]")
        _check("round-timeout", self.round_timeout, math.isfinite(self.round_timeout) and self.round_timeout > 0,
               "a number of seconds > 0 (how long the server waits for a round's replies)")
        _check("checkpoint-every", self.checkpoint_every, self.checkpoint_every >= 0,
               "an integer >= 0 (save a checkpoint every k rounds; 0 = never)")
        _check("resume-from", self.resume_from, self.resume_from == "" or Path(self.resume_from).is_absolute(),
               "the absolute path of a run directory holding checkpoint.pkl, or '' to start fresh")
        _check("output-dir", self.output_dir, self.output_dir == "" or Path(self.output_dir).is_absolute(),
               "an absolute path, or '' for the per-user default (app processes do not run in your cwd)")

    def resolved_output_dir(self) -> Path:
        """output-dir, or $XDG_DATA_HOME/fedhetero/runs (default ~/.local/share/fedhetero/runs)."""
        if self.output_dir:
            return Path(self.output_dir)
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "fedhetero" / "runs"


def _check(key: str, value: object, ok: bool, allowed: str) -> None:
    if not ok:
        example = f"{key}='...'" if isinstance(value, str) else f"{key}=..."
        raise ConfigError(
            f"run config: {key}={value!r} is not allowed; it must be {allowed}. "
            f"Set it with: flwr run . --run-config \"{example}\""
        )


def _typed(key: str, value: object, wanted: type) -> object:
    """Coerce TOML values to the field's type (int for float is fine, nothing else)."""
    if wanted is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if wanted is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
        raise ConfigError(
            f"run config: {key}={value!r} has type {type(value).__name__}, expected "
            f"{wanted.__name__}. Strings need quotes inside the --run-config string, e.g. "
            f"--run-config \"{key}='value'\""
        )
    return value

"""One typed, validated view of the run config ([tool.flwr.app.config]).

Every key of pyproject.toml's ``[tool.flwr.app.config]`` is a field here (kebab-case
key = snake_case field) with the same default; ``tests/test_config.py`` keeps the
two in step. Bad values raise :class:`ConfigError`, whose message names the key,
the value, what is allowed and the ``--run-config`` that fixes it.

Who checks what (each rule once):

* here: types (a run-config int fits 64 bits, a float is finite) and the keys the
  app itself reads (data, partition, model, local training, faults, run directory,
  tracking; whether the tracking packages are installed is checked by the ServerApp);
* the strategy constructors: their own parameters (``fraction-train``, ``server-lr``,
  ``fedveca-*``, ``dynamicfl-*``, ``feddyn-*``, ``moon-*``, ``lr-schedule`` and its ``lr-*``
  parameters through :class:`strategies.schedules.LRSchedule`, ...);
  :func:`fedapp.registry.build_strategy` turns their ``ValueError`` into a
  :class:`ConfigError` naming the run-config key;
* :mod:`fedapp.registry`: strategy names, which keys a strategy cannot honour, and which
  models it needs (MOON: a model with a representation).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from task.data import DATASET_NAMES, check_dataset_name
from task.model_names import MODEL_NAMES
from task.partition import PARTITION_NAMES

from .tracking import TRACKERS, tracker_names

INT64 = (-(2**63), 2**63 - 1)  # Flower's records and TOML hold 64-bit integers


class ConfigError(ValueError):
    """A run-config value is wrong; the message says which, and what to use instead."""


# names of Flower's templates and examples -> ours
FLOWER_TEMPLATE_NAMES = {"learning-rate": "lr", "fraction-fit": "fraction-train",
                         "num-rounds": "num-server-rounds", "epochs": "local-epochs"}


def _with_hint(key: str, known) -> str:
    """``key`` with the known key it most likely means: ours for a name from Flower's
    templates, the hyphenated spelling of an underscored one, else the closest by spelling."""
    guess = FLOWER_TEMPLATE_NAMES.get(key) or FLOWER_TEMPLATE_NAMES.get(key.replace("_", "-"))
    if guess is None:
        close = difflib.get_close_matches(key.replace("_", "-"), list(known), 1)
        guess = close[0] if close else None
    return f"{key} (did you mean {guess}?)" if guess in known else key


@dataclass(frozen=True)
class RunConfig:
    """The run config, typed. See README "Run-config keys" for each key's meaning.

    Defaults equal the strategy constructors' (Flower's where Flower has the parameter:
    ``min-available-nodes`` 2, ``fraction-train`` 1.0) except where commented;
    ``tests/test_config.py`` checks both.
    """

    num_server_rounds: int = 10
    strategy: str = "fedavg"
    weighting: str = "examples"
    fraction_train: float = 1.0
    fraction_evaluate: float = 0.0  # Flower's is 1.0; fedhetero evaluates on the server
    min_available_nodes: int = 2
    server_lr: float = 1.0
    proximal_mu: float = 0.01
    server_momentum: float = 0.0
    server_beta1: float = 0.9  # Flower's FedAdam / FedYogi beta_1
    server_beta2: float = 0.99  # Flower's FedAdam / FedYogi beta_2
    server_tau: float = 0.001  # Flower's FedAdam / FedYogi / FedAdagrad tau
    straggler_fraction: float = 0.0
    straggler_policy: str = "auto"
    straggler_unit: str = "steps"
    round_deadline: float = 0.0
    device_profiles: str = "none"
    device_downlink_mbps: float = 20.0
    device_uplink_mbps: float = 5.0
    device_sigma: float = 1.0
    device_rich_fraction: float = 0.3
    device_poor_factor: float = 10.0
    device_availability: float = 1.0
    device_reference_gflops: float = 1.0
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
    dynamicfl_budget_seconds: float = 0.0
    dynamicfl_n_ens: int = 10
    dynamicfl_x_star_mode: str = "paper"
    feddyn_alpha: float = 0.01  # the authors' CIFAR-10 example
    moon_mu: float = 1.0  # the MOON authors' code default
    moon_temperature: float = 0.5  # the MOON paper's default tau
    dataset: str = "fashion-mnist"
    data_dir: str = ""
    allow_download: bool = True
    normalize: bool = True
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    partition: str = "dirichlet"
    dirichlet_alpha: float = 0.5
    min_partition_size: int = 10
    classes_per_partition: int = 2
    shards_per_partition: int = 2
    quantity_sigma: float = 0.5
    partition_seed: int = -1
    model: str = "cnn-small"
    local_epochs: float = 2.0
    local_steps: int = 0
    batch_size: int = 32
    full_batch: bool = False
    lr: float = 0.1
    lr_schedule: str = "constant"
    lr_decay: float = 0.99
    lr_step_every: int = 10
    lr_min: float = 0.0001
    momentum: float = 0.0
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "auto"
    eval_batch_size: int = 128
    eval_every: int = 1
    eval_overlap: bool = True
    fault_crash_prob: float = 0.0
    fault_late_prob: float = 0.0
    round_timeout: float = 3600.0
    checkpoint_every: int = 0
    resume_from: str = ""
    output_dir: str = ""
    tracking: str = ""
    tracking_dir: str = ""

    @classmethod
    def from_user_config(cls, user_config: Mapping[str, object]) -> RunConfig:
        """Build and validate from ``context.run_config``; unknown keys are an error."""
        fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}
        unknown = sorted(set(user_config) - set(fields))
        if unknown:
            raise ConfigError(
                f"run config: unknown key(s) {', '.join(_with_hint(k, fields) for k in unknown)}; "
                f"known keys: {', '.join(fields)}"
            )
        values = {}
        for key, field in fields.items():
            if key in user_config:
                values[field.name] = _typed(key, user_config[key], field.default)
        config = cls(**values)
        config.validate()
        return config

    def to_dict(self) -> dict[str, object]:
        """Kebab-case keys, as in pyproject.toml."""
        return {f.name.replace("_", "-"): getattr(self, f.name)
                for f in dataclasses.fields(self)}

    def validate(self) -> None:
        """Raise ConfigError on the first bad value of a key the app itself reads.

        The strategies' own keys are checked by their constructors
        (:func:`fedapp.registry.build_strategy`).
        """
        self._check("num-server-rounds", self.num_server_rounds >= 1, "an integer >= 1")
        # The strategies do not check min_available_nodes (yet): a rule the app keeps.
        self._check("min-available-nodes", self.min_available_nodes >= 1, "an integer >= 1")
        # DynamicFL takes server_budget=None for "no budget" and does not check it (yet).
        self._check("dynamicfl-server-budget", self.dynamicfl_server_budget >= 0,
               "a number of bytes per round >= 0 (0 = no server budget; used by "
               "dynamicfl-budget-mode='budget')")
        try:
            check_dataset_name(self.dataset)
            dataset_ok = True
        except ValueError:
            dataset_ok = False
        self._check("dataset", dataset_ok, f"one of {', '.join(DATASET_NAMES)}")
        self._check("synthetic-alpha", self.synthetic_alpha >= 0, "a number >= 0")
        self._check("synthetic-beta", self.synthetic_beta >= 0, "a number >= 0")
        self._check("partition", self.partition in PARTITION_NAMES,
               f"one of {', '.join(PARTITION_NAMES)}")
        self._check("dirichlet-alpha", self.dirichlet_alpha > 0,
               "a number > 0 (smaller = more label skew)")
        self._check("min-partition-size", self.min_partition_size >= 0, "an integer >= 0")
        self._check("classes-per-partition", self.classes_per_partition >= 1, "an integer >= 1")
        self._check("shards-per-partition", self.shards_per_partition >= 1, "an integer >= 1")
        self._check("quantity-sigma", self.quantity_sigma >= 0, "a number >= 0 (0 = balanced)")
        self._check("partition-seed", self.partition_seed >= -1,
               f"-1 (the run's seed) or an integer in [0, {INT64[1]}]")
        self._check("partition-seed" if self.partition_seed != -1 else "seed",
                    self.partition != "dirichlet-niid-bench" or self.partition_data_seed < 2**32,
                    "below 2**32 with partition = \"dirichlet-niid-bench\" (numpy's "
                    "RandomState); NIID-Bench's tables used 2020")
        self._check("model", self.model in MODEL_NAMES, f"one of {', '.join(MODEL_NAMES)}")
        self._check("device-reference-gflops", self.device_reference_gflops > 0,
               "a number > 0: the reference device's training speed in GFLOP/s, which "
               "calibrates the simulated clock's seconds per example")
        self._check("local-epochs", self.local_epochs > 0,
               "a number > 0: an integer >= 1 for whole epochs, or a fraction "
               "(tau_i = max(1, floor(E n_i / B)))")
        self._check("local-steps", self.local_steps >= 0, "an integer >= 0 (0 = use local-epochs)")
        self._check("batch-size", self.batch_size >= 1,
               "an integer >= 1 (for B = full local data set full-batch=true)")
        self._check("lr", self.lr > 0, "a number > 0")
        self._check("momentum", 0 <= self.momentum < 1, "a number in [0, 1)")
        self._check("weight-decay", self.weight_decay >= 0, "a number >= 0")
        self._check("seed", self.seed >= 0,
               f"an integer in [0, {INT64[1]}] (numpy's seeding takes no negative seed)")
        device_ok = (self.device in ("auto", "cpu", "cuda")
                     or re.fullmatch(r"cuda:\d+", self.device) is not None)
        self._check("device", device_ok, "auto, cpu, cuda or cuda:N")
        self._check("data-dir", _abs_or_empty(self.data_dir),
               "an absolute path, or '' for the default lookup (app processes do not run "
               "in your cwd)")
        self._check("eval-batch-size", self.eval_batch_size >= 1, "an integer >= 1")
        self._check("eval-every", self.eval_every >= 1,
               "an integer >= 1 (evaluate rounds 0, k, 2k, ... and the last; 1 = every round)")
        self._check("fault-crash-prob", 0 <= self.fault_crash_prob <= 1, "a number in [0, 1]")
        self._check("fault-late-prob", 0 <= self.fault_late_prob <= 1 - self.fault_crash_prob,
               f"a number in [0, 1 - fault-crash-prob = {1 - self.fault_crash_prob}]")
        self._check("round-timeout", self.round_timeout > 0,
               "a number of seconds > 0 (how long the server waits for a round's replies)")
        self._check("checkpoint-every", self.checkpoint_every >= 0,
               "an integer >= 0 (save a checkpoint every k rounds; 0 = never)")
        self._check("resume-from", _abs_or_empty(self.resume_from),
               "the absolute path of a run directory holding checkpoint.pkl, or '' to start "
               "fresh")
        self._check("output-dir", _abs_or_empty(self.output_dir),
               "an absolute path, or '' for the per-user default (app processes do not run "
               "in your cwd)")
        self._check("tracking", _names_trackers(self.tracking),
               f"'' (off) or one or more of {', '.join(TRACKERS)}, comma-separated")
        self._check("tracking-dir", _abs_or_empty(self.tracking_dir),
               "an absolute path, or '' for the run directory (app processes do not run in "
               "your cwd)")

    @property
    def partition_data_seed(self) -> int:
        """The seed of the partition: ``partition-seed``, or the run's ``seed`` at -1 (so a
        sweep can keep one partition across seeds, as NIID-Bench's tables did)."""
        return self.seed if self.partition_seed == -1 else self.partition_seed

    def resolved_output_dir(self) -> Path:
        """output-dir, or $XDG_DATA_HOME/fedhetero/runs (default ~/.local/share/fedhetero/runs)."""
        if self.output_dir:
            return Path(self.output_dir)
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "fedhetero" / "runs"

    def _check(self, key: str, ok: bool, allowed: str) -> None:
        if not ok:
            raise ConfigError(
                f"run config: {key}={self.to_dict()[key]!r} is not allowed; it must be "
                f"{allowed}. Set it with: {flwr_run_fix({key: default(key)})}"
            )


def default(key: str) -> object:
    """The default of run-config ``key`` (pyproject.toml's value)."""
    return getattr(RunConfig(), key.replace("-", "_"))


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


def _names_trackers(value: str) -> bool:
    try:
        tracker_names(value)
    except ValueError:
        return False
    return True


def _abs_or_empty(path: str) -> bool:
    return path == "" or Path(path).is_absolute()


def _typed(key: str, value: object, default_value: object) -> object:
    """Coerce a TOML value to the field's type (int for float is fine, nothing else)."""
    wanted = type(default_value)
    if wanted is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if wanted is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, wanted) or (wanted is not bool and isinstance(value, bool)):
        hint = " Strings need quotes inside the --run-config string." if wanted is str else ""
        raise ConfigError(
            f"run config: {key}={value!r} has type {type(value).__name__}, expected "
            f"{wanted.__name__}.{hint} Set it with: {flwr_run_fix({key: default_value})}"
        )
    if wanted is float and not math.isfinite(value):
        raise ConfigError(f"run config: {key}={value!r} is not allowed; it must be a finite "
                          f"number. Set it with: {flwr_run_fix({key: default_value})}")
    if wanted is int and not INT64[0] <= value <= INT64[1]:
        raise ConfigError(f"run config: {key}={value!r} is not allowed; it must fit in 64 "
                          f"bits. Set it with: {flwr_run_fix({key: default_value})}")
    return value

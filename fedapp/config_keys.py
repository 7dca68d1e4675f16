"""The run-config keys, each declared once: name, type (its default's), default, what is
allowed, which strategies read it, and one line of doc.

Everything else comes from this table: :class:`fedapp.config.RunConfig` (fields, defaults,
validation, messages), the docs' run-config keys table, docs/config.md (``python -m
fedapp.config_docs``), whose links (``strategies/fedveca.md``, ``clock.md#trace-format``, ...)
are relative to docs/.
pyproject.toml's ``[tool.flwr.app.config]`` (which Flower reads) is checked against it by a
test, and so are the strategy constructors: a value the table accepts, the strategies that
read it accept; one it refuses, they refuse (tests/test_config_keys.py).

What is allowed is declared, never found out by building strategies:

* per key, an :class:`Interval` (numbers), ``choices`` (names) or a ``check`` (a parser
  that raises ``ValueError``: interval specs, paths, dataset names);
* :class:`Only`: the values a key may take with given strategies (keys a strategy cannot
  honour, with why);
* :data:`RULES`: conditions across keys (``fedveca-tau-init`` <= ``fedveca-tau-max``, ...).

``used_by`` names the strategies whose wiring in :mod:`fedapp.registry` reads the key, and
``app`` where the app itself (data, client training, ServerApp) does. The strategy names
are those of :data:`fedapp.registry.STRATEGIES` (a test keeps :data:`ALL` equal to them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from strategies import SELECTIONS, STRAGGLER_POLICIES, STRAGGLER_UNITS, WEIGHTINGS
from strategies.engine.async_tasks import ARRIVAL_ORDERS
from strategies.engine.devices import FLEETS
from strategies.algorithms.dynacomm import BUDGET_MODES
from strategies.algorithms.dynamicfl_schedule import X_STAR_MODES, parse_interval_spec
from strategies.algorithms.fedveca_math import BETA_MODES, TAU_MIN, normalise_beta_mode
from strategies.engine.schedules import DECAYING, SCHEDULES
from strategies.algorithms.staleness import STALENESS_FUNCTIONS
from task.data import DATASET_NAMES, check_dataset_name
from task.model_names import MODEL_NAMES, REPRESENTATION_MODELS, WIDTH_MODELS
from task.partition import PARTITION_NAMES

from .tracking import TRACKERS, tracker_names

Value = bool | int | float | str

APP = "app"
WIDTH = ("heterofl", "fjord", "fedrolex")  # width-heterogeneous sub-models
FEDAVG_FAMILY = ("fedavg", "fedsgd", "fedprox", "fednova", "fedveca", "scaffold", "feddyn", "moon",
                 *WIDTH)
DYNAMICFL = ("dynamicfl", "dynamicsgd")
OURS = FEDAVG_FAMILY + DYNAMICFL
ASYNC = ("fedbuff", "fedasync")
CLOCKED = OURS + ASYNC  # the strategies with a simulated clock
FEDOPT = ("fedadam", "fedyogi", "fedadagrad")
FLOWER = ("fedavgm", *FEDOPT)  # Flower's own classes (strategies.algorithms.flower_optimizers)
ALL = OURS + ASYNC + FLOWER
SUMMARIES = {  # strategy -> one line (``fedhetero strategies``)
    "fedavg": "Federated Averaging (McMahan et al. 2017, Alg. 1), with weighting, sampling, "
              "stragglers, clock and selection options",
    "fedsgd": "FedSGD (McMahan et al. 2017, Sec. 2): one full-batch gradient step per client",
    "fedprox": "FedProx (Li et al. 2020): proximal term mu; stragglers' partial work kept",
    "fednova": "FedNova (Wang et al. 2020, eq. 6): averaging normalised by each client's "
               "local steps",
    "fedveca": "FedVeca (Luo et al.): per-client adaptive local steps from bi-directional "
               "vectors (client helper)",
    "dynamicfl": "DynamicFL (Le et al., Alg. 1): clients with the bandwidth sync often, the "
                 "rest rarely (client helper)",
    "dynamicsgd": "DynamicSGD (Le et al.): every active client syncs after every local step",
    "scaffold": "SCAFFOLD (Karimireddy et al. 2020, Alg. 1, option II): control variates "
                "(client helper)",
    "feddyn": "FedDyn (Acar et al. 2021, Alg. 1): dynamic regulariser (client helper)",
    "moon": "MOON (Li, He and Song 2021, Alg. 1): model-contrastive loss (client helper, a "
            "representation model)",
    "heterofl": "HeteroFL (Diao, Ding and Tarokh 2021): static sub-models of per-client widths, "
                "overlap averaging (client helper)",
    "fjord": "FjORD (Horvath et al. 2021): ordered dropout up to each client's width "
             "(client helper)",
    "fedrolex": "FedRolex (Alam et al. 2022): rolling sub-model windows of per-client widths "
                "(client helper)",
    "fedbuff": "FedBuff (Nguyen et al. 2022): buffered asynchronous aggregation, "
               "staleness-weighted",
    "fedasync": "FedAsync (Xie, Koyejo and Gupta 2019): each arriving model mixed in, "
                "staleness-weighted",
    "fedavgm": "Flower's FedAvgM (Hsu et al. 2019): server momentum",
    "fedadam": "Flower's FedAdam (Reddi et al. 2021, Alg. 2)",
    "fedyogi": "Flower's FedYogi (Reddi et al. 2021, Alg. 2)",
    "fedadagrad": "Flower's FedAdagrad (Reddi et al. 2021, Alg. 2)",
}
INT64_MAX = 2**63 - 1  # Flower's records and TOML hold 64-bit integers
NIID_BENCH_SEEDS = 2**32  # numpy's legacy RandomState takes seeds below 2**32


@dataclass(frozen=True)
class Interval:
    """The numbers from ``low`` to ``high`` (None: unbounded), each end closed or open."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def __contains__(self, value: float) -> bool:
        low_ok = self.low is None or (value > self.low if self.open_low else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.open_high else
                                        value <= self.high)
        return low_ok and high_ok

    def words(self, integer: bool) -> str:
        """``an integer >= 1``, ``a number in (0, 1]``, ..."""
        noun = "an integer" if integer else "a number"
        show = str if integer else "{:g}".format
        if self.high is None:
            return f"{noun} {'>' if self.open_low else '>='} {show(self.low)}"
        return (f"{noun} in {'(' if self.open_low else '['}{show(self.low)}, "
                f"{show(self.high)}{')' if self.open_high else ']'}")


def at_least(low: float) -> Interval:
    return Interval(low)


def above(low: float) -> Interval:
    return Interval(low, open_low=True)


UNIT = Interval(0.0, 1.0)  # [0, 1]
FRACTION = Interval(0.0, 1.0, open_low=True)  # (0, 1]
BELOW_ONE = Interval(0.0, 1.0, open_high=True)  # [0, 1)


@dataclass(frozen=True)
class Only:
    """With ``strategies``, the key may only take ``values`` (the first is the fix unless
    the default is among them); ``why`` says what the strategy cannot honour."""

    strategies: tuple[str, ...]
    values: tuple[Value, ...]
    why: str


@dataclass(frozen=True)
class Key:
    """One run-config key. ``note`` follows the allowed values in messages and docs (what a
    special value means, or, with ``check``, what the check allows)."""

    name: str
    default: Value
    doc: str
    used_by: tuple[str, ...] = (APP,)
    interval: Interval | None = None
    choices: tuple[str, ...] = ()
    check: Callable[[object], object] | None = None
    note: str = ""
    only: tuple[Only, ...] = ()

    @property
    def type(self) -> type:
        return type(self.default)

    @property
    def field(self) -> str:
        """The :class:`~fedapp.config.RunConfig` field: kebab-case key -> snake_case."""
        return self.name.replace("-", "_")

    def allowed(self) -> str:
        """What the key accepts, in words (for messages and the docs)."""
        if self.interval is not None:
            said = self.interval.words(self.type is int)
        elif self.choices:
            said = f"one of {', '.join(self.choices)}"
        else:
            said = ""
        return " ".join(part for part in (said, self.note) if part) or f"a {self.type.__name__}"

    def refusal(self, value: Value) -> str | None:
        """None if ``value`` (already of the key's type) is allowed, else why not ('' when
        the allowed values say it all)."""
        if self.interval is not None and value not in self.interval:
            return ""
        if self.choices and value not in self.choices:
            return ""
        if self.check is not None:
            try:
                self.check(value)
            except ValueError as exc:
                return str(exc)
        return None


@dataclass(frozen=True)
class Rule:
    """A condition across ``keys`` (kebab-case values in, True when it holds)."""

    keys: tuple[str, ...]
    holds: Callable[[Mapping[str, Value]], bool]
    allowed: str


def _absolute_or_empty(path: str) -> None:
    if path and not Path(path).is_absolute():
        raise ValueError("not an absolute path (app processes do not run in your cwd)")


def _device(name: str) -> None:
    if not (name in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:[0-9]+", name)):
        raise ValueError("not a torch device name")


def width_levels(value: str) -> tuple[float, ...]:
    """``width-levels`` as numbers: comma-separated, each in (0, 1], at least one."""
    try:
        levels = tuple(float(part) for part in value.split(","))
    except ValueError:
        raise ValueError("not comma-separated numbers, e.g. \"1,0.5,0.25\"") from None
    if not all(0.0 < level <= 1.0 for level in levels):
        raise ValueError("every width must be in (0, 1]")
    return levels


def _device_profiles(value: str) -> None:
    if value == "none" or value in FLEETS:
        return
    if not (Path(value).is_absolute() and Path(value).suffix.lower() in (".csv", ".json")):
        raise ValueError("neither a fleet nor the absolute path of a .csv / .json trace")


# Why a strategy cannot honour a key
FEDNOVA_WHY = "FedNova's eq. (5) weights clients by num-examples"
FEDVECA_WHY = ("FedVeca's clients run plain local SGD (eq. 1) and its server step is "
               "FedNova's eq. (5) with the tau it sets itself")
DYNAMICFL_WHY = ("every active client does exactly L local steps and each sync event sets W "
                 "to the num-examples-weighted average")
SCAFFOLD_WHY = "SCAFFOLD's server step is x + eta_g mean delta y_i, Alg. 1 line 17"
FEDDYN_WHY = "FedDyn's server model is the mean of the theta_k minus h / alpha, Alg. 1"
MOON_WHY = "MOON's server is FedAvg's weighted average, Alg. 1"
FLOWER_WHY = ("Flower's own class: it weights by num-examples, has no simulated stragglers or "
              "simulated clock and sends lr as given")
FEDOPT_WHY = FLOWER_WHY + "; beta_1 is its momentum (server-beta1)"
ADAGRAD_WHY = "FedAdagrad has no beta_1 / beta_2 (Reddi et al., Alg. 2)"
ASYNC_WHY = ("an asynchronous strategy keeps async-concurrency clients training and waits for "
             "no round: no per-round sampling, stragglers, deadline or lr schedule")
FEDBUFF_WHY = "FedBuff's server step averages the buffer, 1/K sum of the weighted updates"
FEDASYNC_WHY = "FedAsync's server step is its mixing weight fedasync-alpha (Xie et al., Alg. 1)"
DYNAMICFL_SELECTION_WHY = ("DynamicFL samples its active clients uniformly and DynaComm forms "
                           "its groups from that sample (Le et al., Alg. 1)")
FLOWER_SELECTION_WHY = "Flower's own class samples clients uniformly (its ClientManager)"
WIDTH_WHY = ("the clients train sub-models of different shapes; the overlap average counts "
             "each client holding an entry once ('uniform', HeteroFL's and FedRolex's code) or "
             "by its examples ('examples', FjORD's)")
SELECTING = FEDAVG_FAMILY + ASYNC  # the strategies that take a selection policy

NO_SERVER_MOMENTUM = (Only(("fedveca",), (0.0,), FEDVECA_WHY),
                      Only(DYNAMICFL, (0.0,), DYNAMICFL_WHY),
                      Only(("scaffold",), (0.0,), SCAFFOLD_WHY),
                      Only(("feddyn",), (0.0,), FEDDYN_WHY), Only(("moon",), (0.0,), MOON_WHY),
                      Only(FEDOPT, (0.0,), FEDOPT_WHY), Only(("fedasync",), (0.0,), FEDASYNC_WHY))

KEYS: tuple[Key, ...] = (
    Key("num-server-rounds", 10, "federated rounds (T of the cosine lr-schedule)",
        (APP, *OURS), at_least(1)),
    Key("strategy", "fedavg",
        "`fedavg`; `fedsgd` (FedAvg preset with E = 1 and B = full local data, McMahan et al.); "
        "`fedprox` (Li et al. MLSys'20); `fednova` (Wang et al. NeurIPS'20); `scaffold` "
        "(Karimireddy et al. ICML'20, Algorithm 1 with option II: [client state]"
        "(your-project.md#client-state-that-survives-a-resume-lost-replies-and-restarts)); "
        "`feddyn` (Acar et "
        "al. ICLR'21, Algorithm 1: each client's linear term kept as client state, the server "
        "state h); `moon` (Li, He and Song CVPR'21: the model-contrastive loss against the "
        "global and the client's previous local model, kept as client state; needs a `model` "
        "with a projection head); `fedveca` (Luo et al., adaptive per-client τ: "
        "[FedVeca](strategies/fedveca.md)); `dynamicfl` and `dynamicsgd` (DynaComm grouping, "
        "two sync frequencies: [DynamicFL](strategies/dynamicfl.md)); `fedavgm`, `fedadam`, "
        "`fedyogi`, `fedadagrad` (Flower's own classes: [Flower's server optimisers]"
        "(strategies/fedavg.md#flowers-server-optimisers-by-name)); asynchronous: `fedbuff` "
        "(Nguyen et al. "
        "AISTATS'22), `fedasync` (Xie, Koyejo and Gupta 2019) "
        "([asynchronous FL](strategies/async.md)); width-heterogeneous sub-models: `heterofl` "
        "(Diao, Ding and Tarokh ICLR'21), `fjord` (Horváth et al. NeurIPS'21), `fedrolex` (Alam "
        "et al. NeurIPS'22) ([model width](strategies/width.md))",
        choices=ALL),
    Key("weighting", "examples",
        "aggregation scheme: `examples` n_k/m_t over the sampled clients (McMahan et al. Alg. 1 "
        "with its erratum); `uniform` 1/|S| (SCAFFOLD's Algorithm 1; FedDyn's 1/|P_t| mean of "
        "the θ_k); `pre-erratum` n_k/n over all clients, unsampled ones keep the old model; "
        "`scheme-i` K draws with replacement ∝ p_k, plain mean (Li et al. ICLR'20); "
        "`scheme-ii` K of N uniformly, weights p_k·N/K (Li et al. ICLR'20, applied to updates)",
        FEDAVG_FAMILY, choices=WEIGHTINGS,
        only=(Only(("fednova",), ("examples",), FEDNOVA_WHY),
              Only(("fedveca",), ("examples",), FEDVECA_WHY),
              Only(("scaffold", "feddyn"), ("examples", "uniform"),
                   "SCAFFOLD and FedDyn average over the sampled clients: 'examples' "
                   "(NIID-Bench's form) or 'uniform' (Algorithm 1)"),
              Only(DYNAMICFL, ("examples",), DYNAMICFL_WHY),
              Only(WIDTH, ("examples", "uniform"), WIDTH_WHY),
              Only(FLOWER, ("examples",), FLOWER_WHY),
              Only(("fedbuff",), ("examples",), FEDBUFF_WHY),
              Only(("fedasync",), ("examples",), FEDASYNC_WHY))),
    Key("fraction-train", 1.0, "C: fraction of clients sampled per round, m = max(⌊C·K⌋, 1)",
        OURS + FLOWER, FRACTION, only=(Only(ASYNC, (1.0,), ASYNC_WHY),)),
    Key("fraction-evaluate", 0.0,
        "fraction of clients asked to evaluate the global model on their own data (0 = off; "
        "the server always evaluates on the test set). The constructors' default is Flower's "
        "1.0; the app's is 0.0 because it evaluates on the server", ALL, UNIT),
    Key("min-available-nodes", 2, "wait for this many connected nodes before sampling",
        ALL, at_least(1)),
    Key("server-lr", 1.0,
        "eta_g: w ← w + eta_g·Σ c_k (w_k − w); 1.0 is plain averaging (FedAvg family, "
        "SCAFFOLD's global step size eta_g; FedAvgM's server learning rate). For `fedadam`, "
        "`fedyogi`, `fedadagrad` it is η of Reddi et al.'s Algorithm 2, where 1.0 is rarely "
        "right (Flower's defaults: 0.1, 0.01, 0.1; a warning says so)",
        FEDAVG_FAMILY + FLOWER + ("fedbuff",), above(0.0),
        only=(Only(("fedveca",), (1.0,), FEDVECA_WHY),
              Only(("feddyn",), (1.0,), FEDDYN_WHY), Only(DYNAMICFL, (1.0,), DYNAMICFL_WHY),
              Only(("fedasync",), (1.0,), FEDASYNC_WHY))),
    Key("proximal-mu", 0.01,
        "FedProx's mu: clients minimise F_k(w) + (mu/2)·‖w − w_t‖² (0 = FedAvg exactly)",
        ("fedprox",), at_least(0.0)),
    Key("server-momentum", 0.0,
        "FedNova's optional server momentum, FedBuff's (m ← β·m + Δ̄, x ← x + η_g·m), and "
        "FedAvgM's momentum", ("fednova", "fedveca", "fedbuff", "fedavgm"), BELOW_ONE,
        only=NO_SERVER_MOMENTUM),
    Key("server-beta1", 0.9, "β₁ of `fedadam` and `fedyogi` (Flower's default)",
        ("fedadam", "fedyogi"), BELOW_ONE, only=(Only(("fedadagrad",), (0.9,), ADAGRAD_WHY),)),
    Key("server-beta2", 0.99, "β₂ of `fedadam` and `fedyogi` (Flower's default)",
        ("fedadam", "fedyogi"), BELOW_ONE, only=(Only(("fedadagrad",), (0.99,), ADAGRAD_WHY),)),
    Key("server-tau", 0.001, "τ of `fedadam`, `fedyogi`, `fedadagrad` (Flower's default)",
        FEDOPT, above(0.0)),
    Key("straggler-fraction", 0.0,
        "simulated system heterogeneity: each round ⌊f·m⌋ of the m sampled clients (seeded) "
        "are stragglers that do only part of their local work, uniform in 1..τ_i steps "
        "(τ_i = `local-steps`, or ⌊E·n_i/B⌋)", FEDAVG_FAMILY, UNIT,
        only=(Only(("fedveca",), (0.0,), FEDVECA_WHY), Only(DYNAMICFL, (0.0,), DYNAMICFL_WHY),
              Only(FLOWER, (0.0,), FLOWER_WHY), Only(ASYNC, (0.0,), ASYNC_WHY))),
    Key("straggler-policy", "auto",
        "`drop` (FedAvg in the FedProx paper: stragglers are not waited for, nothing is sent to "
        "them), `partial` (their partial updates are aggregated), or `auto` = `drop` for "
        "fedavg/fedsgd/moon and `partial` for fedprox/fednova/fedveca/scaffold/feddyn "
        "(SCAFFOLD's option II divides by the steps a client actually took; a FedDyn "
        "straggler's model after its reduced work updates its linear term)",
        FEDAVG_FAMILY, choices=("auto", *STRAGGLER_POLICIES)),
    Key("straggler-unit", "steps",
        "a straggler's reduced work: `steps` = uniform in 1..τ_i steps; `epochs` = uniform in "
        "1..E whole epochs (the FedProx paper's x ~ U[1, E])",
        FEDAVG_FAMILY, choices=STRAGGLER_UNITS),
    Key("round-deadline", 0.0,
        "D, simulated seconds per round (needs `device-profiles`): a client whose work does not "
        "fit does the steps that fit, aggregated under `straggler-policy` `partial` (FedProx, "
        "FedNova, FedVeca), not sent work under `drop` (FedAvg); the realistic alternative to "
        "`straggler-fraction` (not both). [simulated clock](clock.md)",
        FEDAVG_FAMILY, at_least(0.0), note="(0 = wait for every reply)",
        only=(Only(DYNAMICFL, (0.0,), DYNAMICFL_WHY), Only(ASYNC, (0.0,), ASYNC_WHY))),
    Key("over-commitment", 0.0,
        "o: sample ⌈(1 + o)·m⌉ clients and close the round at the first m replies on the "
        "simulated clock (needs `device-profiles`; FedScale's and Oort's over-commitment, 0.3 "
        "there); the later replies are left out and logged as `clients-late`",
        FEDAVG_FAMILY, Interval(0.0, 10.0), note="(0 = off)",
        only=(Only(DYNAMICFL, (0.0,), DYNAMICFL_WHY), Only(ASYNC, (0.0,), ASYNC_WHY))),
    Key("selection", "random",
        "who trains: `random` (uniform), `oort` (Lai et al. 2021, Alg. 1: loss-based utility × "
        "clock-time penalty, pacer, decaying exploration), `power-of-choice` (Cho et al. 2022: "
        "the m largest losses of d candidates, asked with evaluate messages), `tifl` (Chai et "
        "al. 2020: speed tiers, adaptive tier probabilities); `oort` and `tifl` need "
        "`device-profiles`; FedBuff / FedAsync draw each freed slot with it. Logs "
        "`selection-chosen` and the policy's inputs per round "
        "([client selection](strategies/selection.md))", SELECTING, choices=SELECTIONS,
        only=(Only(DYNAMICFL, ("random",), DYNAMICFL_SELECTION_WHY),
              Only(FLOWER, ("random",), FLOWER_SELECTION_WHY))),
    Key("oort-preferred-duration", 0.0,
        "Oort's T, the developer-preferred round duration in simulated seconds: slower "
        "clients' utility × (T / t_i)²; the pacer relaxes T when utility stalls",
        SELECTING, at_least(0.0), note="(0 = the median expected time of the first round's "
        "candidates)"),
    Key("poc-candidates", 0, "Power-of-Choice's d, candidates asked for their loss per round "
        "(at least m)", SELECTING, at_least(0), note="(0 = 2m)"),
    Key("tifl-tiers", 5, "TiFL's number of speed tiers (each gets ⌈num-server-rounds / tiers⌉ "
        "credits in the FedAvg family)", SELECTING, at_least(1)),
    Key("device-profiles", "none",
        "the simulated clock's fleet, per partition: `none` (no clock), `homogeneous`, "
        "`lognormal`, `two-tier` (DynamicFL's rich / poor), `tiers` (`device-tiers` compute "
        "tiers 1, 1/2, 1/4, ...), or the absolute path of a `.csv` / "
        "`.json` device trace ([format](clock.md#trace-format)); logs `sim-seconds` and "
        "`sim-elapsed` per round", CLOCKED, check=_device_profiles,
        note=f"none, {', '.join(FLEETS)}, or the absolute path of a .csv / .json device trace",
        only=(Only(FLOWER, ("none",), FLOWER_WHY),)),
    Key("device-downlink-mbps", 20.0, "the reference (median) downlink bandwidth, Mbit/s",
        CLOCKED, above(0.0)),
    Key("device-uplink-mbps", 5.0, "the reference (median) uplink bandwidth, Mbit/s",
        CLOCKED, above(0.0)),
    Key("device-sigma", 1.0, "`lognormal`: σ of log speed and log bandwidths",
        CLOCKED, at_least(0.0)),
    Key("device-rich-fraction", 0.3, "`two-tier`: probability that a partition is rich",
        CLOCKED, UNIT),
    Key("device-poor-factor", 10.0,
        "`two-tier`: how many times slower a poor device computes and transfers",
        CLOCKED, at_least(1.0)),
    Key("device-tiers", 5,
        "`tiers`: T compute tiers, partition p at 2^−(p mod T) of the reference speed (5: 1, "
        "1/2, 1/4, 1/8, 1/16), the reference bandwidths", CLOCKED, at_least(1)),
    Key("device-availability", 1.0, "probability that a generated device is online in a round "
        "(offline devices are not sampled)", CLOCKED, UNIT),
    Key("device-reference-gflops", 1.0,
        "training speed of the speed-1 device, GFLOP/s: the seconds per example are the "
        "model's training FLOPs (3 × 2 × forward MACs) / this", interval=above(0.0)),
    Key("drift-diagnostics", True,
        "log client drift each round: per layer the mean pairwise cosine similarity of the "
        "client updates (the IID→non-IID study's Fig. 13) and the spread of the update norms",
        tuple(s for s in OURS if s not in WIDTH), note="(not for the width strategies: "
        "their clients send sub-models of different shapes)"),
    Key("width-levels", "1,0.5,0.25,0.125,0.0625",
        "the widths r a client of `heterofl`, `fjord` or `fedrolex` can train, comma-separated "
        "(HeteroFL's 1, 1/2, ..., 1/16); each client's model keeps ⌈r·K⌉ units of every hidden "
        "layer", WIDTH, check=lambda v: width_levels(v), note="(numbers in (0, 1])"),
    Key("width-rule", "auto",
        "how a client's width is chosen: `deadline` (the largest level whose time on the "
        "simulated clock, with its own sub-model's bytes and FLOPs, fits `round-deadline`), "
        "`fixed` (partition p trains level p mod L), `dynamic` (a fresh draw per round); `auto` "
        "= `deadline` with a `round-deadline`, else `fixed`", WIDTH,
        choices=("auto", "deadline", "fixed", "dynamic")),
    Key("width-scaler", "auto",
        "HeteroFL's Scaler (outputs divided by r in training): `on`, `off`; `auto` = on for "
        "`heterofl`, off for `fjord` and `fedrolex`", WIDTH, choices=("auto", "on", "off")),
    Key("fedveca-tau-init", 20, "FedVeca's τ of rounds 0 and 1 ([FedVeca]"
        "(strategies/fedveca.md))", ("fedveca",), at_least(TAU_MIN),
        note="(δ needs two local steps)"),
    Key("fedveca-tau-max", 50, "FedVeca's cap on every τ", ("fedveca",), at_least(TAU_MIN)),
    Key("fedveca-alpha", 0.95, "FedVeca's α of eq. (15)", ("fedveca",), above(0.0)),
    Key("fedveca-beta-mode", "same-batch",
        "FedVeca's client estimator of β: `same-batch` or `literal` (Alg. 2)", ("fedveca",),
        check=normalise_beta_mode, note=f"{' or '.join(BETA_MODES)} (same_batch = same-batch)"),
    Key("fedveca-grad-subsample", 0, "examples for ∇F_i(w_k) (0 = the whole local set)",
        ("fedveca",), at_least(0)),
    Key("dynamicfl-intervals", "a-g",
        "DynamicFL's `<high>-<low>` sync levels a–g = 1, 4, 16, 32, 64, 128, 256 steps (capped "
        "at L), `x` (everyone at x), `x*` (only the high group trains), or step counts "
        "(`\"4-300\"`) ([DynamicFL](strategies/dynamicfl.md))", ("dynamicfl",),
        check=parse_interval_spec, note="'x-y' (high <= low), 'x' or 'x*', x and y in a-g or "
        "step counts >= 1"),
    Key("dynamicfl-local-steps", 0, "L, local steps per round (0 = the paper's Eq. 4)",
        DYNAMICFL, at_least(0)),
    Key("dynamicfl-budget-mode", "dynamic",
        "`dynamic` (k_max = ⌊β·|active|⌋), `fix` (⌈β·M⌉ rich clients), `budget` (per-node "
        "`comm-budget` + server budget), `none`", DYNAMICFL, choices=BUDGET_MODES),
    Key("dynamicfl-beta", 0.3, "β of `dynamic` and `fix`", DYNAMICFL, UNIT),
    Key("dynamicfl-server-budget", 0.0,
        "server bytes per round (Eq. 5) in `budget` mode (0 = none)", DYNAMICFL, at_least(0.0)),
    Key("dynamicfl-budget-seconds", 0.0,
        "> 0: in `budget` mode each client's τ_m is the bytes its profile's bandwidth moves in "
        "this many seconds of transfer per round (needs `device-profiles`); 0 = the "
        "`comm-budget` nodes report", DYNAMICFL, at_least(0.0)),
    Key("dynamicfl-n-ens", 10, "DynaComm's random orderings", DYNAMICFL, at_least(1)),
    Key("dynamicfl-x-star-mode", "paper",
        "the `x*` ablation's low group: `paper` (dropped) or `code` (enters the final average "
        "unchanged)", DYNAMICFL, choices=X_STAR_MODES),
    Key("feddyn-alpha", 0.01,
        "FedDyn's α: clients minimise L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖²; the "
        "server sends θ^t = mean θ_k − h^t/α (0.01: the authors' CIFAR-10 example)",
        ("feddyn",), above(0.0)),
    Key("moon-mu", 1.0,
        "MOON's μ, the weight of the contrastive loss in ℓ_sup + μ ℓ_con (Eq. 4; 1 is the "
        "authors' code default, the paper tunes {0.1, 1, 5, 10}: 5 best on CIFAR-10, 1 on "
        "CIFAR-100); 0 = FedAvg on the same model", ("moon",), at_least(0.0)),
    Key("moon-temperature", 0.5, "MOON's temperature τ of Eq. 3 (the paper's default)",
        ("moon",), above(0.0)),
    Key("async-concurrency", 20,
        "clients training at once in `fedbuff` / `fedasync` (FedBuff's concurrency); a freed "
        "client's slot goes at once to an idle online client with the newest model",
        ASYNC, at_least(1)),
    Key("async-arrival", "simulated",
        "order in which `fedbuff` / `fedasync` apply replies: `simulated` (by simulated "
        "completion time on the device profiles, first sent first applied without them: "
        "deterministic, the same in simulation and deployment, resumable bit for bit) or "
        "`real-time` (as they arrive; not reproducible)", ASYNC, choices=ARRIVAL_ORDERS),
    Key("async-staleness", "auto",
        "s(τ), the weight of an update τ model versions old: `fedbuff` 1/√(1+τ), `constant`, "
        "`polynomial` (τ+1)^−0.5, `hinge` (1 for τ ≤ 4, else 1/(10(τ−4)+1)); `auto` = `fedbuff` "
        "for `fedbuff`, `polynomial` for `fedasync`", ASYNC,
        choices=("auto", *STALENESS_FUNCTIONS)),
    Key("fedbuff-buffer-size", 10, "K, client updates per FedBuff server step (one round)",
        ("fedbuff",), at_least(1)),
    Key("fedasync-alpha", 0.6, "FedAsync's α: x ← (1 − α·s(τ))·x + α·s(τ)·x_client",
        ("fedasync",), Interval(0.0, 1.0, open_low=True)),
    Key("fedasync-updates-per-round", 10,
        "client updates FedAsync mixes in per round (each round is evaluated; 10 = as much "
        "client work per round as FedBuff's K = 10)", ("fedasync",), at_least(1)),
    Key("fedasync-rho", 0.0, "FedAsync's proximal ρ, sent to clients as `proximal-mu` "
        "(0 = not sent)", ("fedasync",), at_least(0.0)),
    Key("dataset", "fashion-mnist",
        "`fashion-mnist`, `mnist`, `cifar10`, `cifar100`, `synthetic` (FedProx's "
        "Synthetic(α, β)), or `hf:<hub-id>` (a Hugging Face image dataset via flwr-datasets; "
        "needs the network on first use)", check=check_dataset_name,
        note=f"one of {', '.join(DATASET_NAMES)}"),
    Key("data-dir", "",
        "absolute folder to look in first (\"\" = Fashion-MNIST lookup order: "
        "`/usr/share/datasets/fashion-mnist`, then download to `~/.cache/fedhetero/data`)",
        check=_absolute_or_empty, note="an absolute path, or '' for the default lookup"),
    Key("allow-download", True, "allow torchvision downloads when the files are not found"),
    Key("normalize", True,
        "standardise image pixels with the training set's per-channel mean and std; `false`: "
        "pixels in [0, 1] (torchvision's `ToTensor()`, NIID-Bench's preprocessing)"),
    Key("synthetic-alpha", 1.0, "α of Synthetic(α, β)", interval=at_least(0.0)),
    Key("synthetic-beta", 1.0, "β of Synthetic(α, β)", interval=at_least(0.0)),
    Key("partition", "dirichlet",
        "`iid`; `dirichlet` (label skew, Dir(α)); `dirichlet-niid-bench` (the same rule drawn "
        "as NIID-Bench's code draws it, numpy's legacy `RandomState`); `classes` (#C = k labels "
        "per client); `shards` (McMahan: sort by label, 2 shards per client); `quantity-skew` "
        "(IID labels, log-normal sizes); `fedveca-case1/2/3` (FedVeca's cases); `natural` (one "
        "natural group per client, e.g. Synthetic's devices)", choices=PARTITION_NAMES),
    Key("dirichlet-alpha", 0.5, "α of `dirichlet` and `dirichlet-niid-bench`; smaller = more "
        "skew", interval=above(0.0)),
    Key("min-partition-size", 10, "`dirichlet` and `dirichlet-niid-bench` redraw until every "
        "client has at least this many examples", interval=at_least(0)),
    Key("classes-per-partition", 2, "k of `classes`", interval=at_least(1)),
    Key("shards-per-partition", 2, "shards per client of `shards`", interval=at_least(1)),
    Key("quantity-sigma", 0.5, "σ of `quantity-skew` (0 = balanced)", interval=at_least(0.0)),
    Key("partition-seed", -1,
        "seeds the partition; -1: the run's `seed`. Set it to keep one partition across seeds "
        "(NIID-Bench's tables: `partition = \"dirichlet-niid-bench\"`, `partition-seed = 2020`)",
        interval=Interval(-1, INT64_MAX), note="(-1 = the run's seed)"),
    Key("model", "cnn-small",
        "`mlp-2nn` (McMahan 2NN, 199,210 params), `cnn-mcmahan` (McMahan CNN, 1,663,370), "
        "`cnn-small` (NIID-Bench CNN), `cnn-small-moon` (MOON's network on that CNN: encoder up "
        "to its 84-unit layer, projection head 84 → 84 → 256, output layer on the projection, "
        "75,046), `mlp-2nn-moon` (the same head on the 2NN's encoder, 146,626 on Synthetic), "
        "`lenet-gn` (DynamicFL's LeNet-5 with GroupNorm(1, C), 44,470), `cnn-fedveca`, "
        "`resnet18-gn` (ResNet-18 with GroupNorm), `svm` (FedVeca's linear squared-hinge SVM, "
        "even/odd)", choices=MODEL_NAMES,
        only=(Only(("moon",), REPRESENTATION_MODELS,
                   "MOON's contrastive loss (Li et al. 2021, Eq. 3) needs the representation "
                   "R_w(x) of a projection head, which these models expose"),
              Only(WIDTH, WIDTH_MODELS, "the clients build the model at their width: these "
                   "models scale in width (task.models.build_model(..., width=r))"))),
    Key("model-width", 1.0,
        "the width r of the model every client trains and the server evaluates: ⌈r·K⌉ units of "
        "every hidden layer (`mlp-2nn`, `cnn-small`, `resnet18-gn`); < 1 runs any strategy on the narrower "
        "model (e.g. FedAvg with everyone at the smallest width). `heterofl`, `fjord` and "
        "`fedrolex` give each client its own width instead", interval=FRACTION,
        only=(Only(WIDTH, (1.0,), "the global model is the full-width one; each client's "
                   "width comes from width-levels and width-rule"),)),
    Key("local-epochs", 2.0,
        "E, local epochs per round: max(1, ⌊E·n_i/B⌋) SGD steps of exactly B examples "
        "(McMahan's u_k, FedNova's τ_i); fractions are allowed (FedVeca's fairness protocol)",
        interval=above(0.0)),
    Key("local-steps", 0, "if > 0, exactly this many local SGD steps instead of epochs",
        interval=at_least(0), note="(0 = use local-epochs)"),
    Key("batch-size", 32, "B", interval=at_least(1),
        note="(for B = the whole local data set: full-batch=true)"),
    Key("full-batch", False, "B = ∞ (the whole local data set is one batch)"),
    Key("lr", 0.1, "local learning rate (η_l of `fedadam`, `fedyogi`, `fedadagrad`; FedVeca's "
        "η)", (APP, "fedveca", *FEDOPT), above(0.0)),
    Key("lr-schedule", "constant",
        "per-round client lr lr_t, sent as `lr` and logged as `lr`: `constant`; `exponential` "
        "lr·d^(t−1) (McMahan et al.'s 0.99 per round); `inverse` lr/(1 + a(t−1)) (Li et al. "
        "ICLR'20's β/(t+γ)); `step` lr·d^⌊(t−1)/k⌋; `cosine` lr → `lr-min` over "
        "`num-server-rounds` (DynamicFL's)", OURS, choices=SCHEDULES,
        only=(Only(FLOWER, ("constant",), FLOWER_WHY), Only(ASYNC, ("constant",), ASYNC_WHY))),
    Key("lr-decay", 0.99, "d of `exponential` / `step` (at most 1); a of `inverse`", OURS,
        above(0.0)),
    Key("lr-step-every", 10, "k of `step`: rounds between decays", OURS, at_least(1)),
    Key("lr-min", 0.0001, "floor of `cosine`", OURS, at_least(0.0)),
    Key("momentum", 0.0, "local SGD momentum", interval=BELOW_ONE,
        only=(Only(("fedveca",), (0.0,), FEDVECA_WHY),)),
    Key("weight-decay", 0.0, "local L2 weight decay", interval=at_least(0.0),
        only=(Only(("fedveca",), (0.0,), FEDVECA_WHY),)),
    Key("seed", 0, "seeds the initial model, client sampling (per round) and every client's "
        "batch order (per round and partition)", (APP, *CLOCKED), Interval(0, INT64_MAX),
        note="(numpy's seeding takes no negative seed)"),
    Key("device", "auto", "torch device of training and evaluation", check=_device,
        note="auto, cpu, cuda or cuda:N"),
    Key("eval-batch-size", 128, "batch size of evaluation (server test set, client "
        "`@app.evaluate`); 128 is 1.4–2.5× faster than 1000 for the conv models on CPU",
        interval=at_least(1)),
    Key("eval-every", 1, "the server evaluates the global model on the test set after rounds "
        "0, k, 2k, … and always after the last round; other rounds' records have no "
        "`accuracy`, `loss`, `eval-seconds`", interval=at_least(1)),
    Key("eval-overlap", True,
        "evaluate round r's model (in the ServerApp's evaluation process, on one torch thread "
        "at nice 19, below Ray's ClientApps at nice 15) while round r + 1 trains: its latency "
        "is hidden, its CPU is not; `false`: between the rounds, as Flower's loop does. Same "
        "run log either way, apart from the timing keys (Flower's own log then prints `None` "
        "for the rounds evaluated in the background; `rounds.jsonl` has every round)"),
    Key("fault-crash-prob", 0.0, "probability that a ClientApp train call raises "
        "(`InjectedCrash`; Flower turns it into an error reply)", interval=UNIT),
    Key("fault-late-prob", 0.0, "probability that it answers only after `round-timeout` + 1 s, "
        "when the server has stopped waiting", interval=UNIT),
    Key("round-timeout", 3600.0, "seconds the server waits for a round's replies (for "
        "DynamicFL, per sync event)", interval=above(0.0)),
    Key("virtual-clients", 0, "packed simulation: serve this many virtual clients "
        "(partitions 0 .. N - 1) from the SuperNodes, each SuperNode's ClientApp running its "
        "share of a round one after another, model and data kept in memory; same models as N "
        "SuperNodes, bit for bit ([packed simulation](simulation.md#packed-simulation)); "
        "0 = one client per SuperNode", interval=at_least(0)),
    Key("partition-map", "", "absolute path of a partition map (`deploy run --auth` writes "
        "and passes its `keys/partitions.json`): a node whose registered key may not serve "
        "the partition it claims is refused and never selected "
        "([node identity](deployment.md#node-identity-and-partition-ids)); \"\" = off",
        check=_absolute_or_empty, note="the absolute path of a partitions.json, or '' (off)",
        only=(Only(FLOWER, ("",), "Flower's own class sends no client-info query, where a "
                   "node claims its partition"),)),
    Key("checkpoint-every", 0, "write a checkpoint (`checkpoint.json` + its `.npz`) into the "
        "run directory every k rounds (0 = never)", interval=at_least(0)),
    Key("resume-from", "", "absolute path of a run directory with a `checkpoint.json`: "
        "continue that run", check=_absolute_or_empty,
        note="the absolute path of a run directory, or '' to start fresh"),
    Key("output-dir", "", "absolute folder for run directories (\"\" = "
        "`$XDG_DATA_HOME/fedhetero/runs`, i.e. `~/.local/share/fedhetero/runs`)",
        check=_absolute_or_empty, note="an absolute path, or '' for the per-user default"),
    Key("tracking", "", "also log every round record as scalars: `tensorboard`, `mlflow`, or "
        "both (`\"tensorboard,mlflow\"`); \"\" = off. Needs the `tracking` extra "
        "([Tracking](simulation.md#tracking-tensorboard-and-mlflow))", check=tracker_names,
        note=f"'' (off) or one or more of {', '.join(TRACKERS)}, comma-separated"),
    Key("tracking-dir", "", "absolute folder for the tracking output (\"\" = the run "
        "directory); a folder several runs name holds one MLflow store for all of them",
        check=_absolute_or_empty, note="an absolute path, or '' for the run directory"),
    Key("run-plots", True, "write the run's plots (accuracy and loss vs round, vs MB, vs "
        "simulated time) into its directory when it ends, beside `metrics.csv` and "
        "`summary.json` ([outputs](outputs.md)); `false` saves about half a second"),
)

RULES: tuple[Rule, ...] = (
    Rule(("over-commitment", "device-profiles"),
         lambda v: v["over-commitment"] == 0 or v["device-profiles"] != "none",
         "over-commitment closes a round at its first replies on the simulated clock: it needs "
         "device-profiles other than 'none'"),
    Rule(("selection", "device-profiles"),
         lambda v: v["selection"] not in ("oort", "tifl") or v["device-profiles"] != "none",
         "selection 'oort' and 'tifl' rank clients by their time on the simulated clock: they "
         "need device-profiles other than 'none'"),
    Rule(("fedveca-tau-init", "fedveca-tau-max"),
         lambda v: v["fedveca-tau-init"] <= v["fedveca-tau-max"],
         "fedveca-tau-init <= fedveca-tau-max (the cap on every tau)"),
    Rule(("lr-schedule", "lr-decay"),
         lambda v: v["lr-schedule"] not in DECAYING or v["lr-decay"] <= 1,
         f"lr-decay <= 1 with lr-schedule {' or '.join(DECAYING)} (lr_t would grow)"),
    Rule(("virtual-clients", "partition-map"),
         lambda v: v["virtual-clients"] == 0 or v["partition-map"] == "",
         "virtual-clients = 0 or partition-map = \"\" (a partition map checks the "
         "partition each SuperNode claims against its registered key; virtual clients have "
         "no keys)"),
    Rule(("round-deadline", "device-profiles"),
         lambda v: v["round-deadline"] == 0 or v["device-profiles"] != "none",
         "a round-deadline needs a simulated clock: device-profiles other than 'none'"),
    Rule(("model-width", "model"),
         lambda v: v["model-width"] == 1 or v["model"] in WIDTH_MODELS,
         f"model-width < 1 needs a model that scales in width: {', '.join(WIDTH_MODELS)}"),
    Rule(("width-rule", "round-deadline"),
         lambda v: v["width-rule"] != "deadline" or v["round-deadline"] > 0,
         "width-rule 'deadline' picks the largest width that fits the round deadline: it needs "
         "round-deadline > 0 (and device-profiles)"),
    Rule(("round-deadline", "straggler-fraction"),
         lambda v: v["round-deadline"] == 0 or v["straggler-fraction"] == 0,
         "round-deadline or straggler-fraction, not both (the deadline makes the stragglers)"),
    Rule(("dynamicfl-budget-seconds", "dynamicfl-budget-mode", "device-profiles"),
         lambda v: v["dynamicfl-budget-seconds"] == 0 or (
             v["dynamicfl-budget-mode"] == "budget" and v["device-profiles"] != "none"),
         "dynamicfl-budget-seconds > 0 sets byte budgets from the device bandwidths: it needs "
         "dynamicfl-budget-mode='budget' and device-profiles other than 'none'"),
    Rule(("fault-late-prob", "fault-crash-prob"),
         lambda v: v["fault-late-prob"] <= 1 - v["fault-crash-prob"],
         "fault-late-prob <= 1 - fault-crash-prob"),
    Rule(("partition-seed", "seed", "partition"),
         lambda v: v["partition"] != "dirichlet-niid-bench" or (
             v["seed"] if v["partition-seed"] == -1 else v["partition-seed"]) < NIID_BENCH_SEEDS,
         "the partition's seed (partition-seed, or seed at -1) below 2**32 with partition = "
         "'dirichlet-niid-bench' (numpy's RandomState); NIID-Bench's tables used 2020"),
)

BY_NAME: dict[str, Key] = {key.name: key for key in KEYS}

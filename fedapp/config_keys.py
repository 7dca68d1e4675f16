"""The run-config keys: one table, assembled from the declarations beside what reads them.

The app's own keys (data, model, client training, the ServerApp) and the keys the engines
read (sampling, stragglers, the clock, selection, the learning-rate schedule) are declared
here; every algorithm's own keys are declared in its module and come with its registration
(:mod:`strategies.engine.registry`), together with the values of shared keys it cannot
honour and its rules across keys. :func:`assemble` makes the one table: ``used_by`` names
the strategies that read a key (an engine family's keys are read by every strategy on that
engine, a registration's own keys and ``reads`` by it), ``only`` what each cannot honour.

Everything else comes from this table: :class:`fedapp.config.RunConfig` (fields, defaults,
validation, messages), the generic builder of :mod:`fedapp.registry`, the docs' run-config
keys table (``python -m fedapp.config_docs``; its links are relative to docs/), and
pyproject.toml's ``[tool.flwr.app.config]`` (which Flower reads; a test keeps it equal).

What is allowed is declared, never found out by building strategies: per key an
:class:`~strategies.engine.keys.Interval`, ``choices`` or a ``check`` (a parser that raises
``ValueError``); :class:`~strategies.engine.keys.Only` entries; :data:`RULES` across keys.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import strategies  # noqa: F401 - importing the algorithms registers them
from strategies import SELECTIONS, STRAGGLER_POLICIES, STRAGGLER_UNITS, WEIGHTINGS
from strategies.algorithms.dynamicfl import DROPOUT_WHY as DYNAMICFL_DROPOUT_WHY
from strategies.engine.devices import FLEETS
from strategies.engine.flash_fleet import FLASH
from strategies.engine.robust import ROBUST_RULES
from strategies.engine.keys import (APP, BELOW_ONE, FRACTION, UNIT, Interval, Key, Only, Rule,
                                    Value, above, at_least)
from strategies.engine.registry import ENGINES, Registration, registered
from strategies.engine.schedules import DECAYING, SCHEDULES
from strategies.engine.submodels import parse_levels as width_levels
from strategies.selection.power_of_choice import POC_WEIGHTINGS
from task.data import (DATASET_NAMES, EVALUATION_SPLITS, MAX_VALIDATION_FRACTION,
                       check_dataset_name)
from task.model_names import MODEL_NAMES, REPRESENTATION_MODELS, WIDTH_MODELS
from task.partition import PARTITION_NAMES

from .tracking import TRACKERS, tracker_names

__all__ = ["ALL", "APP", "ASYNC", "BY_NAME", "CLOCKED", "DYNAMICFL", "FEDAVG_FAMILY", "FEDOPT",
           "FLOWER", "INT64_MAX", "Interval", "KEYS", "Key", "OURS", "Only", "RULES", "Rule",
           "SELECTING", "SUMMARIES", "Value", "WIDTH", "assemble", "width_levels"]

ROUND, EVENTS, ASYNC_ENGINE, FLOWER_ENGINE = ENGINES  # engine families, as used_by tags
INT64_MAX = 2**63 - 1  # Flower's records and TOML hold 64-bit integers
NIID_BENCH_SEEDS = 2**32  # numpy's legacy RandomState takes seeds below 2**32


def _absolute_or_empty(path: str) -> None:
    if path and not Path(path).is_absolute():
        raise ValueError("not an absolute path (app processes do not run in your cwd)")


def _device(name: str) -> None:
    if not (name in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:[0-9]+", name)):
        raise ValueError("not a torch device name")


def _device_profiles(value: str) -> None:
    if value in ("none", FLASH) or value in FLEETS:
        return
    if not (Path(value).is_absolute() and Path(value).suffix.lower() in (".csv", ".json")):
        raise ValueError("neither a fleet nor the absolute path of a .csv / .json trace")


# Why a strategy cannot honour a key
FLOWER_WHY = ("Flower's own class: it weights by num-examples, has no simulated stragglers or "
              "simulated clock and sends lr as given")
ASYNC_WHY = ("an asynchronous strategy keeps async-concurrency clients training and waits for "
             "no round: no per-round sampling, stragglers, deadline or lr schedule")
FLOWER_SELECTION_WHY = "Flower's own class samples clients uniformly (its ClientManager)"
ROBUST_FLOWER_WHY = ("Flower's own class averages by num-examples inside Flower's code; robust "
                     "aggregation composes with `fedavg`'s server-lr and server-momentum and "
                     "`fedbuff`'s server-momentum")
ROBUST_EVENTS_WHY = "DynamicFL's sync events average the models of each event, not a round"
ROBUST_OWN_UPDATE_WHY = ("its server update does more with every client's reply than the "
                         "average a robust rule replaces (its own state or step), which the "
                         "rule would not protect")
ROBUST_FEDASYNC_WHY = ("FedAsync mixes in each client model as it arrives: one value per "
                       "coordinate, whose median is itself; use `fedbuff`")
OWN_UPDATE = ("fednova", "fedveca", "scaffold", "feddyn", "moon", "fedexp")  # own update()
MODEL_NEEDS = {  # a registration's ``model`` -> the models that have it, and why it matters
    "width": (WIDTH_MODELS, "the clients build the model at their width: these models scale in "
              "width (task.models.build_model(..., width=r))"),
    "representation": (REPRESENTATION_MODELS, "MOON's contrastive loss (Li et al. 2021, Eq. 3) "
                       "needs the representation R_w(x) of a projection head, which these models "
                       "expose"),
}
STRATEGY_DOC = ("the algorithm, by name (`fedhetero strategies` lists each with its paper; "
                "[strategies](strategies/fedavg.md), [Flower's server optimisers]"
                "(strategies/fedavg.md#flowers-server-optimisers-by-name), [asynchronous FL]"
                "(strategies/async.md), [model width](strategies/width.md)): ")

VECTORISED_MODES = ("off", "on", "auto")  # vectorised-clients: fedapp.vectorised_share

KEYS_OF_THE_APP: tuple[Key, ...] = (
    Key("num-server-rounds", 10, "federated rounds (T of the cosine lr-schedule)",
        (APP, ROUND, EVENTS), at_least(1)),
    Key("strategy", "fedavg", STRATEGY_DOC, choices=("fedavg",)),
    Key("weighting", "examples",
        "aggregation scheme: `examples` n_k/m_t over the sampled clients (McMahan et al. Alg. 1 "
        "with its erratum); `uniform` 1/|S| (SCAFFOLD's Algorithm 1; FedDyn's 1/|P_t| mean of "
        "the θ_k); `pre-erratum` n_k/n over all clients, unsampled ones keep the old model; "
        "`scheme-i` K draws with replacement ∝ p_k, plain mean (Li et al. ICLR'20); "
        "`scheme-ii` K of N uniformly, weights p_k·N/K (Li et al. ICLR'20, applied to updates)",
        (ROUND,), choices=WEIGHTINGS, arg="weighting",
        only=(Only((FLOWER_ENGINE,), ("examples",), FLOWER_WHY),)),
    Key("fraction-train", 1.0, "C: fraction of clients sampled per round, m = max(⌊C·K⌋, 1)",
        (ROUND, EVENTS, FLOWER_ENGINE), FRACTION, arg="fraction_train",
        only=(Only((ASYNC_ENGINE,), (1.0,), ASYNC_WHY),)),
    Key("fraction-evaluate", 0.0,
        "fraction of clients asked to evaluate the global model on their own data (0 = off; "
        "the server always evaluates on its `evaluation-split`). The constructors' default is "
        "Flower's 1.0; the app's is 0.0 because it evaluates on the server", ENGINES, UNIT,
        arg="fraction_evaluate"),
    Key("min-available-nodes", 2, "wait for this many connected nodes before sampling",
        ENGINES, at_least(1), arg="min_available_nodes"),
    Key("server-lr", 1.0,
        "eta_g: w ← w + eta_g·Σ c_k (w_k − w); 1.0 is plain averaging (FedAvg family, "
        "SCAFFOLD's global step size eta_g; FedAvgM's server learning rate). For `fedadam`, "
        "`fedyogi`, `fedadagrad` it is η of Reddi et al.'s Algorithm 2, where 1.0 is rarely "
        "right (Flower's defaults: 0.1, 0.01, 0.1; a warning says so)",
        (ROUND,), above(0.0), arg="server_lr"),
    Key("server-momentum", 0.0,
        "β of server momentum: `fedavg`'s is FedAvgM on the round engine (Hsu et al. 2019: "
        "v ← β·v + Δ_t, w ← w − η_g·v, Δ_t = w_t − the weighted average; with the clock, "
        "deadline, over-commitment, selection and weightings; 0 = FedAvg bit for bit), "
        "`fedavgm`'s is Flower's own class's; FedNova's optional server momentum, FedBuff's "
        "(m ← β·m + Δ̄, x ← x + η_g·m)", (), BELOW_ONE),
    Key("straggler-fraction", 0.0,
        "simulated system heterogeneity: each round ⌊f·m⌋ of the m sampled clients (seeded) "
        "are stragglers that do only part of their local work, uniform in 1..τ_i steps "
        "(τ_i = `local-steps`, or ⌊E·n_i/B⌋)", (ROUND,), UNIT, arg="straggler_fraction",
        only=(Only((FLOWER_ENGINE,), (0.0,), FLOWER_WHY),
              Only((ASYNC_ENGINE,), (0.0,), ASYNC_WHY))),
    Key("straggler-policy", "auto",
        "`drop` (FedAvg in the FedProx paper: stragglers are not waited for, nothing is sent to "
        "them), `partial` (their partial updates are aggregated), or `auto` = `drop` for "
        "fedavg/fedsgd/moon and `partial` for fedprox/fednova/fedveca/scaffold/feddyn "
        "(SCAFFOLD's option II divides by the steps a client actually took; a FedDyn "
        "straggler's model after its reduced work updates its linear term)",
        (ROUND,), choices=("auto", *STRAGGLER_POLICIES), arg="straggler_policy",
        auto="auto"),
    Key("straggler-unit", "steps",
        "a straggler's reduced work: `steps` = uniform in 1..τ_i steps; `epochs` = uniform in "
        "1..E whole epochs (the FedProx paper's x ~ U[1, E])",
        (ROUND,), choices=STRAGGLER_UNITS, arg="straggler_unit"),
    Key("round-deadline", 0.0,
        "D, simulated seconds per round (needs `device-profiles`): a client whose work does not "
        "fit does the steps that fit, aggregated under `straggler-policy` `partial` (FedProx, "
        "FedNova, FedVeca), not sent work under `drop` (FedAvg); the realistic alternative to "
        "`straggler-fraction` (not both). [simulated clock](clock.md)",
        (ROUND,), at_least(0.0), note="(0 = wait for every reply)", arg="round_deadline",
        convert=lambda value: value or None, only=(Only((ASYNC_ENGINE,), (0.0,), ASYNC_WHY),)),
    Key("over-commitment", 0.0,
        "o: sample ⌈(1 + o)·m⌉ clients and close the round at the first m replies on the "
        "simulated clock (needs `device-profiles`; FedScale's and Oort's over-commitment, 0.3 "
        "there); the later replies are left out and logged as `clients-late`",
        (ROUND,), Interval(0.0, 10.0), note="(0 = off)", arg="over_commitment",
        only=(Only((ASYNC_ENGINE,), (0.0,), ASYNC_WHY),)),
    Key("selection", "random",
        "who trains: `random` (uniform), `oort` (Lai et al. 2021, Alg. 1: loss-based utility × "
        "clock-time penalty, pacer, decaying exploration), `power-of-choice` (Cho et al. 2022: "
        "the m largest losses of d candidates, asked with evaluate messages), `tifl` (Chai et "
        "al. 2020: speed tiers, adaptive tier probabilities); `oort` and `tifl` need "
        "`device-profiles`; FedBuff / FedAsync draw each freed slot with it. Logs "
        "`selection-chosen` and the policy's inputs per round "
        "([client selection](strategies/selection.md))", (ROUND, ASYNC_ENGINE), choices=SELECTIONS,
        only=(Only((FLOWER_ENGINE,), ("random",), FLOWER_SELECTION_WHY),)),
    Key("robust-aggregation", "none",
        "Byzantine-robust aggregation in place of the weighted average: `median` or "
        "`trimmed-mean` of the client updates, coordinate-wise (Yin et al. ICML'18, Def. 1 and "
        "2), w ← w + eta_g·R(w_k − w); unweighted, so neither `weighting` nor a client's "
        "num-examples counts (`weighting` must be `examples` or `uniform`); FedBuff: of its K "
        "staleness-weighted updates (K ≥ 3). Logs `robust-aggregation`, `robust-values`, "
        "`robust-trimmed` ([robust aggregation](strategies/robust.md))",
        (ROUND, ASYNC_ENGINE), choices=ROBUST_RULES,
        only=(Only((FLOWER_ENGINE,), ("none",), ROBUST_FLOWER_WHY),
              Only((EVENTS,), ("none",), ROBUST_EVENTS_WHY),
              Only(OWN_UPDATE, ("none",), ROBUST_OWN_UPDATE_WHY),
              Only(("fedasync",), ("none",), ROBUST_FEDASYNC_WHY))),
    Key("robust-trim", 0.1,
        "β of `trimmed-mean`: ⌊β·m⌋ of the m client updates leave each end of every "
        "coordinate (to outvote q liars: ⌊β·m⌋ ≥ q, e.g. β ≥ 1/m for one)",
        (ROUND, ASYNC_ENGINE), Interval(0.0, 0.5, open_high=True)),
    Key("oort-preferred-duration", 0.0,
        "Oort's T, the developer-preferred round duration in simulated seconds: slower "
        "clients' utility × (T / t_i)²; the pacer relaxes T when utility stalls",
        (ROUND, ASYNC_ENGINE), at_least(0.0), note="(0 = the median expected time of the first round's "
        "candidates)"),
    Key("poc-candidates", 0, "Power-of-Choice's d, candidates asked for their loss per round "
        "(at least m)", (ROUND, ASYNC_ENGINE), at_least(0), note="(0 = 2m)"),
    Key("poc-weighting", "uniform", "how Power-of-Choice averages the m clients it chose: "
        "`uniform`, the plain mean (1/m) of Cho, Wang and Joshi's pow-d (their candidates are "
        "already drawn by n_k), or `examples`, by n_k (data size then counts twice)",
        (ROUND, ASYNC_ENGINE), choices=POC_WEIGHTINGS),
    Key("tifl-tiers", 5, "TiFL's number of speed tiers (each gets ⌈num-server-rounds / tiers⌉ "
        "credits in the FedAvg family)", (ROUND, ASYNC_ENGINE), at_least(1)),
    Key("device-profiles", "none",
        "the simulated clock's fleet, per partition: `none` (no clock), `homogeneous`, "
        "`lognormal`, `two-tier` (DynamicFL's rich / poor), `tiers` (`device-tiers` compute "
        "tiers 1, 1/2, 1/4, ...), `flash` (measured smartphones and networks, per-round "
        "variation: [the FLASH fleet](clock.md#the-flash-fleet)), or the absolute path of a "
        "`.csv` / `.json` device trace ([format](clock.md#trace-format)); logs `sim-seconds` "
        "and `sim-elapsed` per round", (ROUND, EVENTS, ASYNC_ENGINE), check=_device_profiles,
        note=f"none, {', '.join(FLEETS)}, {FLASH}, or the absolute path of a .csv / .json "
        "device trace",
        only=(Only((FLOWER_ENGINE,), ("none",), FLOWER_WHY),)),
    Key("device-downlink-mbps", 20.0, "the reference (median) downlink bandwidth, Mbit/s",
        (ROUND, EVENTS, ASYNC_ENGINE), above(0.0)),
    Key("device-uplink-mbps", 5.0, "the reference (median) uplink bandwidth, Mbit/s",
        (ROUND, EVENTS, ASYNC_ENGINE), above(0.0)),
    Key("device-sigma", 1.0, "`lognormal`: σ of log speed and log bandwidths",
        (ROUND, EVENTS, ASYNC_ENGINE), at_least(0.0)),
    Key("device-rich-fraction", 0.3, "`two-tier`: probability that a partition is rich",
        (ROUND, EVENTS, ASYNC_ENGINE), UNIT),
    Key("device-poor-factor", 10.0,
        "`two-tier`: how many times slower a poor device computes and transfers",
        (ROUND, EVENTS, ASYNC_ENGINE), at_least(1.0)),
    Key("device-tiers", 5,
        "`tiers`: T compute tiers, partition p at 2^−(p mod T) of the reference speed (5: 1, "
        "1/2, 1/4, 1/8, 1/16), the reference bandwidths", (ROUND, EVENTS, ASYNC_ENGINE), at_least(1)),
    Key("device-availability", 1.0, "probability that a generated device is online in a round "
        "(offline devices are not sampled)", (ROUND, EVENTS, ASYNC_ENGINE), UNIT),
    Key("device-speed-noise", 0.1,
        "`flash`: σ of the per-round log-normal factor exp(σ·z) on a device's speed (0 = "
        "every round at its benchmark speed)", (ROUND, EVENTS, ASYNC_ENGINE), at_least(0.0)),
    Key("device-partition-correlation", 0.0,
        "`flash`: c between a partition's size (the examples its client reports) and its "
        "phone's speed, a Gaussian copula over the size ranks: 0 = independent, 1 = the "
        "larger the partition, the faster its phone", (ROUND, EVENTS, ASYNC_ENGINE), UNIT),
    Key("device-dropout", 0.0,
        "probability that a client sent work drops out before replying (needs "
        "`device-profiles`): its reply is discarded, logged as `clients-dropped-out` and "
        "`dropped-out`, and the round's clock counts it until it dropped, at a uniform "
        "fraction of its time", (ROUND, EVENTS, ASYNC_ENGINE), BELOW_ONE,
        only=(Only((EVENTS,), (0.0,), DYNAMICFL_DROPOUT_WHY),)),
    Key("device-reference-gflops", 1.0,
        "training speed of the speed-1 device, GFLOP/s: the seconds per example are the "
        "model's training FLOPs (3 × 2 × forward MACs) / this", interval=above(0.0)),
    Key("drift-diagnostics", True,
        "log client drift each round: per layer the mean pairwise cosine similarity of the "
        "client updates (the IID→non-IID study's Fig. 13) and the spread of the update norms",
        (ROUND, EVENTS), arg="drift_diagnostics", note="(not for the width strategies: their "
        "clients send sub-models of different shapes)"),
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
    Key("evaluation-split", "test",
        "what the server evaluates the global model on (`accuracy`, `loss`): `test`, the "
        "dataset's test split; `validation`, a fixed label-stratified `validation-fraction` of "
        "the training split, held out before partitioning (no client trains on it) and the "
        "same for every seed and method: tune on `validation`, report on `test` "
        "([validation split](simulation.md#tuning-on-a-validation-split))",
        choices=EVALUATION_SPLITS),
    Key("validation-fraction", 0.1, "`evaluation-split = \"validation\"`: the share of the "
        "training examples held out (per label, rounded; at least 100 in all)",
        interval=Interval(0.0, MAX_VALIDATION_FRACTION, open_low=True)),
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
        "even/odd)", choices=MODEL_NAMES),
    Key("model-width", 1.0,
        "the width r of the model every client trains and the server evaluates: ⌈r·K⌉ units of "
        "every hidden layer (`mlp-2nn`, `cnn-small`, `resnet18-gn`); < 1 runs any strategy on the narrower "
        "model (e.g. FedAvg with everyone at the smallest width). `heterofl`, `fjord` and "
        "`fedrolex` give each client its own width instead", interval=FRACTION),
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
        "η)", interval=above(0.0)),
    Key("lr-schedule", "constant",
        "per-round client lr lr_t, sent as `lr` and logged as `lr`: `constant`; `exponential` "
        "lr·d^(t−1) (McMahan et al.'s 0.99 per round); `inverse` lr/(1 + a(t−1)) (Li et al. "
        "ICLR'20's β/(t+γ)); `step` lr·d^⌊(t−1)/k⌋; `cosine` lr → `lr-min` over "
        "`num-server-rounds` (DynamicFL's)", (ROUND, EVENTS), choices=SCHEDULES,
        only=(Only((FLOWER_ENGINE,), ("constant",), FLOWER_WHY),
              Only((ASYNC_ENGINE,), ("constant",), ASYNC_WHY))),
    Key("lr-decay", 0.99, "d of `exponential` / `step` (at most 1); a of `inverse`", (ROUND, EVENTS),
        above(0.0)),
    Key("lr-step-every", 10, "k of `step`: rounds between decays", (ROUND, EVENTS), at_least(1)),
    Key("lr-min", 0.0001, "floor of `cosine`", (ROUND, EVENTS), at_least(0.0)),
    Key("momentum", 0.0, "local SGD momentum", interval=BELOW_ONE),
    Key("weight-decay", 0.0, "local L2 weight decay", interval=at_least(0.0)),
    Key("seed", 0, "seeds the initial model, client sampling (per round) and every client's "
        "batch order (per round and partition)", (APP, ROUND, EVENTS, ASYNC_ENGINE), Interval(0, INT64_MAX), arg="seed",
        note="(numpy's seeding takes no negative seed)"),
    Key("device", "auto", "torch device of training and evaluation", check=_device,
        note="auto, cpu, cuda or cuda:N"),
    Key("eval-batch-size", 128, "batch size of evaluation (server test set, client "
        "`@app.evaluate`); 128 is 1.4–2.5× faster than 1000 for the conv models on CPU",
        interval=at_least(1)),
    Key("eval-every", 1, "the server evaluates the global model (on `evaluation-split`) after "
        "rounds 0, k, 2k, … and always after the last round; other rounds' records have no "
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
    Key("silence-timeout", 300.0, "seconds a task may go without a reply once others have "
        "replied before it is given up as silent (at least 10x the slowest reply so far; "
        "sooner than `round-timeout`); its client then sits out a while", interval=at_least(0.0),
        note="(0 = wait the whole `round-timeout`)"),
    Key("virtual-clients", 0, "packed simulation: serve this many virtual clients "
        "(partitions 0 .. N - 1) from the SuperNodes, each SuperNode's ClientApp running its "
        "share of a round one after another, model and data kept in memory; same models as N "
        "SuperNodes, bit for bit ([packed simulation](simulation.md#packed-simulation)); "
        "0 = one client per SuperNode", interval=at_least(0)),
    Key("vectorised-clients", "off", "packed simulation: `on` trains the virtual clients of a "
        "share together, one batched step (`torch.func.vmap`) for all of them at a time, where "
        "their local work is plain local SGD (FedAvg and every strategy without a client side, "
        "FedProx's term) on the same model and batch size: the models match one-by-one "
        "training within float32 rounding, not bit for bit; `auto` does so only where one "
        "measured batched step beats the per-client loop for that model on this device (on "
        "CPUs convolutions usually do not), and logs what it measured; `off` = one by one "
        "([vectorised packing](simulation.md#vectorised-packing))",
        choices=VECTORISED_MODES),
    Key("partition-map", "", "absolute path of a partition map (`deploy run --auth` writes "
        "and passes its `keys/partitions.json`): a node whose registered key may not serve "
        "the partition it claims is refused and never selected "
        "([node identity](deployment.md#node-identity-and-partition-ids)); \"\" = off",
        check=_absolute_or_empty, note="the absolute path of a partitions.json, or '' (off)",
        only=(Only((FLOWER_ENGINE,), ("",), "Flower's own class sends no client-info query, where a "
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

RULES_OF_THE_APP: tuple[Rule, ...] = (
    Rule(("over-commitment", "device-profiles"),
         lambda v: v["over-commitment"] == 0 or v["device-profiles"] != "none",
         "over-commitment closes a round at its first replies on the simulated clock: it needs "
         "device-profiles other than 'none'"),
    Rule(("selection", "device-profiles"),
         lambda v: v["selection"] not in ("oort", "tifl") or v["device-profiles"] != "none",
         "selection 'oort' and 'tifl' rank clients by their time on the simulated clock: they "
         "need device-profiles other than 'none'"),
    Rule(("selection", "weighting", "poc-weighting"),
         lambda v: v["selection"] != "power-of-choice"
         or v["weighting"] in ("examples", v["poc-weighting"]),
         "under selection 'power-of-choice' the averaging is poc-weighting's: leave weighting "
         "at 'examples' (or equal to poc-weighting) and set poc-weighting"),
    Rule(("lr-schedule", "lr-decay"),
         lambda v: v["lr-schedule"] not in DECAYING or v["lr-decay"] <= 1,
         f"lr-decay <= 1 with lr-schedule {' or '.join(DECAYING)} (lr_t would grow)"),
    Rule(("virtual-clients", "partition-map"),
         lambda v: v["virtual-clients"] == 0 or v["partition-map"] == "",
         "virtual-clients = 0 or partition-map = \"\" (a partition map checks the "
         "partition each SuperNode claims against its registered key; virtual clients have "
         "no keys)"),
    Rule(("vectorised-clients", "virtual-clients"),
         lambda v: v["vectorised-clients"] == "off" or v["virtual-clients"] > 0,
         "vectorised-clients trains the virtual clients of packed mode together: it needs "
         "virtual-clients > 0 (or vectorised-clients = \"off\")"),
    Rule(("round-deadline", "device-profiles"),
         lambda v: v["round-deadline"] == 0 or v["device-profiles"] != "none",
         "a round-deadline needs a simulated clock: device-profiles other than 'none'"),
    Rule(("device-dropout", "device-profiles"),
         lambda v: v["device-dropout"] == 0 or v["device-profiles"] != "none",
         "device-dropout drops clients on the simulated clock: it needs device-profiles other "
         "than 'none'"),
    Rule(("device-partition-correlation", "device-profiles"),
         lambda v: v["device-partition-correlation"] == 0 or v["device-profiles"] == FLASH,
         f"device-partition-correlation places the phones of the '{FLASH}' fleet: it needs "
         f"device-profiles = '{FLASH}' (or a correlation of 0)"),
    Rule(("model-width", "model"),
         lambda v: v["model-width"] == 1 or v["model"] in WIDTH_MODELS,
         f"model-width < 1 needs a model that scales in width: {', '.join(WIDTH_MODELS)}"),
    Rule(("round-deadline", "straggler-fraction"),
         lambda v: v["round-deadline"] == 0 or v["straggler-fraction"] == 0,
         "round-deadline or straggler-fraction, not both (the deadline makes the stragglers)"),
    Rule(("fault-late-prob", "fault-crash-prob"),
         lambda v: v["fault-late-prob"] <= 1 - v["fault-crash-prob"],
         "fault-late-prob <= 1 - fault-crash-prob"),
    Rule(("partition-seed", "seed", "partition"),
         lambda v: v["partition"] != "dirichlet-niid-bench" or (
             v["seed"] if v["partition-seed"] == -1 else v["partition-seed"]) < NIID_BENCH_SEEDS,
         "the partition's seed (partition-seed, or seed at -1) below 2**32 with partition = "
         "'dirichlet-niid-bench' (numpy's RandomState); NIID-Bench's tables used 2020"),
)

def assemble(registrations: dict[str, Registration]
             ) -> tuple[tuple[Key, ...], tuple[Rule, ...]]:
    """The one table and its rules: the app's keys, then each registration's own keys in
    registration order (a key declared by several registrations once), with ``used_by`` and
    ``only`` naming strategies (module docstring)."""
    by_engine = {engine: [n for n, r in registrations.items() if r.engine == engine]
                 for engine in ENGINES}
    declared = {key.name: key for key in KEYS_OF_THE_APP}
    for registration in registrations.values():
        for key in registration.keys:  # read by the strategies that declare or read it
            declared.setdefault(key.name, dataclasses.replace(key, used_by=()))
    reads = {name: strategy_reads(r, declared, by_engine) for name, r in registrations.items()}
    table = []
    for key in declared.values():
        if key.name == "strategy":
            key = dataclasses.replace(key, doc=key.doc + ", ".join(
                f"`{n}`" for n in registrations), choices=tuple(registrations))
        used = tuple(n for n in registrations if key.name in reads[n])
        only = [Only(tuple(n for tag in o.strategies for n in by_engine.get(tag, [tag])),
                     o.values, o.why) for o in key.only]
        only += [Only((name,), values, why) for name, r in registrations.items()
                 for k, values, why in r.only if k == key.name]
        if key.name == "model":
            only += [Only((name,), *MODEL_NEEDS[r.model]) for name, r in registrations.items()
                     if r.model is not None]
        table.append(dataclasses.replace(
            key, used_by=((APP,) if APP in key.used_by else ()) + used,
            only=merged_only(only)))
    rules = list(RULES_OF_THE_APP)
    for registration in registrations.values():
        rules += [rule for rule in registration.rules if rule not in rules]
    return tuple(table), tuple(rules)


def strategy_reads(registration: Registration, declared: dict[str, Key],
                   by_engine: dict[str, list[str]]) -> set[str]:
    """The keys a registration's strategy reads: its engine family's, its own, its
    ``reads``; not those whose argument its preset fixes."""
    family = {name for name, key in declared.items() if registration.engine in key.used_by}
    own = {key.name for key in registration.keys} | set(registration.reads)
    return {name for name in family | own
            if declared[name].arg is None or declared[name].arg not in registration.fixed}


def merged_only(entries: list[Only]) -> tuple[Only, ...]:
    """Entries with the same values and reason as one entry for all their strategies."""
    merged: dict[tuple, list[str]] = {}
    for entry in entries:
        merged.setdefault((entry.values, entry.why), []).extend(entry.strategies)
    return tuple(Only(tuple(dict.fromkeys(names)), values, why)
                 for (values, why), names in merged.items())


KEYS, RULES = assemble(registered())
BY_NAME: dict[str, Key] = {key.name: key for key in KEYS}
REGISTRATIONS: dict[str, Registration] = registered()
SUMMARIES = {name: r.summary for name, r in REGISTRATIONS.items()}  # ``fedhetero strategies``
ALL = tuple(REGISTRATIONS)
FEDAVG_FAMILY = tuple(n for n, r in REGISTRATIONS.items() if r.engine == ROUND)
DYNAMICFL = tuple(n for n, r in REGISTRATIONS.items() if r.engine == EVENTS)
OURS = FEDAVG_FAMILY + DYNAMICFL
ASYNC = tuple(n for n, r in REGISTRATIONS.items() if r.engine == ASYNC_ENGINE)
FLOWER = tuple(n for n, r in REGISTRATIONS.items() if r.engine == FLOWER_ENGINE)
FEDOPT = tuple(n for n in FLOWER if n in BY_NAME["server-tau"].used_by)
WIDTH = tuple(n for n, r in REGISTRATIONS.items() if r.model == "width")
CLOCKED = tuple(n for n in ALL if n in BY_NAME["device-profiles"].used_by)
SELECTING = tuple(n for n in ALL if n in BY_NAME["selection"].used_by)

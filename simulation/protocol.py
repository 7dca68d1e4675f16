"""The comparison protocol of a sweep file: claims, equal resources, the strongest baselines,
tuning on a validation split, and verdicts computed by one written rule.

A sweep file that makes a claim lists it as ``[[claims]]`` (:data:`CLAIM_KEYS`)::

    [[claims]]
    name = "oort-time"                 # a folder-safe name
    statement = "Oort reaches 75 % in at most 1/1.3 of random selection's simulated time"
    paper = "Lai et al., OSDI 2021, Table 1"
    kind = "selection"                 # async | selection | width | other
    measure = "budget-to-target"       # or "accuracy": last-10 mean at an equal budget
    budget = "sim-seconds"             # sim-seconds | client-updates | bytes | rounds
    target = 0.75                      # budget-to-target: the accuracy to reach
    effect = 1.3                       # claimed: baseline budget / candidate budget >= 1.3
    candidate = "fedavg-oort"
    baselines = ["fedavg-over", "fedprox-deadline", "fedavgm"]
    equal = ["clients-in-flight"]      # resources held equal (the default)

and the sweep (:func:`check_protocol`) refuses it unless: the file runs at least
:data:`MIN_SEEDS` seeds; a claim about async, selection or widths lists the strongest
synchronous baselines (:data:`STRONGEST`); every variant of a claim keeps the same number of
clients in flight (:func:`clients_in_flight`). ``[tuning]`` tunes every variant before the
seeds run (:mod:`simulation.tuning`).

The verdict rule (:func:`verdict`), per baseline, on the per-seed paired effect e_s (for
``budget-to-target`` the log of baseline budget / candidate budget, shown as a ratio; for
``accuracy`` the candidate's mean of the last 10 evaluations minus the baseline's, in
points, both within the budget the shorter of the two runs spent) with its mean m and
two-sided 95 % t-interval [lo, hi] over the n seeds both ran (claimed effect theta):

* **reproduced**: n >= 5, m >= theta, and the interval excludes the other side: lo > 0 for
  a claim of improvement (theta > 0, i.e. the paired t-test rejects "no difference" at
  5 %), lo >= theta for a claim of "no worse than" (theta <= 0);
* **not reproduced**: n >= 5 and hi < theta (the seeds exclude the claimed effect);
* **inconclusive**: anything else.

A seed in which a run never reaches the target enters with the budget it spent in all (a
bound): a candidate's bound overstates its effect, so such a pair can still make "not
reproduced" but not "reproduced"; a baseline's bound understates it, so the pair can make
"reproduced" but not "not reproduced". A claim is reproduced when it is against every
baseline, not reproduced when it is not against any one, and inconclusive otherwise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .metrics import BUDGETS, LAST_EVALUATIONS, budget_axis, budget_to_target, last_mean
from .stats import CONFIDENCE, MeanInterval, mean_interval, paired_t_pvalue
from .tuning import points

CLAIM_KEYS = ("name", "statement", "paper", "kind", "measure", "budget", "target", "effect",
              "candidate", "baselines", "equal")
KINDS = ("async", "selection", "width", "other")
MEASURES = ("budget-to-target", "accuracy")
EQUAL_RESOURCES = ("clients-in-flight",)
MIN_SEEDS = 5
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
CLAIM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,63}")
METRIC_SENTENCE = (f"Accuracy on every table of this page is the mean test accuracy of the "
                   f"last {LAST_EVALUATIONS} evaluations of a run (within the budget compared), "
                   f"given as the mean over seeds with its {100 * CONFIDENCE:g} % t-interval.")


def _number(config: Mapping, key: str, default: float = 0.0) -> float:
    value = config.get(key, default)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else default


def _over_commitment(config: Mapping) -> bool:
    return _number(config, "over-commitment") > 0 and config.get("strategy") not in ASYNC


def _deadline_fedprox(config: Mapping) -> bool:
    return (config.get("strategy") == "fedprox" and _number(config, "round-deadline") > 0
            and config.get("straggler-policy", "auto") in ("auto", "partial"))


def _fedavgm(config: Mapping) -> bool:
    return config.get("strategy") == "fedavgm" or (
        config.get("strategy", "fedavg") == "fedavg" and _number(config, "server-momentum") > 0)


ASYNC = ("fedbuff", "fedasync")
# what a claim about async, selection or widths must list among its baselines
STRONGEST = {
    "over-commitment": (_over_commitment, "synchronous FL with over-commitment (sample "
                        "ceil((1 + o) m), close at the first m: over-commitment = 0.3 in "
                        "FedScale and Oort)"),
    "deadline with FedProx's partial work": (
        _deadline_fedprox, "FedProx with a round deadline whose stragglers do the steps that "
        "fit (strategy = \"fedprox\", round-deadline > 0, straggler-policy \"partial\" or "
        "\"auto\")"),
    "FedAvgM": (_fedavgm, "FedAvgM, server momentum (strategy = \"fedavg\" with "
                "server-momentum > 0, or Flower's \"fedavgm\")"),
}


@dataclass(frozen=True)
class Claim:
    """One claim of a sweep file (module docstring)."""

    name: str
    statement: str
    paper: str
    kind: str
    measure: str
    budget: str
    effect: float
    candidate: str
    baselines: tuple[str, ...]
    target: float | None = None
    equal: tuple[str, ...] = EQUAL_RESOURCES


def claims_of(spec: Mapping, path: Path | str = "sweep file") -> list[Claim]:
    """The sweep file's ``[[claims]]``, each checked (a ValueError names the claim, the key,
    the value and the fix)."""
    raw = spec.get("claims", [])
    if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
        raise ValueError(f"{path}: 'claims' must be an array of tables ([[claims]] ...)")
    claims, names = [], set()
    for number, table in enumerate(raw, 1):
        where = f"{path}: claim {table.get('name', number)!r}"
        unknown = sorted(set(table) - set(CLAIM_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; a claim has "
                             f"{', '.join(CLAIM_KEYS)}")
        required = ["name", "statement", "paper", "kind", "measure", "budget", "effect",
                    "candidate", "baselines"]
        missing = [k for k in required if k not in table]
        if table.get("measure") == "budget-to-target" and "target" not in table:
            missing.append("target")
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        claim = Claim(
            name=table["name"], statement=str(table["statement"]).strip(),
            paper=str(table["paper"]).strip(), kind=table["kind"], measure=table["measure"],
            budget=table["budget"], effect=table["effect"], candidate=table["candidate"],
            baselines=tuple(table["baselines"]) if isinstance(table["baselines"], list)
            else table["baselines"], target=table.get("target"),
            equal=tuple(table.get("equal", EQUAL_RESOURCES)))
        _check_claim(claim, where)
        if claim.name in names:
            raise ValueError(f"{where}: the name is used twice; give each claim its own")
        names.add(claim.name)
        claims.append(claim)
    return claims


def _check_claim(claim: Claim, where: str) -> None:
    if not isinstance(claim.name, str) or not CLAIM_NAME.fullmatch(claim.name):
        raise ValueError(f"{where}: name must be 1-64 letters, digits and . _ + = -")
    for key, value, allowed in (("kind", claim.kind, KINDS), ("measure", claim.measure, MEASURES),
                                ("budget", claim.budget, BUDGETS)):
        if value not in allowed:
            raise ValueError(f"{where}: {key} = {value!r}; use one of {', '.join(allowed)}")
    if not (isinstance(claim.effect, (int, float)) and not isinstance(claim.effect, bool)
            and math.isfinite(claim.effect)):
        raise ValueError(f"{where}: effect = {claim.effect!r} must be a number")
    if claim.measure == "budget-to-target":
        if claim.effect <= 0:
            raise ValueError(f"{where}: effect = {claim.effect!r}: a budget claim's effect is "
                             "the ratio baseline / candidate budget, > 0 (e.g. 1.3)")
        if not (isinstance(claim.target, (int, float)) and 0 < claim.target <= 1):
            raise ValueError(f"{where}: target = {claim.target!r} must be an accuracy in (0, 1]")
    elif abs(claim.effect) >= 1:
        raise ValueError(f"{where}: effect = {claim.effect!r}: an accuracy claim's effect is a "
                         "difference of accuracies as a fraction (e.g. -0.01 for 'at most one "
                         "point lower')")
    if not (isinstance(claim.baselines, tuple) and claim.baselines
            and all(isinstance(b, str) for b in claim.baselines)):
        raise ValueError(f"{where}: baselines must be a non-empty list of variant names")
    bad = [e for e in claim.equal if e not in EQUAL_RESOURCES]
    if bad:
        raise ValueError(f"{where}: equal = {bad}; resources held equal are "
                         f"{', '.join(EQUAL_RESOURCES)}")


def variant_config(spec: Mapping, name: str) -> dict:
    """A variant's run config as the sweep file gives it ([base] + its table, without the
    sweep's own keys ``seeds`` and ``tune``)."""
    overrides = {k: v for k, v in spec["variants"][name].items() if k not in ("seeds", "tune")}
    return {**spec.get("base", {}), **overrides}


def tuned_configs(spec: Mapping, name: str) -> list[dict]:
    """The run configs a variant may run with: one per tuning point (its values from
    ``[tuning] grid`` and its ``tune``) in a tuned file, else its one config."""
    config = variant_config(spec, name)
    if "tuning" not in spec:
        return [config]
    return [{**config, **point} for point in points(spec, name)]


def num_clients(config: Mapping, spec: Mapping) -> int:
    """K, the clients a round samples from before availability: the virtual clients of
    packed simulation, else the federation's SuperNodes."""
    virtual = int(_number(config, "virtual-clients"))
    return virtual if virtual > 0 else int(spec.get("num-supernodes", 10))


def clients_in_flight(config: Mapping, spec: Mapping) -> int:
    """Clients training at once, nominally: an asynchronous strategy's async-concurrency;
    a synchronous round's ceil((1 + o) m), m = max(floor(C K), 1)."""
    if config.get("strategy") in ASYNC:
        return int(_number(config, "async-concurrency", 20))
    m = max(math.floor(_number(config, "fraction-train", 1.0) * num_clients(config, spec)), 1)
    return math.ceil((1.0 + _number(config, "over-commitment")) * m)


def check_protocol(spec: Mapping, path: Path | str = "sweep file") -> list[Claim]:
    """The sweep file's claims, refused (ValueError naming the claim and the fix) where the
    protocol does not hold (module docstring)."""
    claims = claims_of(spec, path)
    if not claims:
        return claims
    seeds = list(spec.get("seeds", []))
    if len(seeds) < MIN_SEEDS:
        raise ValueError(f"{path}: seeds = {seeds}: a sweep that makes a claim runs at least "
                         f"{MIN_SEEDS} seeds (e.g. seeds = [0, 1, 2, 3, 4]); run fewer with "
                         "--seeds while it is in progress")
    variants = spec.get("variants", {})
    for claim in claims:
        where = f"{path}: claim {claim.name!r}"
        named = [claim.candidate, *claim.baselines]
        unknown = [v for v in named if v not in variants]
        if unknown:
            raise ValueError(f"{where}: {unknown} are not variants of the file (it has "
                             f"{', '.join(variants)})")
        if claim.candidate in claim.baselines:
            raise ValueError(f"{where}: the candidate {claim.candidate!r} is among its baselines")
        configs = {v: tuned_configs(spec, v) for v in named}  # every point it may be tuned to
        if claim.kind in ("async", "selection", "width"):
            lacking = [f"{what}: {doc}" for what, (listed, doc) in STRONGEST.items()
                       if not any(all(map(listed, configs[b])) for b in claim.baselines)]
            if lacking:
                raise ValueError(f"{where}: a claim about {claim.kind} must list the strongest "
                                 "synchronous baselines; its baselines lack " + "; ".join(lacking)
                                 + ". Add such variants to the file and to the claim's baselines")
        if "clients-in-flight" in claim.equal:
            flight = {v: "/".join(sorted({str(clients_in_flight(c, spec)) for c in configs[v]}))
                      for v in named}
            if len(set(flight.values())) > 1:
                raise ValueError(
                    f"{where}: resources are not equal: clients in flight "
                    + ", ".join(f"{v} {n}" for v, n in flight.items())
                    + " (async-concurrency for FedBuff / FedAsync, ceil((1 + over-commitment) "
                    "max(floor(fraction-train K), 1)) for a synchronous round); set them to "
                    "one number, or drop \"clients-in-flight\" from the claim's equal")
    return claims


# ------------------------------------------------------------------ verdicts
@dataclass(frozen=True)
class Comparison:
    """The candidate against one baseline over the seeds both ran."""

    baseline: str
    seeds: tuple[int, ...]
    effects: tuple[float, ...]  # per seed: log ratio (budget claims) or accuracy difference
    candidate_bounds: int  # seeds where the candidate never reached the target
    baseline_bounds: int  # seeds where the baseline never reached it
    interval: MeanInterval | None
    p_value: float | None
    verdict: str
    why: str = ""
    details: dict = field(default_factory=dict)


def paired_effect(claim: Claim, candidate: list[dict], baseline: list[dict]
                  ) -> tuple[float, bool, bool]:
    """One seed's effect (module docstring) and whether the candidate's / the baseline's
    budget is a bound (it never reached the target)."""
    if claim.measure == "accuracy":
        limit = min(float(budget_axis(candidate, claim.budget)[-1]),
                    float(budget_axis(baseline, claim.budget)[-1]))
        return (last_mean(candidate, claim.budget, limit)
                - last_mean(baseline, claim.budget, limit)), False, False
    spent = []
    for records in (candidate, baseline):
        reached = budget_to_target(records, claim.budget, float(claim.target))
        spent.append((float(budget_axis(records, claim.budget)[-1]), True) if reached is None
                     else (reached, False))
    (ours, ours_bound), (theirs, theirs_bound) = spent
    if ours <= 0 or theirs <= 0:
        raise ValueError(f"claim {claim.name!r}: a budget of 0 {claim.budget} to reach "
                         f"{claim.target:g} (the initial model already does): no ratio")
    return math.log(theirs / ours), ours_bound, theirs_bound


def threshold(claim: Claim) -> float:
    """The claimed effect on the scale of :func:`paired_effect`."""
    return math.log(claim.effect) if claim.measure == "budget-to-target" else claim.effect


def verdict(claim: Claim, effects: list[float], candidate_bounds: int = 0,
            baseline_bounds: int = 0) -> tuple[str, str, MeanInterval | None]:
    """The written rule of the module docstring: (verdict, why, interval)."""
    if not effects:
        return INCONCLUSIVE, "no seed ran both", None
    interval, theta = mean_interval(effects), threshold(claim)
    if len(effects) < MIN_SEEDS:
        return INCONCLUSIVE, f"{len(effects)} paired seeds (the rule needs {MIN_SEEDS})", interval
    significant = interval.low > 0 if theta > 0 else interval.low >= theta
    if interval.mean >= theta and significant:
        if candidate_bounds:
            return (INCONCLUSIVE, f"the candidate missed the target in {candidate_bounds} "
                    "seeds (its effect there is an upper bound)", interval)
        return REPRODUCED, ("the mean meets the claim and the interval lies above 0" if theta > 0
                            else "the interval lies at or above the claimed margin"), interval
    if interval.high < theta:
        if baseline_bounds:
            return (INCONCLUSIVE, f"the baseline missed the target in {baseline_bounds} seeds "
                    "(its effect there is a lower bound)", interval)
        return NOT_REPRODUCED, "the interval lies below the claimed effect", interval
    return INCONCLUSIVE, "the interval holds both the claimed effect and less", interval


def compare(claim: Claim, runs: Mapping[str, Mapping[int, list[dict]]]) -> list[Comparison]:
    """The candidate against each baseline (``runs``: variant -> seed -> round records)."""
    ours = runs.get(claim.candidate, {})
    out = []
    for baseline in claim.baselines:
        theirs = runs.get(baseline, {})
        seeds = tuple(sorted(set(ours) & set(theirs)))
        effects, ours_bounds, theirs_bounds = [], 0, 0
        for seed in seeds:
            effect, ours_bound, theirs_bound = paired_effect(claim, ours[seed], theirs[seed])
            effects.append(effect)
            ours_bounds += ours_bound
            theirs_bounds += theirs_bound
        word, why, interval = verdict(claim, effects, ours_bounds, theirs_bounds)
        out.append(Comparison(baseline, seeds, tuple(effects), ours_bounds, theirs_bounds,
                              interval, paired_t_pvalue(effects), word, why))
    return out


def claim_verdict(comparisons: list[Comparison]) -> str:
    """Reproduced against every baseline -> reproduced; not reproduced against any ->
    not reproduced; else inconclusive."""
    words = [c.verdict for c in comparisons]
    if words and all(w == REPRODUCED for w in words):
        return REPRODUCED
    if NOT_REPRODUCED in words:
        return NOT_REPRODUCED
    return INCONCLUSIVE

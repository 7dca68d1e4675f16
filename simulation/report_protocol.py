"""The protocol section of a report (:mod:`simulation.protocol`): the one accuracy metric,
the code's commits, the tuning choices, and per claim the paired comparison with each
baseline and the verdict its rule computes (``claims.csv`` beside ``report.csv``)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from .metrics import last_mean
from .protocol import METRIC_SENTENCE, Claim, Comparison, claim_verdict, compare
from .provenance import commits_line
from .stats import CONFIDENCE, mean_interval

Runs = dict[str, list[tuple[Path, list[dict]]]]
RULE_LINK = "the verdict rule: docs/results/README.md#the-comparison-protocol"


def seed_of(run_dir: Path) -> int | None:
    """The seed of a run in a sweep's ``<variant>/seed<k>/<run>/`` layout."""
    name = run_dir.parent.name
    return int(name[4:]) if name.startswith("seed") and name[4:].isdigit() else None


def by_seed(runs: Runs) -> dict[str, dict[int, list[dict]]]:
    """variant -> seed -> round records (the newest run of a seed where there are several)."""
    out: dict[str, dict[int, list[dict]]] = {}
    for variant, items in runs.items():
        for run_dir, records in sorted(items, key=lambda item: item[0].name):
            seed = seed_of(run_dir)
            if seed is not None:
                out.setdefault(variant, {})[seed] = records
    return out


def last_mean_cell(values: list[float]) -> str:
    """"83.12 [82.40, 83.84]" in %: the mean and its t-interval (one value: just it)."""
    interval = mean_interval(values)
    if interval.n < 2:
        return f"{100 * interval.mean:.2f}"
    return f"{100 * interval.mean:.2f} [{100 * interval.low:.2f}, {100 * interval.high:.2f}]"


def effect_text(claim: Claim, value: float) -> str:
    """An effect as the page shows it: a ratio (budget claims) or points (accuracy)."""
    if claim.measure == "budget-to-target":
        return f"{math.exp(value):.2f}×"
    return f"{100 * value:+.2f}"


def claim_markdown(claim: Claim, comparisons: list[Comparison], labels: dict[str, str]) -> str:
    """One claim: what is compared, the table against each baseline, the verdict."""
    if claim.measure == "budget-to-target":
        what = (f"{claim.budget} to reach {100 * float(claim.target):g} % (best-so-far "
                f"accuracy), baseline / candidate; claimed ≥ {claim.effect:g}×")
    else:
        what = (f"accuracy difference candidate − baseline in points, each within the budget "
                f"({claim.budget}) the shorter run spent; claimed ≥ {100 * claim.effect:+g}")
    lines = [f"### Claim `{claim.name}`: {claim.statement}", "",
             f"Source: {claim.paper}. Candidate: {labels.get(claim.candidate, claim.candidate)}. "
             f"Measured: {what}.", "",
             f"| baseline | seeds | per seed | mean [{100 * CONFIDENCE:g} % interval] | "
             "paired t-test p | verdict | why |", "|---|---|---|---|---|---|---|"]
    for c in comparisons:
        per_seed = ", ".join(effect_text(claim, e) for e in c.effects) or "-"
        interval = ("-" if c.interval is None else
                    f"{effect_text(claim, c.interval.mean)} [{effect_text(claim, c.interval.low)}"
                    f", {effect_text(claim, c.interval.high)}]")
        p = "-" if c.p_value is None else f"{c.p_value:.3g}"
        lines.append(f"| {labels.get(c.baseline, c.baseline)} | {len(c.seeds)} | {per_seed} | "
                     f"{interval} | {p} | {c.verdict} | {c.why} |")
    lines += ["", f"Verdict: **{claim_verdict(comparisons)}** ({RULE_LINK})."]
    return "\n".join(lines)


def point_values(point: str) -> dict[str, str]:
    """``lr=0.05+proximal-mu=0.01`` (:func:`simulation.tuning.point_name`) -> its values."""
    return dict(part.split("=", 1) for part in point.split("+") if "=" in part)


def grid_edges(choice: dict) -> list[str]:
    """The knobs the chosen point sets to the smallest or largest number tried, where more
    than one was: "lr at the largest tried" (a better value may lie beyond the grid)."""
    tried: dict[str, set[float]] = {}
    for point in choice.get("scores", {}):
        for key, text in point_values(point).items():
            try:
                tried.setdefault(key, set()).add(float(text))
            except ValueError:
                continue
    edges = []
    for key, text in point_values(str(choice.get("point", ""))).items():
        values = tried.get(key, set())
        try:
            value = float(text)
        except ValueError:
            continue
        if len(values) > 1 and value in (min(values), max(values)):
            edges.append(f"{key} at the {'largest' if value == max(values) else 'smallest'} "
                         "tried")
    return edges


def tuning_markdown(chosen: dict, labels: dict[str, str]) -> str:
    """The tuned values and every point's validation score; a choice at the grid's edge is
    said so (:func:`grid_edges`)."""
    if not chosen:
        return ""
    lines = ["| variant | chosen | validation scores (last-10 mean, %) |", "|---|---|---|"]
    for variant, choice in chosen.items():
        scores = ", ".join(f"{point}: {100 * score:.2f}"
                           for point, score in choice.get("scores", {}).items())
        edges = grid_edges(choice)
        point = str(choice.get("point", "?")) + (f" ({'; '.join(edges)})" if edges else "")
        lines.append(f"| {labels.get(variant, variant)} | {point} | {scores} |")
    return "\n".join(lines)


def protocol_section(claims: list[Claim], runs: Runs, labels: dict[str, str], out: Path,
                     chosen: dict | None = None) -> str:
    """The section's Markdown; writes ``out/claims.csv`` (one row per claim and baseline)."""
    seeds = by_seed(runs)
    parts = ["## Protocol", "", METRIC_SENTENCE,
             commits_line([run_dir for items in runs.values() for run_dir, _ in items]), ""]
    parts += ["| variant | seeds | last-10 mean accuracy (%) [95 % interval] |", "|---|---|---|"]
    for variant, items in runs.items():
        values = [last_mean(records) for _, records in items]
        parts.append(f"| {labels.get(variant, variant)} | {len(values)} | "
                     f"{last_mean_cell(values)} |")
    tuned = tuning_markdown(chosen or {}, labels)
    if tuned:
        parts += ["", "Tuned on the validation split (one seed, the same number of runs per "
                  "variant; the test set never tunes):", "", tuned]
    rows = []
    for claim in claims:
        comparisons = compare(claim, seeds)
        parts += ["", claim_markdown(claim, comparisons, labels)]
        for c in comparisons:
            rows.append({"claim": claim.name, "statement": claim.statement,
                         "paper": claim.paper, "candidate": claim.candidate,
                         "baseline": c.baseline, "measure": claim.measure,
                         "budget": claim.budget, "claimed": claim.effect,
                         "seeds": " ".join(map(str, c.seeds)),
                         "effects": " ".join(f"{e:.6g}" for e in c.effects),
                         "mean": None if c.interval is None else c.interval.mean,
                         "low": None if c.interval is None else c.interval.low,
                         "high": None if c.interval is None else c.interval.high,
                         "p": c.p_value, "verdict": c.verdict,
                         "claim-verdict": claim_verdict(comparisons)})
    if rows:
        with (out / "claims.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return "\n".join(parts) + "\n\n"

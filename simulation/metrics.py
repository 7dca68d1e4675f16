"""Run-log metrics for reports: best-so-far curves, rounds / bytes / simulated seconds to a
target accuracy, and accuracy over seeds as the tables print it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strategies import contract as C


def best_so_far(values: Sequence[float]) -> np.ndarray:
    """Running maximum: the monotone curve McMahan et al. read rounds-to-target from."""
    return np.maximum.accumulate(np.asarray(values, dtype=np.float64))


def crossing(xs: Sequence[float], accuracy: Sequence[float], target: float) -> float | None:
    """Where the best-so-far accuracy curve first reaches ``target``, linearly
    interpolated between the two evaluated points around it (McMahan et al. 2017,
    Sec. 3); None if it never does. ``xs`` is the round number or the bytes so far."""
    best = best_so_far(accuracy)
    hits = np.flatnonzero(best >= target)
    if hits.size == 0:
        return None
    i = int(hits[0])
    if i == 0:
        return float(xs[0])
    lo, hi = best[i - 1], best[i]
    fraction = (target - lo) / (hi - lo)
    return float(xs[i - 1] + fraction * (xs[i] - xs[i - 1]))


def evaluated(records: list[dict]) -> list[dict]:
    """The records of the rounds the server evaluated (``eval-every``: the others have no
    accuracy; the last round always has one)."""
    return [r for r in records if r.get(C.LOG_ACCURACY) is not None]


def rounds_to_target(records: list[dict], target: float) -> float | None:
    """Rounds until the best-so-far test accuracy reaches ``target`` (interpolated between
    evaluated rounds)."""
    points = evaluated(records)
    return crossing([r[C.LOG_ROUND] for r in points], [r[C.LOG_ACCURACY] for r in points], target)


def cumulative_bytes(records: list[dict]) -> np.ndarray:
    """Bytes up + down communicated up to and including each round (round 0 = 0), a
    Power-of-Choice loss query's model downloads included."""
    per_round = [
        float(r.get(C.LOG_BYTES_UP, 0) or 0) + float(r.get(C.LOG_BYTES_DOWN, 0) or 0)
        + float(r.get(C.LOG_POC_QUERY_BYTES, 0) or 0)
        for r in records
    ]
    return np.cumsum(per_round)


def evaluated_bytes(records: list[dict]) -> np.ndarray:
    """:func:`cumulative_bytes` at the evaluated rounds (:func:`evaluated`)."""
    total = cumulative_bytes(records)
    return np.array([b for b, r in zip(total, records) if r.get(C.LOG_ACCURACY) is not None])


def bytes_to_target(records: list[dict], target: float) -> float | None:
    """Bytes communicated until the best-so-far accuracy reaches ``target`` (interpolated
    between evaluated rounds)."""
    return crossing(evaluated_bytes(records), [r[C.LOG_ACCURACY] for r in evaluated(records)],
                    target)


def cumulative_updates(records: list[dict]) -> np.ndarray:
    """Client updates aggregated up to and including each round (``clients-received``;
    round 0 = 0): FedBuff's efficiency measure, "client trips" (Nguyen et al. 2022)."""
    return np.cumsum([float(r.get(C.LOG_CLIENTS_RECEIVED, 0) or 0) for r in records])


def updates_to_target(records: list[dict], target: float) -> float | None:
    """Client updates until the best-so-far accuracy reaches ``target`` (interpolated
    between evaluated rounds)."""
    total = cumulative_updates(records)
    at = np.array([u for u, r in zip(total, records) if r.get(C.LOG_ACCURACY) is not None])
    return crossing(at, [r[C.LOG_ACCURACY] for r in evaluated(records)], target)


def has_clock(records: list[dict]) -> bool:
    """Whether a run log carries the simulated clock (``sim-elapsed`` after round 0)."""
    return any(r.get(C.LOG_SIM_ELAPSED) is not None for r in records)


def sim_elapsed(records: list[dict]) -> np.ndarray:
    """Simulated seconds since the start at each round (round 0, the initial model, = 0)."""
    return np.array([float(r.get(C.LOG_SIM_ELAPSED) or 0.0) for r in records])


def sim_seconds_to_target(records: list[dict], target: float) -> float | None:
    """Simulated seconds until the best-so-far accuracy reaches ``target`` (interpolated);
    None if it never does or the run has no clock."""
    if not has_clock(records):
        return None
    scored = evaluated(records)
    return crossing(sim_elapsed(scored), [r[C.LOG_ACCURACY] for r in scored], target)


def percent_over_seeds(row: dict, name: str) -> str:
    """A summary row's ``<name>-mean`` in percent, ``± <name>-std`` when two or more seeds
    ran (``row["seeds"]``): "87.87 ± 0.12"; one seed has no spread to print: "87.87"."""
    mean = f"{100 * row[f'{name}-mean']:.2f}"
    return mean if int(row["seeds"]) < 2 else f"{mean} ± {100 * row[f'{name}-std']:.2f}"


# ------------------------------------------------------------------ the comparison protocol
LAST_EVALUATIONS = 10  # the one accuracy metric of a protocol page: mean of the last 10
BUDGETS = ("sim-seconds", "client-updates", "bytes", "rounds")  # axes a claim compares on


def budget_axis(records: list[dict], budget: str) -> np.ndarray:
    """The budget spent by each evaluated round (:func:`evaluated`): simulated seconds, client
    updates aggregated, bytes up + down, or rounds."""
    scored = [i for i, r in enumerate(records) if r.get(C.LOG_ACCURACY) is not None]
    if budget == "sim-seconds":
        return sim_elapsed(records)[scored]
    if budget == "client-updates":
        return cumulative_updates(records)[scored]
    if budget == "bytes":
        return cumulative_bytes(records)[scored]
    if budget == "rounds":
        return np.array([float(records[i][C.LOG_ROUND]) for i in scored])
    raise ValueError(f"budget {budget!r} is not one of {', '.join(BUDGETS)}")


def budget_to_target(records: list[dict], budget: str, target: float) -> float | None:
    """The budget spent until the best-so-far accuracy reaches ``target`` (interpolated, as
    :func:`crossing`); None if the run never reaches it."""
    return crossing(budget_axis(records, budget),
                    [r[C.LOG_ACCURACY] for r in evaluated(records)], target)


def last_mean(records: list[dict], budget: str = "rounds", limit: float | None = None,
              count: int = LAST_EVALUATIONS) -> float:
    """Mean accuracy of the last ``count`` evaluations spent within ``limit`` of ``budget``
    (None: the whole run); fewer when fewer were made. Round 0's evaluation (the initial
    model, before any training) counts only in a run that made no other."""
    scored = evaluated(records)
    if limit is not None:
        spent = budget_axis(records, budget)
        scored = [r for r, b in zip(scored, spent) if b <= limit + 1e-9 * max(1.0, abs(limit))]
    trained = [r for r in scored if r.get(C.LOG_ROUND) != 0]
    scored = trained or scored
    if not scored:
        raise ValueError(f"no evaluation within a budget of {limit:g} {budget}")
    return float(np.mean([r[C.LOG_ACCURACY] for r in scored[-count:]]))

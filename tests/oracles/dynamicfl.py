"""Test oracles of DynamicFL's schedule (Le et al., DynamicFL, Alg. 1): reference simulators.

Not product code: :class:`strategies.DynamicFL` runs a :class:`~strategies.algorithms.dynamicfl_schedule.
SyncSchedule` on the Grid; these run the same plan (or Algorithm 1 literally, step by step)
in-process with a local-step callable, so the tests can check the strategy and the plan
against them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from strategies.algorithms.dynamicfl_schedule import (
    Chunk,
    Client,
    IntervalSpec,
    Params,
    SyncSchedule,
    capped,
    kappa_hat,
    num_syncs,
)

LocalStepFn = Callable[[Client, Params, int, int], Params]


def num_syncs_reference_code(interval: int, local_steps: int) -> int:
    """nu as the official code counts it: L - 1 at interval 1 (its last chunk is 2 steps),
    else ceil(L / I). Only for comparing kappa-hat with the paper's tables."""
    nu = num_syncs(interval, local_steps)
    return nu - 1 if capped(interval, local_steps) == 1 and local_steps > 1 else nu


def plan_from_groups(
    groups: Mapping[str, Iterable[Client]], intervals: Mapping[str, int], local_steps: int,
    *, frozen: Iterable[Client] = (), num_active: int = 0,
) -> SyncSchedule:
    """A plan from named groups (e.g. {"high": z, "low": rest}) and an interval per group."""
    per_client: dict[Client, int] = {}
    for name, members in groups.items():
        if name not in intervals:
            raise ValueError(f"group {name!r} has no interval; intervals are given for "
                             f"{sorted(intervals)}")
        for m in members:
            if m in per_client:
                raise ValueError(f"client {m!r} is in more than one group")
            per_client[m] = capped(intervals[name], local_steps)
    frozen_t = tuple(frozen)
    if set(frozen_t) & set(per_client):
        raise ValueError("a frozen client cannot also train")
    return SyncSchedule(local_steps, per_client, frozen_t, num_active=num_active)


@dataclass
class RoundTrace:
    """What :func:`simulate_round` did, for checking the invariants.

    Attributes
    ----------
    global_params
        W_g^t, the average at step L.
    events : list of (step, clients, average)
        Every server aggregation, in order, with exactly the clients averaged.
    dispatched : list of (Chunk, step)
        Every chunk with the step at which the server sent it (= its start).
    received : dict client -> list of steps
        When each client was sent a model (0: the round-start broadcast).
    steps_done : dict client -> int
        Local steps each client took.
    """

    global_params: Params
    events: list[tuple[int, tuple[Client, ...], Params]] = field(default_factory=list)
    dispatched: list[tuple[Chunk, int]] = field(default_factory=list)
    received: dict[Client, list[int]] = field(default_factory=dict)
    steps_done: dict[Client, int] = field(default_factory=dict)


def run_plan(
    initial_params: Params,
    local_step_fn: LocalStepFn,
    plan: SyncSchedule,
    weights: Mapping[Client, float],
) -> RoundTrace:
    """Run one round by chunks, as the strategy does on the Grid.

    Each chunk is computed when it is dispatched (its start step) and its result is
    held until its end step; at each sync event the held results of exactly the clients
    that sync there are averaged (weights |D_m|) and sent back only to them, which
    starts their next chunk. ``local_step_fn(client, params, start_step, num_steps)``
    returns the client's parameters after ``num_steps`` steps; it must not modify its
    input and may keep per-client state (momentum) in a closure.
    """
    trace = RoundTrace(global_params=initial_params)
    held: dict[Client, Params] = {}

    def dispatch(chunk: Chunk, params: Params, at: int) -> None:
        trace.dispatched.append((chunk, at))
        trace.received.setdefault(chunk.client, []).append(at)
        held[chunk.client] = local_step_fn(chunk.client, params, chunk.start, chunk.num_steps)
        trace.steps_done[chunk.client] = trace.steps_done.get(chunk.client, 0) + chunk.num_steps

    for chunk in plan.first_chunks():
        dispatch(chunk, initial_params, 0)
    for event in plan.events:
        members = list(event.clients)
        models = [held.pop(m) for m in members]
        w = [float(weights[m]) for m in members]
        if event.step == plan.local_steps and plan.frozen:  # 'x*' code mode
            members += list(plan.frozen)
            models += [initial_params] * len(plan.frozen)
            w += [float(weights[m]) for m in plan.frozen]
        average = weighted_average(models, w)
        trace.events.append((event.step, tuple(members), average))
        if event.step == plan.local_steps:
            trace.global_params = average
            continue
        for m in event.clients:
            nxt = plan.next_chunk(m, event.step)
            assert nxt is not None
            dispatch(nxt, average, event.step)
    if held:  # pragma: no cover - a plan always ends every chunk at an event
        raise RuntimeError(f"results never averaged: {sorted(map(str, held))}")
    return trace


def simulate_round(
    initial_params: Params,
    local_step_fn: LocalStepFn,
    groups: Mapping[str, Iterable[Client]],
    intervals: Mapping[str, int],
    L: int,
    weights: Mapping[Client, float],
    *,
    frozen: Iterable[Client] = (),
) -> RoundTrace:
    """One DynamicFL round by chunks: ``groups`` (e.g. {"high": z, "low": rest}) with one
    interval per group (capped at L), aggregation weights |D_m|; see :func:`run_plan`.

    ``frozen``: 'x*' code mode clients (untrained, start model in the final average).
    """
    plan = plan_from_groups(groups, intervals, L, frozen=frozen)
    return run_plan(initial_params, local_step_fn, plan, weights)


def simulate_round_stepwise(
    initial_params: Params,
    local_step_fn: LocalStepFn,
    intervals: Mapping[Client, int],
    L: int,
    weights: Mapping[Client, float],
) -> Params:
    """Algorithm 1 literally (lines 12-20): for l = 1..L every client takes one step, then
    U_l = {m : l mod I_m = 0 or l = L} are averaged and receive the average. Slow
    (L calls per client); the reference :func:`run_plan` is checked against."""
    models = {m: initial_params for m in intervals}
    caps = {m: capped(i, L) for m, i in intervals.items()}
    average = initial_params
    for step in range(1, L + 1):
        for m in models:
            models[m] = local_step_fn(m, models[m], step - 1, 1)
        sync = [m for m in models if step % caps[m] == 0 or step == L]
        if sync:
            average = weighted_average([models[m] for m in sync], [weights[m] for m in sync])
            for m in sync:
                models[m] = average
    return average


def expected_kappa_hat(
    spec: IntervalSpec, num_active: int, group_size: int, local_steps: int, *,
    reference_code: bool = False,
) -> float:
    """kappa-hat from group sizes: (|z| nu_high + (n - |z|) nu_low) / (n L);
    'x*': |z| nu_high / (n L).

    ``reference_code=True`` counts L - 1 syncs at interval 1 like the official code (the
    paper's tables).
    """
    count = num_syncs_reference_code if reference_code else num_syncs
    if spec.single:
        return count(spec.high, local_steps) / local_steps
    total = group_size * count(spec.high, local_steps)
    if not spec.only_high:
        assert spec.low is not None
        total += (num_active - group_size) * count(spec.low, local_steps)
    return kappa_hat([total], num_active, local_steps)


# ---------------------------------------------------------------- the oracle's average
def weighted_average(models: Sequence[Params], weights: Sequence[float]) -> Params:
    """sum_k (w_k / sum w) x_k, array by array; a single model is returned as an exact copy.

    The oracle's own average, independent of the strategies' kernel
    (:func:`strategies.engine.averaging.weighted_mean`, which sums in the arrays' dtype): floating
    arrays are summed in float64 and cast back to their dtype; integer arrays (not
    parameters) get the weighted mean, rounded.
    """
    if len(models) != len(weights) or not models:
        raise ValueError(f"need the same positive number of models and weights, got "
                         f"{len(models)}, {len(weights)}")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(~np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"weights must be finite and > 0, got {w.tolist()}")
    if len(models) == 1:
        return _map(lambda a: np.array(a, copy=True), models[0])
    c = w / w.sum()
    keys = _keys(models[0])

    def average(key):
        first = _get(models[0], key)
        acc = np.zeros(np.shape(first), dtype=np.float64)
        for c_k, model in zip(c, models):
            acc += c_k * np.asarray(_get(model, key), dtype=np.float64)
        if np.issubdtype(np.asarray(first).dtype, np.floating):
            return acc.astype(np.asarray(first).dtype)
        return np.rint(acc).astype(np.asarray(first).dtype)

    if isinstance(models[0], Mapping):
        return {k: average(k) for k in keys}
    return [average(k) for k in keys]


def _keys(params: Params):
    return list(params.keys()) if isinstance(params, Mapping) else list(range(len(params)))


def _get(params: Params, key):
    return params[key]


def _map(fn, params: Params) -> Params:
    if isinstance(params, Mapping):
        return {k: fn(v) for k, v in params.items()}
    return [fn(v) for v in params]

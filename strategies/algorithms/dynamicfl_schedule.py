"""DynamicFL's round: two-frequency synchronisation, planned by chunks (pure numpy).

Le et al., DynamicFL, Alg. 1 (lines 6-20), Eq. 2 (cost) and Eq. 4 (L).
No Flower types here; :mod:`strategies.algorithms.dynamicfl` moves these plans over the Grid.

One round t
-----------
Every training client m does exactly L local SGD steps. Client m syncs at its sync
steps S_m = {I_m, 2 I_m, ...} ∩ [1, L-1] ∪ {L}, |S_m| = nu_m = ceil(L / I_m). At
step l the server averages, weighted by |D_m|, the current models of exactly the
clients U_l = {m : l in S_m} and sends that average back to them only; the others
keep training their own model. At l = L every client syncs and that average is the
round's global model W_g^t.

Chunks
------
Between two of its syncs, a client's work depends only on the model it received at
the first, its own batch stream and its own optimizer state. So the server sends
each chunk (start-step s, num-steps k = next sync - s) when it starts and holds the
returned weights until the chunk's end step s + k. :class:`SyncSchedule` lists every
client's chunks and the ordered sync events; :class:`strategies.DynamicFL` runs them on
the Grid (the tests check it against Algorithm 1's step-by-step loop).

Interval levels and presets
---------------------------
Levels a-g = 1, 4, 16, 32, 64, 128, 256 local steps between syncs, capped at L.
"x-y": the high group at level x, the low group at y. "x": everybody at x
(``"a"`` = DynamicSGD). ``"x*"``: only the high group trains (the paper's ablation
"training exclusively with high-frequency clients"); :data:`X_STAR_MODES` says what
happens to the untrained low group. FedAvg-equivalent: everybody at interval L.

Cost
----
kappa-hat = sum_m nu_m / (|M^t| L) (the server cost of Eq. 2 divided by DynamicSGD's,
2 |W| |M^t| L), and bytes: each sync is one upload and one download of the model (the
round-start broadcast is the download that goes with the sync at L).

Convention for nu: we count the syncs that Alg. 1 performs, nu = |S_m| = ceil(L/I),
so interval 1 gives nu = L and DynamicSGD costs kappa-hat = 1. The paper's tables
print 0.996 for DynamicSGD and 0.302 for Dynamic-0.3 'a-g' at L = 250 because the
official code performs L - 1 syncs at interval 1 (its last chunk is two steps long);
our own schedule gives 0.303 for Dynamic-0.3 'a-g' ((3 * 250 + 7 * 1) / 2500).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

LEVELS: dict[str, int] = {"a": 1, "b": 4, "c": 16, "d": 32, "e": 64, "f": 128, "g": 256}
X_STAR_MODES = ("paper", "code")
"""'x*' ablation, what happens to the low group, which does not train:

* ``"paper"``: it is left out of the round entirely (not trained, not averaged, no cost);
  the global model is the average of the high group at L (paper: "training exclusively
  with high-frequency clients").
* ``"code"``: the official code's behaviour: it does not train and sends nothing, but
  its unchanged start-of-round model W_g^{t-1} still enters the |D_m|-weighted average
  at L (a damping of the update). Its communication is not counted.
"""

Client = Hashable
Params = Mapping[str, np.ndarray] | Sequence[np.ndarray]


# ------------------------------------------------------------------ intervals
def level_interval(level: str | int) -> int:
    """The interval of a level letter a-g, or an explicit positive int."""
    if isinstance(level, str):
        key = level.strip().lower()
        if key in LEVELS:
            return LEVELS[key]
        if key.isdigit():
            return _positive_int(int(key), "interval")
        raise ValueError(f"interval level {level!r} is not known; use a-g "
                         f"({', '.join(f'{k}={v}' for k, v in LEVELS.items())}) or a positive int")
    return _positive_int(level, "interval")


def capped(interval: int, local_steps: int) -> int:
    """min(I, L): an interval longer than the round syncs only at L ('g' = 256 > 250)."""
    return min(_positive_int(interval, "interval"), _positive_int(local_steps, "local_steps"))


@dataclass(frozen=True)
class IntervalSpec:
    """Intervals of the two groups ("x-y"), everybody at one interval ("x"), or "x*".

    ``high`` and ``low`` are uncapped step counts; ``low`` is None for "x*".
    """

    high: int
    low: int | None
    only_high: bool = False

    @property
    def single(self) -> bool:
        """Everyone at the same interval: the grouping does not matter (no DynaComm needed)."""
        return not self.only_high and self.low == self.high

    def __str__(self) -> str:
        def name(i: int) -> str:
            return next((k for k, v in LEVELS.items() if v == i), str(i))
        if self.only_high:
            return f"{name(self.high)}*"
        return name(self.high) if self.single else f"{name(self.high)}-{name(self.low)}"


def parse_interval_spec(text: str) -> IntervalSpec:
    """``"a-g"``, ``"b-g"``, ``"a"`` (everyone at 1), ``"c*"`` (only high trains), ``"4-300"``."""
    raw = str(text).strip().lower()
    if not raw:
        raise ValueError("empty interval spec; use e.g. 'a-g', 'a', 'a*' or '4-300'")
    if raw.endswith("*"):
        return IntervalSpec(level_interval(raw[:-1]), None, only_high=True)
    parts = raw.split("-")
    if len(parts) == 1:
        i = level_interval(parts[0])
        return IntervalSpec(i, i)
    if len(parts) != 2:
        raise ValueError(f"interval spec {text!r} must be 'x-y', 'x' or 'x*'")
    high, low = level_interval(parts[0]), level_interval(parts[1])
    if high > low:
        raise ValueError(f"interval spec {text!r}: the high-frequency group's interval ({high}) "
                         f"must not be longer than the low group's ({low})")
    return IntervalSpec(high, low)


def dynamic_sgd() -> IntervalSpec:
    """Preset DynamicSGD: every active client in the high group, syncing after every step."""
    return IntervalSpec(1, 1)


def fedavg_equivalent(local_steps: int) -> IntervalSpec:
    """Preset FedAvg with equal steps: everybody at interval L, one sync per round."""
    steps = _positive_int(local_steps, "local_steps")
    return IntervalSpec(steps, steps)


def x_star(level: str | int) -> IntervalSpec:
    """Preset 'x*': only the high group trains, at level x."""
    return IntervalSpec(level_interval(level), None, only_high=True)


def steps_per_round(dataset_sizes: Sequence[int], epochs: float, batch_size: int) -> int:
    """L of Eq. 4: the mean FedAvg step count, sum_m |D_m| E / (M B), truncated as in the
    official code (``int(N / M * E / B)``); at least 1.

    Fashion-MNIST 60,000 / 100 clients, E = 5, B = 10: L = 300. CIFAR-10: 250.
    """
    sizes = np.asarray(dataset_sizes, dtype=np.float64)
    if sizes.size == 0 or np.any(sizes < 0):
        raise ValueError(f"dataset_sizes must be non-empty and >= 0, got {sizes.tolist()}")
    if epochs <= 0 or batch_size <= 0:
        raise ValueError(f"epochs ({epochs}) and batch_size ({batch_size}) must be > 0")
    return max(1, int(sizes.sum() * epochs / (sizes.size * batch_size) + 1e-9))


# ------------------------------------------------------------------ syncs and chunks
def sync_steps(interval: int, local_steps: int) -> tuple[int, ...]:
    """S = {I, 2I, ...} ∩ [1, L-1] ∪ {L}, ascending (Alg. 1 l. 16: l mod I = 0 or l = L)."""
    i = capped(interval, local_steps)
    return tuple(range(i, local_steps, i)) + (local_steps,)


def num_syncs(interval: int, local_steps: int) -> int:
    """nu = |S| = ceil(L / min(I, L))."""
    return -(-local_steps // capped(interval, local_steps))


@dataclass(frozen=True)
class Chunk:
    """``num_steps`` local steps of ``client`` from ``start`` (steps already done this round)."""

    client: Client
    start: int
    num_steps: int

    @property
    def end(self) -> int:
        """The step at which the chunk's result is averaged."""
        return self.start + self.num_steps


def chunks_for(client: Client, interval: int, local_steps: int) -> tuple[Chunk, ...]:
    """A client's chunks: (0, s_1), (s_1, s_2 - s_1), ..., ending at L."""
    ends = sync_steps(interval, local_steps)
    starts = (0,) + ends[:-1]
    return tuple(Chunk(client, s, e - s) for s, e in zip(starts, ends))


@dataclass(frozen=True)
class SyncEvent:
    """At ``step``, exactly ``clients`` sync (ordered as in the plan)."""

    step: int
    clients: tuple[Client, ...]


@dataclass(frozen=True)
class SyncSchedule:
    """The schedule of one round.

    Attributes
    ----------
    local_steps : int
        L.
    intervals : dict
        Capped interval of each training client.
    frozen : tuple
        'x*' code mode: clients that do not train but whose start model enters the final
        average (no messages, no cost).
    num_active : int
        |M^t| (denominator of kappa-hat; includes non-training clients).
    """

    local_steps: int
    intervals: dict[Client, int]
    frozen: tuple[Client, ...] = ()
    num_active: int = 0
    chunks: dict[Client, tuple[Chunk, ...]] = field(init=False, repr=False)
    events: tuple[SyncEvent, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        chunks = {m: chunks_for(m, i, self.local_steps) for m, i in self.intervals.items()}
        by_step: dict[int, list[Client]] = {}
        for m, own in chunks.items():
            for c in own:
                by_step.setdefault(c.end, []).append(m)
        events = tuple(SyncEvent(s, tuple(by_step[s])) for s in sorted(by_step))
        object.__setattr__(self, "chunks", chunks)
        object.__setattr__(self, "events", events)
        if self.num_active < len(self.intervals) + len(self.frozen):
            object.__setattr__(self, "num_active", len(self.intervals) + len(self.frozen))

    @property
    def training(self) -> tuple[Client, ...]:
        return tuple(self.intervals)

    @property
    def nu(self) -> dict[Client, int]:
        """Syncs per round of every training client (frozen clients: none)."""
        return {m: len(c) for m, c in self.chunks.items()}

    def first_chunks(self) -> list[Chunk]:
        """What to dispatch at step 0 (with the global model W_g^{t-1})."""
        return [own[0] for own in self.chunks.values()]

    def chunk_ending(self, client: Client, step: int) -> Chunk:
        """The chunk of ``client`` that ends (syncs) at ``step``."""
        for c in self.chunks[client]:
            if c.end == step:
                return c
        raise ValueError(f"client {client!r} does not sync at step {step}")

    def next_chunk(self, client: Client, step: int) -> Chunk | None:
        """The chunk ``client`` starts at ``step`` (after syncing there); None at L."""
        for c in self.chunks[client]:
            if c.start == step:
                return c
        return None


def assign_intervals(
    active: Sequence[Client],
    high_group: Iterable[Client],
    spec: IntervalSpec,
    local_steps: int,
    *,
    x_star_mode: str = "paper",
) -> SyncSchedule:
    """The round's plan from the active clients, DynaComm's group z and the interval spec.

    "x-y": z at x, the rest at y. "x": everybody at x (z is ignored). "x*": z at x and
    the rest left out ("paper") or frozen into the final average ("code").
    """
    if x_star_mode not in X_STAR_MODES:
        raise ValueError(f"x_star_mode={x_star_mode!r} is not known; use one of "
                         f"{', '.join(X_STAR_MODES)}")
    z = set(high_group)
    unknown = z.difference(active)
    if unknown:
        raise ValueError(f"high-frequency clients {sorted(map(str, unknown))} are not active")
    if spec.only_high:
        intervals = {m: capped(spec.high, local_steps) for m in active if m in z}
        frozen = tuple(m for m in active if m not in z) if x_star_mode == "code" else ()
        return SyncSchedule(local_steps, intervals, frozen, num_active=len(active))
    assert spec.low is not None
    intervals = {m: capped(spec.high if (m in z or spec.single) else spec.low, local_steps)
                 for m in active}
    return SyncSchedule(local_steps, intervals, (), num_active=len(active))


# ------------------------------------------------------------------ cost
@dataclass(frozen=True)
class RoundCost:
    """Communication of one round.

    ``kappa_hat`` = sum nu_m / (|M^t| L); ``syncs`` = sum nu_m; ``bytes_up`` /
    ``bytes_down`` = syncs * model bytes (one upload and one download per sync; the
    round-start broadcast is the download paired with the sync at L).
    """

    kappa_hat: float
    syncs: int
    bytes_up: int
    bytes_down: int


def kappa_hat(nu: Iterable[int], num_active: int, local_steps: int) -> float:
    """Standardised server cost sum_m nu_m / (|M^t| L) (Eq. 2 over DynamicSGD's 2|W||M^t|L)."""
    if num_active < 1 or local_steps < 1:
        raise ValueError(f"num_active ({num_active}) and local_steps ({local_steps}) must be >= 1")
    return float(sum(int(v) for v in nu)) / (num_active * local_steps)


def round_cost(plan: SyncSchedule, model_bytes: int) -> RoundCost:
    """kappa-hat and bytes of a planned round (frozen 'x*' clients cost nothing)."""
    nu = plan.nu
    syncs = sum(nu.values())
    return RoundCost(
        kappa_hat=kappa_hat(nu.values(), max(plan.num_active, 1), plan.local_steps),
        syncs=syncs,
        bytes_up=syncs * int(model_bytes),
        bytes_down=syncs * int(model_bytes),
    )


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)

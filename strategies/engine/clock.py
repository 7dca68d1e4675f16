"""The simulated clock: the time of a round on a heterogeneous fleet (pure; numpy only).

A client's round time, as FedScale models it (Lai et al., "FedScale: Benchmarking Model and
System Performance of Federated Learning at Scale", ICML 2022: its runtime charges a client
compute time plus communication time, from per-device compute speed and bandwidth traces):

    t_i = bytes_down / downlink_i + (tau_i b_i + e_i) c / speed_i + bytes_up / uplink_i      (1)

tau_i the local steps client i runs (the steps the server sent, or that the client
reported: FedVeca's per-client tau, a straggler's partial work), b_i the examples per
step (min(B, n_i), n_i for a full batch; FedVeca's same-batch beta estimate doubles it),
e_i the examples of any other forward-backward pass the algorithm asks of the client
(FedVeca's full local gradient, Luo et al. Alg. 2 line 9), c the model's training seconds
per example on the reference device (calibrated once per model:
``task.devices.seconds_per_example``),
speed_i the device's speed relative to that reference (:mod:`strategies.engine.devices`), the
bandwidths in Mbit/s. A round's simulated time is when the strategy stops waiting: its
last reply, or the deadline D when it dropped a client that could not finish by then
(:func:`round_seconds`). A client that cannot finish by D does the part that fits,
floor((D - transfers) / (b_i c / speed_i)) steps (:func:`steps_within`).

A fleet may vary per round (:meth:`strategies.engine.devices.Fleet.round_profile`): a round's
times use the profiles of that round, the selection policies' expected times the mean
profiles. With ``dropout`` p a client sent work drops out before replying with probability
p, and at a uniform fraction of its t_i, both drawn from ``default_rng([seed, round, p,
DROPOUT_TAG])`` (:meth:`RoundTimer.dropout_point`; an asynchronous task: its task number in
place of the round): the server notices at that time (a lost connection), so a dropped
client counts in the round's time with the fraction of its t_i.

DynamicFL's round is a sequence of synchronisation events (Le et al., Alg. 1 lines
12-20): :func:`sync_event_times` applies eq. (1) chunk by chunk. Its per-node byte budgets
(Eq. 5, tau_m) can come from bandwidth: :func:`byte_budget`.

Every input is what the server knows (the seed, the profiles, the steps it sent or was
told, the batch size, the bytes it sent and received, the model's cost), never a
measured time, so simulation and deployment give the same clock. Server-side time
(aggregation, evaluation) is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from . import devices
from .sampling import num_to_sample
from .devices import DeviceProfile, Fleet

_FIT_TOLERANCE = 1e-9  # a deadline met exactly counts as met


# ------------------------------------------------------------------ eq. (1)
def bytes_per_second(mbps: float) -> float:
    """Mbit/s -> bytes per second (1 Mbit = 10^6 bits)."""
    return mbps * 1e6 / 8.0


def transfer_seconds(num_bytes: float, mbps: float) -> float:
    """Seconds to move ``num_bytes`` at ``mbps``."""
    return float(num_bytes) / bytes_per_second(mbps)


def step_seconds(profile: DeviceProfile, examples_per_step: int,
                 seconds_per_example: float) -> float:
    """One local step: b c / speed."""
    return examples_per_step * seconds_per_example / profile.speed


def client_seconds(profile: DeviceProfile, steps: int, examples_per_step: int,
                   seconds_per_example: float, bytes_down: float, bytes_up: float,
                   extra_examples: int = 0) -> float:
    """Eq. (1): download + (steps * b + e) * c / speed + upload, in simulated seconds."""
    return (transfer_seconds(bytes_down, profile.downlink_mbps)
            + steps * step_seconds(profile, examples_per_step, seconds_per_example)
            + step_seconds(profile, extra_examples, seconds_per_example)
            + transfer_seconds(bytes_up, profile.uplink_mbps))


INFERENCE_SHARE = 1.0 / 3.0  # an evaluated example's compute, of a trained one's (FedScale: 3x)


def evaluation_seconds(profile: DeviceProfile, num_examples: int, seconds_per_example: float,
                       bytes_down: float) -> float:
    """A client evaluating the model it is sent on its ``num_examples`` (a loss query):
    download + n c / (3 speed), a forward pass a third of a trained example (as FedScale
    charges training 3x inference); the loss it sends back is a few bytes."""
    return (transfer_seconds(bytes_down, profile.downlink_mbps)
            + num_examples * INFERENCE_SHARE * seconds_per_example / profile.speed)


def steps_within(deadline: float, profile: DeviceProfile, examples_per_step: int,
                 seconds_per_example: float, bytes_down: float, bytes_up: float,
                 extra_examples: int = 0) -> int:
    """The local steps that fit before ``deadline``: floor((D - down - e c / speed - up) /
    step), >= 0."""
    spare = (deadline - transfer_seconds(bytes_down, profile.downlink_mbps)
             - step_seconds(profile, extra_examples, seconds_per_example)
             - transfer_seconds(bytes_up, profile.uplink_mbps))
    if spare < 0:
        return 0
    per_step = step_seconds(profile, examples_per_step, seconds_per_example)
    if not per_step > 0:
        raise ValueError(f"a local step must take > 0 s, got {per_step!r} (examples per step "
                         f"{examples_per_step}, seconds per example {seconds_per_example})")
    return max(int(math.floor(spare / per_step + _FIT_TOLERANCE)), 0)


def round_seconds(client_times: Sequence[float], deadline: float | None = None,
                  waited_for_deadline: bool = False) -> float:
    """When the server stops waiting: the last client's time; at least the deadline if it
    dropped a client that could not finish by then (``waited_for_deadline``); 0 for none."""
    last = max((float(t) for t in client_times), default=0.0)
    if deadline is not None and waited_for_deadline:
        return max(last, float(deadline))
    return last


def sync_event_times(
    events: Sequence[Sequence[tuple[Hashable, int]]],
    step_secs: Mapping[Hashable, float],
    down_secs: Mapping[Hashable, float],
    up_secs: Mapping[Hashable, float],
    start: float = 0.0,
) -> list[float]:
    """Simulated time of each synchronisation event of a round (Le et al., Alg. 1).

    ``events`` in step order; each lists the clients that sync there, with the local
    steps of the chunk that ends there. A client holds the model ``down_secs`` after the
    round starts or after an event it took part in, runs its chunk (steps x
    ``step_secs``) and uploads (``up_secs``); an event happens when its last member's
    upload arrives. One event holding every client is eq. (1)'s round (FedAvg).
    """
    ready: dict[Hashable, float] = {}
    times: list[float] = []
    for event in events:
        arrivals = [ready.get(c, start + down_secs[c]) + k * step_secs[c] + up_secs[c]
                    for c, k in event]
        now = max(arrivals) if arrivals else (times[-1] if times else start)
        times.append(now)
        for client, _ in event:
            ready[client] = now + down_secs[client]
    return times


def byte_budget(profile: DeviceProfile, seconds: float) -> float:
    """DynamicFL's tau_m (Le et al. Eq. 5) from bandwidth: the bytes a device moves in
    ``seconds`` of transfer per round.

    A sync moves the model down and up (Eq. 2's factor 2), so a second of transfer moves
    the harmonic mean of the two bandwidths, 2 / (1/down + 1/up) bytes.
    """
    down = bytes_per_second(profile.downlink_mbps)
    up = bytes_per_second(profile.uplink_mbps)
    return float(seconds) * 2.0 / (1.0 / down + 1.0 / up)


# ------------------------------------------------------------------ the clock
@dataclass(frozen=True)
class SimClock:
    """A fleet plus the model's training cost: what a strategy needs to keep simulated time.

    Parameters
    ----------
    fleet : strategies.engine.devices.Fleet
        Device profiles by partition id (:class:`~strategies.engine.devices.GeneratedFleet`,
        :func:`~strategies.engine.devices.load_trace`).
    seconds_per_example : float, optional
        c of eq. (1): training seconds per example (forward and backward) on the reference
        device, > 0. Calibrated once per model; a strategy refuses to train without it.
    dropout : float
        Probability in [0, 1) that a client sent work drops out before replying
        (:meth:`RoundTimer.dropout_point`); 0 = never.
    """

    fleet: Fleet
    seconds_per_example: float | None = None
    dropout: float = 0.0
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _round_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.fleet, Fleet):
            raise ValueError(f"fleet must be a strategies.engine.devices.Fleet, got {self.fleet!r}")
        c = self.seconds_per_example
        if c is not None and not (_is_number(c) and math.isfinite(c) and c > 0):
            raise ValueError(f"seconds_per_example must be a finite number > 0, got {c!r}")
        p = self.dropout
        if not (_is_number(p) and 0.0 <= p < 1.0):
            raise ValueError(f"dropout (probability that a client drops out before replying) "
                             f"must be a number in [0, 1), got {p!r}")

    def calibrated(self, seconds_per_example: float) -> SimClock:
        """The same fleet (and dropout) with the model's cost c."""
        return replace(self, seconds_per_example=seconds_per_example)

    def cost(self) -> float:
        """c, or a ValueError saying how to give it."""
        if self.seconds_per_example is None:
            raise ValueError("the simulated clock has no cost per example: pass "
                             "SimClock(fleet, seconds_per_example=c) (fedhetero's ServerApp "
                             "calibrates c with task.devices.seconds_per_example)")
        return float(self.seconds_per_example)

    def profile(self, partition_id: int) -> DeviceProfile:
        """Partition ``partition_id``'s profile (cached)."""
        pid = int(partition_id)
        if pid not in self._cache:
            self._cache[pid] = self.fleet.profile(pid)
        return self._cache[pid]

    def round_profile(self, partition_id: int, server_round: int) -> DeviceProfile:
        """Partition ``partition_id``'s profile in round ``server_round``
        (:meth:`~strategies.engine.devices.Fleet.round_profile`; cached for the latest round),
        :meth:`profile` for a fleet that does not vary per round."""
        if type(self.fleet).round_profile is Fleet.round_profile:
            return self.profile(partition_id)
        key = (int(server_round), int(partition_id))
        if key not in self._round_cache:
            if any(r != key[0] for r, _ in self._round_cache):
                self._round_cache.clear()
            self._round_cache[key] = self.fleet.round_profile(key[1], key[0])
        return self._round_cache[key]


class RoundTimer:
    """A run's simulated time, round after round: the clock state a strategy keeps.

    Per round: :meth:`start_round` (who is online, and the wait for a device window),
    then eq. (1) per client (:meth:`client_seconds`, :meth:`steps_by_deadline`), then
    :meth:`finish_round` (the round's seconds, added to :attr:`elapsed`).

    Parameters
    ----------
    clock : SimClock
        The fleet and the model's cost.
    seed : int
        Seeds the availability draws (``default_rng([seed, round, p, ...])``).
    deadline : float, optional
        D in simulated seconds per round (> 0); None: wait for every reply.
    """

    def __init__(self, clock: SimClock, seed: int, deadline: float | None = None) -> None:
        if not isinstance(clock, SimClock):
            raise ValueError(f"clock must be a strategies.engine.clock.SimClock, got {clock!r}")
        if deadline is not None and not (_is_number(deadline) and math.isfinite(deadline)
                                         and deadline > 0):
            raise ValueError(f"round deadline must be a finite number of simulated seconds > 0 "
                             f"(None: no deadline), got {deadline!r}")
        self.clock = clock
        self.seed = int(seed)
        self.deadline = None if deadline is None else float(deadline)
        self.elapsed = 0.0  # simulated seconds of the finished rounds
        self.server_round: int | None = None  # the round started last (None: none yet)
        self.wait = 0.0  # this round's wait for a device window
        self.delay = 0.0  # this round's work before its clients start (a loss query)

    def calibrate(self, seconds_per_example: float) -> None:
        """Give the clock the model's cost c (:meth:`SimClock.calibrated`)."""
        self.clock = self.clock.calibrated(seconds_per_example)

    def start_round(self, server_round: int, partition_ids: Sequence[int]) -> list[bool]:
        """Which of ``partition_ids`` are online for the round; waits (in simulated time)
        until some device's window opens (:func:`strategies.engine.devices.online_mask`).
        The round's profiles are those of ``server_round`` from here on (:meth:`profile`)."""
        self.server_round = int(server_round)
        profiles = [self.clock.profile(p) for p in partition_ids]
        self.wait = devices.wait_for_window(profiles, self.elapsed)
        return devices.online_mask(profiles, partition_ids, self.seed, server_round,
                                   self.elapsed + self.wait)

    def profile(self, partition_id: int, expected: bool = False,
                draw: int | None = None) -> DeviceProfile:
        """Partition ``partition_id``'s profile in the round started last, or in asynchronous
        task ``draw`` (:meth:`SimClock.round_profile`, the task number in place of the
        round); its mean profile with ``expected`` or before any round started."""
        number = self.server_round if draw is None else draw
        if expected or number is None:
            return self.clock.profile(partition_id)
        return self.clock.round_profile(partition_id, number)

    def bind_sizes(self, sizes: Mapping[int, int]) -> None:
        """Give a fleet whose profiles depend on the partitions' sizes (``needs_sizes``:
        :class:`~strategies.engine.flash_fleet.FlashFleet` with a correlation) the sizes the
        clients reported, partition id -> examples; nothing for any other fleet or when they
        did not change."""
        fleet = self.clock.fleet
        if not getattr(fleet, "needs_sizes", False) or fleet.sizes == dict(sizes):
            return
        self.clock = replace(self.clock, fleet=fleet.with_sizes(sizes))

    def dropout_point(self, partition_id: int, draw: int | None = None) -> float | None:
        """Whether partition ``partition_id`` drops out of the round started last (or of
        task ``draw`` of an asynchronous strategy): None (it does not), or the fraction in
        [0, 1) of its time t_i at which it drops; drawn from ``default_rng([seed, round (or
        draw), p, DROPOUT_TAG])`` (no draw at dropout 0)."""
        p = self.clock.dropout
        number = self.server_round if draw is None else draw
        if p <= 0 or number is None:
            return None
        rng = np.random.default_rng([self.seed, int(number), int(partition_id),
                                     devices.DROPOUT_TAG])
        drops, fraction = rng.random(2)
        return float(fraction) if drops < p else None

    def online_nodes(self, server_round: int, nodes: Sequence[int],
                     partition_ids: Sequence[int], fraction: float) -> tuple[list[int], int]:
        """The ``nodes`` online this round (:meth:`start_round`; ``partition_ids`` theirs, in
        order) and m, how many of them to sample: max(floor(fraction K), 1) of all K nodes,
        at most the online ones."""
        online = [n for n, up in zip(nodes, self.start_round(server_round, partition_ids)) if up]
        return online, min(num_to_sample(fraction, max(len(nodes), 1)), len(online))

    def client_seconds(self, partition_id: int, steps: int, examples_per_step: int,
                       bytes_down: float, bytes_up: float, extra_examples: int = 0,
                       compute: float = 1.0, expected: bool = False,
                       draw: int | None = None) -> float:
        """Eq. (1) for partition ``partition_id`` in the round, or in asynchronous task
        ``draw`` (its mean profile with ``expected``: what a selection policy can know
        beforehand); ``compute`` scales c (a client training a sub-model: its training FLOPs
        over the full model's)."""
        return client_seconds(self.profile(partition_id, expected, draw), steps,
                              examples_per_step, self.clock.cost() * compute, bytes_down,
                              bytes_up, extra_examples)

    def evaluation_seconds(self, partition_id: int, num_examples: int, bytes_down: float,
                           draw: int | None = None) -> float:
        """:func:`evaluation_seconds` for partition ``partition_id`` in the round, or in
        asynchronous task ``draw``."""
        return evaluation_seconds(self.profile(partition_id, draw=draw), num_examples,
                                  self.clock.cost(), bytes_down)

    def delay_start(self, seconds: float) -> None:
        """The round's clients start ``seconds`` later (Power-of-Choice's loss query runs
        first); counted in the round's simulated seconds, not in its window wait."""
        self.delay += float(seconds)

    def steps_by_deadline(self, partition_id: int, examples_per_step: int, bytes_down: float,
                          bytes_up: float, extra_examples: int = 0,
                          compute: float = 1.0) -> int | None:
        """The steps partition ``partition_id`` can do by the deadline (None: no deadline);
        ``compute`` as in :meth:`client_seconds`."""
        if self.deadline is None:
            return None
        return steps_within(self.deadline, self.profile(partition_id), examples_per_step,
                            self.clock.cost() * compute, bytes_down, bytes_up, extra_examples)

    def event_times(self, events: Sequence[Sequence[tuple[int, int]]],
                    examples_per_step: Mapping[int, int], bytes_down: float,
                    bytes_up: float) -> list[float]:
        """:func:`sync_event_times` of a round whose events name partition ids, each sync
        moving ``bytes_down`` and ``bytes_up``; times from the round's start."""
        members = {p for event in events for p, _ in event}
        c = self.clock.cost()
        profiles = {p: self.profile(p) for p in members}
        steps = {p: step_seconds(profiles[p], examples_per_step[p], c) for p in members}
        down = {p: transfer_seconds(bytes_down, profiles[p].downlink_mbps) for p in members}
        up = {p: transfer_seconds(bytes_up, profiles[p].uplink_mbps) for p in members}
        return sync_event_times(events, steps, down, up)

    def finish_round(self, client_times: Sequence[float],
                     waited_for_deadline: bool = False) -> float:
        """The round's simulated seconds (wait + delay + :func:`round_seconds`), added to
        elapsed."""
        seconds = self.wait + self.delay + round_seconds(client_times, self.deadline,
                                                         waited_for_deadline)
        self.elapsed += seconds
        self.wait = self.delay = 0.0
        return seconds


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

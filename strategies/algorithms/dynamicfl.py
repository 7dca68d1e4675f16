"""DynamicFL (Le et al.): DynaComm grouping and two-frequency synchronisation on the Grid.

The math lives in :mod:`strategies.algorithms.dynacomm` (which clients sync often, Eq. 5) and
:mod:`strategies.algorithms.dynamicfl_schedule` (when everybody syncs, Alg. 1 lines 12-20); this
module only moves records. Who takes part is the participation model's
(:mod:`strategies.engine.participation`). A DynamicFL round is not one send-and-receive but a
sequence of sync events on the Grid event loop (:class:`SyncEvents`): each chunk is pushed
when it starts, its reply held until the chunk's end step, so long low-frequency chunks run
while short high-frequency ones come and go. Its round is its own
(:meth:`DynamicFL.train_round`) in the one round loop of :meth:`DynamicFL.start`
(:func:`strategies.engine.rounds.run_rounds`). Evaluation is Flower's FedAvg's.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from logging import INFO, WARNING

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import Result

from .. import contract as C
from ..contract import NUM_STEPS, ROUND_STEPS, START_STEP, Section, logged
from ..engine import averaging as agg
from ..engine import flower_args, records, rounds, schedules, trust_gate
from ..engine.clock import SimClock, byte_budget
from ..engine.event_loop import GridEventLoop
from ..engine.keys import UNIT, Key, Rule, at_least
from ..engine.participation import Participation, check_fraction, check_whole, refuse_dropout
from ..engine.records import to_numpy, to_record
from ..engine.registry import register
from ..engine.round_report import (
    Aggregation,
    ClockTime,
    Drift,
    ParticipationSection,
    RoundReport,
)
from . import dynacomm as dc
from . import dynamicfl_schedule as ds

STATE_VERSION = 1  # of state_dict()
DEFAULT_TIMEOUT = 3600.0  # seconds, Flower's Strategy.start default
CHUNK_HELPER = "strategies.client.train_chunk"
DROPOUT_WHY = ("DynamicFL's sync events wait for every active client of a group; a client "
               "leaving mid-round is not modelled there")


@dataclass(frozen=True)
class DynamicFLSection(Section):
    """DynamicFL's round (Alg. 1): the group, its cost and the sync events run."""

    group_size: int = logged(C.LOG_DYNAMICFL_GROUP_SIZE, default=0)
    kl: float | None = logged(C.LOG_DYNAMICFL_KL, keep_none=True)
    kappa_hat: float = logged(C.LOG_KAPPA_HAT, default=0.0)
    syncs: int = logged(C.LOG_SYNCS, default=0)
    sync_events: int = logged(C.LOG_SYNC_EVENTS, default=0)
    seconds_per_event: float | None = logged(C.LOG_SECONDS_PER_EVENT)
    sim_seconds_per_event: float | None = logged(C.LOG_SIM_SECONDS_PER_EVENT)


class DynamicFL(FlowerFedAvg):
    """DynamicFL / DynamicAvg / DynamicSGD (Le et al., Alg. 1).

    Subclass of Flower's FedAvg for its evaluation half (``configure_evaluate``,
    ``aggregate_evaluate``) and parameters; its round is its own (:meth:`train_round`, the
    round's chunk schedule: module docstring), run by :meth:`start`.

    Parameters
    ----------
    intervals : str
        ``"a-g"`` (high group every step, low group once per round at L = 250), ``"b-g"``,
        ``"c-g"``, ``"a"`` (DynamicSGD), ``"b*"`` (only the high group trains), or
        explicit steps ``"4-300"``; levels a-g = 1, 4, 16, 32, 64, 128, 256, capped at L.
    local_steps : int
        L, local steps of every client per round; 0 computes it by Eq. 4 from all
        clients' sizes and the train config's ``local-epochs`` and ``batch-size``.
    budget_mode : {"dynamic", "fix", "budget", "none"}
        Dynamic-beta (k_max = floor(beta |M^t|)), Fix-beta (ceil(beta M) rich clients
        drawn once), real byte budgets (``comm-budget`` from the query, ``server_budget``
        bytes per round), or no constraint.
    beta : float
        Budget level of "dynamic" / "fix".
    server_budget : float, optional
        tau_g in bytes per round for ``budget_mode="budget"``.
    n_ens : int
        DynaComm's random orderings (10).
    x_star_mode : {"paper", "code"}
        For "x*": drop the low group, or average its unchanged model in at L.
    min_group_size : int
        Smallest high group DynaComm may return (1 as in the paper).
    lr_schedule : LRSchedule, str or callable, optional
        Per-round learning rate, as :class:`strategies.FedAvg`'s (lr_0 = the train config's
        ``lr``, 0.01 without one); a ``"cosine"`` :class:`~strategies.engine.schedules.LRSchedule`
        without ``num_rounds`` takes T from :meth:`start`. None: lr_0 every round.
    cosine_lr_min : float, optional
        Shorthand for ``lr_schedule=LRSchedule("cosine", lr_min=cosine_lr_min)``: cosine
        annealing from lr_0 to this over the run (the official code's schedule).
    clock : SimClock, optional
        Simulated time (:mod:`strategies.engine.clock`), accounted per sync event
        (:func:`strategies.engine.clock.sync_event_times`): each round logs ``sim-seconds``,
        ``sim-elapsed`` and ``sim-seconds-per-event``; offline devices are not sampled.
        Needs ``query_client_info=True`` (profiles are keyed by partition id).
    budget_seconds : float
        > 0: in ``budget_mode="budget"``, each client's tau_m is the bytes its bandwidth
        moves in this many seconds of transfer per round
        (:func:`strategies.engine.clock.byte_budget`), instead of a reported ``comm-budget``;
        needs ``clock``. 0 (default): the reported budgets.
    poll_interval : float
        The longest sleep between two ``pull_messages`` calls while waiting for a sync event
        (:func:`strategies.engine.event_loop.pull_delay`; 0: no sleep).
    fraction_train : float
        C: |M^t| = max(floor(C K), ``min_train_nodes``) active clients per round
        (Flower's default, 1.0; the paper samples C = 0.1 of 100 clients).
    fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes, \
weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, \
evaluate_metrics_aggr_fn, seed, query_client_info, query_timeout, drift_diagnostics, \
participation
        As :class:`strategies.FedAvg` (Flower's ten FedAvg arguments first, positional in
        Flower's order; :mod:`strategies.engine.flower_args`).

    Contract
    --------
    Every chunk reply carries ``arrays``, ``num-examples`` and ``local-steps`` (the
    chunk's steps, run from ``start-step`` on the client's own batch stream and
    optimiser state): ``strategies.client.dynamicfl.train_chunk`` does this. A stock
    ClientApp trains whole epochs and reports no ``local-steps``: the first sync event
    whose replies all lack it stops the run with a
    :class:`strategies.engine.records.ClientContractError` naming that helper. DynaComm's
    grouping (intervals ``"x-y"`` or ``"x*"``), L by Eq. 4 and byte budgets need the
    client-info query (``query_client_info=True`` and
    ``strategies.client.info.client_info_reply`` in the ClientApp's ``@app.query()``);
    without it such a configuration is a ValueError.
    """

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 1,
        min_evaluate_nodes: int = 1,
        min_available_nodes: int = 2,
        weighted_by_key: str = C.NUM_EXAMPLES,
        arrayrecord_key: str = C.ARRAYS,
        configrecord_key: str = C.CONFIG,
        train_metrics_aggr_fn: flower_args.MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: flower_args.MetricsAggregation | None = None,
        *,
        intervals: str = "a-g",
        local_steps: int = 0,
        budget_mode: str = "dynamic",
        beta: float = 0.3,
        server_budget: float | None = None,
        n_ens: int = dc.N_ENS,
        x_star_mode: str = "paper",
        min_group_size: int = 1,
        lr_schedule: schedules.LRSchedule | schedules.Schedule | str | None = None,
        cosine_lr_min: float | None = None,
        poll_interval: float = 0.01,
        seed: int = 0,
        query_client_info: bool = False,
        query_timeout: float = 600.0,
        drift_diagnostics: bool = False,
        clock: SimClock | None = None,
        budget_seconds: float = 0.0,
        participation: Participation | None = None,
    ) -> None:
        check_fraction("fraction_evaluate", fraction_evaluate, allow_zero=True)
        check_whole("min_evaluate_nodes", min_evaluate_nodes, minimum=0)
        flower_args.check_record_keys("DynamicFL", weighted_by_key, arrayrecord_key,
                                      configrecord_key)
        if participation is None:
            participation = Participation(
                fraction_train=fraction_train, seed=seed, min_available_nodes=min_available_nodes,
                min_train_nodes=min_train_nodes, query_client_info=query_client_info,
                query_timeout=query_timeout, clock=clock, owner="DynamicFL")
        super().__init__(**flower_args.flower_base_args(
            participation, fraction_evaluate, min_evaluate_nodes, train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn))
        self.custom_metrics = (train_metrics_aggr_fn, evaluate_metrics_aggr_fn)  # None: ours
        if not callable(getattr(participation.selection, "select", None)):
            raise ValueError(f"DynamicFL picks its active clients with a plain selection policy "
                             f"(select(...), e.g. RandomSelection), not "
                             f"{type(participation.selection).__name__}: DynaComm's groups "
                             f"come from the active set it is given (Le et al., Alg. 1)")
        refuse_dropout("DynamicFL", participation, DROPOUT_WHY)
        self.participation = participation
        self.contract_evidence = records.ContractEvidence()  # one bad client ends no run
        query_client_info, clock = participation.query_client_info, participation.timer
        self.spec = ds.parse_interval_spec(intervals)
        if budget_mode not in dc.BUDGET_MODES:
            raise ValueError(f"budget_mode={budget_mode!r} is not known; use one of "
                             f"{', '.join(dc.BUDGET_MODES)}")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        if x_star_mode not in ds.X_STAR_MODES:
            raise ValueError(f"x_star_mode={x_star_mode!r} is not known; use one of "
                             f"{', '.join(ds.X_STAR_MODES)}")
        for name, value, minimum, meaning in (
                ("local_steps", local_steps, 0, " (0: Eq. 4 sets them)"),
                ("n_ens", n_ens, 1, ""), ("min_group_size", min_group_size, 1, ""),
                ("poll_interval", poll_interval, 0, " seconds")):
            if not value >= minimum:
                raise ValueError(f"{name} must be >= {minimum}{meaning}, got {value!r}")
        if not query_client_info:
            if not self.spec.single:
                raise records.query_required(
                    "DynamicFL", f"intervals={intervals!r} (DynaComm groups clients by their "
                    f"'{C.LABEL_COUNTS}')", "use one interval for everyone, e.g. intervals='a'")
            if local_steps == 0:
                raise records.query_required(
                    "DynamicFL", "local_steps=0 (L by Eq. 4 from every client's num-examples)",
                    "set local_steps=L")
        if not (isinstance(budget_seconds, (int, float)) and math.isfinite(budget_seconds)
                and budget_seconds >= 0):
            raise ValueError(f"budget_seconds must be a finite number >= 0 (0 = the reported "
                             f"comm-budget), got {budget_seconds!r}")
        if budget_seconds > 0 and (clock is None or budget_mode != "budget"):
            raise ValueError(f"budget_seconds={budget_seconds} sets byte budgets from the "
                             f"device bandwidths: it needs budget_mode='budget' (got "
                             f"{budget_mode!r}) and a clock (got {clock!r})")
        self.budget_seconds = float(budget_seconds)
        self.announced_client_sgd = False  # configure_train logs the client's SGD settings once
        self.warned_empty_group = False  # choose_group warns once when z must be empty
        self.local_steps = int(local_steps)
        self.budget_mode = budget_mode
        self.beta = float(beta)
        self.server_budget = server_budget
        self.n_ens = int(n_ens)
        self.x_star_mode = x_star_mode
        self.min_group_size = int(min_group_size)
        if cosine_lr_min is not None:
            if lr_schedule is not None:
                raise ValueError("give lr_schedule or cosine_lr_min (its cosine shorthand), not "
                                 "both")
            lr_schedule = schedules.LRSchedule("cosine", lr_min=cosine_lr_min)
        self.cosine_lr_min = cosine_lr_min
        self.lr_schedule = schedules.as_schedule(lr_schedule)
        self.poll_interval = float(poll_interval)
        self.drift_diagnostics = bool(drift_diagnostics)
        self.budgets: dict[int, float] = {}
        self.rich: set[int] | None = None  # Fix-beta, drawn once over the partition order
        self.schedules: dict[int, ds.SyncSchedule] = {}  # the chunk schedule each round ran
        self.reports: dict[int, RoundReport] = {}
        self.total_rounds: int | None = None  # T of start(), for a cosine schedule without it
        self.restored: dict | None = None  # a checkpoint's state, mapped to nodes in round 1

    def state_dict(self) -> dict:
        """Cross-round state for a checkpoint: L, the Fix-beta rich set (partition ids), the
        reported byte budgets (by partition id), the simulated time. Plain Python, JSON-able.

        Keyed by partition id, not node id, because node ids change between runs."""
        def pid(node: int) -> int | None:
            return self.participation.info(node).partition_id
        rich = (None if self.rich is None else
                sorted(p for p in (pid(n) for n in self.rich) if p is not None))
        budgets = {str(pid(n)): b for n, b in self.budgets.items() if pid(n) is not None}
        return {"fedavg-state-version": 1, "class": type(self).__name__,
                "dynamicfl-state-version": STATE_VERSION, "local-steps": self.local_steps,
                "rich-partitions": rich, "budgets": budgets,
                **self.participation.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned. The rich set and budgets are mapped back
        to node ids once the nodes have answered the client-info query (first round)."""
        if state.get("class") != type(self).__name__:
            raise ValueError(f"checkpoint holds the state of {state.get('class')!r}, "
                             f"not of {type(self).__name__}")
        if state.get("dynamicfl-state-version") != STATE_VERSION:
            raise ValueError(f"DynamicFL state version {state.get('dynamicfl-state-version')!r} "
                             f"is not {STATE_VERSION}; start the run afresh")
        steps = int(state["local-steps"])
        if steps < 0:
            raise ValueError(f"DynamicFL state has local-steps={steps}; it must be >= 0")
        self.local_steps = steps
        self.participation.load_state_dict(state)
        self.restored = state

    def apply_restored(self) -> None:
        """Map a loaded checkpoint's rich set and budgets (by partition id) to node ids."""
        state, self.restored = self.restored, None
        if not state:
            return
        by_pid = {info.partition_id: node for node, info in self.participation.clients.items()
                  if info.partition_id is not None}
        if state.get("rich-partitions") is not None:
            self.rich = {by_pid[p] for p in state["rich-partitions"] if p in by_pid}
        for p, budget in state.get("budgets", {}).items():
            if int(p) in by_pid:
                self.budgets.setdefault(by_pid[int(p)], float(budget))

    def summary(self) -> None:
        """Log the configuration."""
        log(INFO, "\t├──> DynamicFL: intervals %s | L %s | budget %s (beta %s) | n_ens %d | "
            "seed %d | client-info query %s", self.spec, self.local_steps or "Eq. 4",
            self.budget_mode, self.beta, self.n_ens, self.participation.seed,
            "on" if self.participation.query_client_info else "off")
        timer = self.participation.timer
        if timer is not None:
            log(INFO, "\t├──> Simulated clock: %s, per sync event; budgets %s",
                type(timer.clock.fleet).__name__,
                f"from bandwidth ({self.budget_seconds:g} s of transfer per round)"
                if self.budget_seconds > 0 else "as reported")
        super().summary()

    # ------------------------------------------------------------------ the round
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = DEFAULT_TIMEOUT, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              first_round: int = 1) -> Result:
        """DynamicFL's rounds (:meth:`train_round`) in the round loop of
        :func:`strategies.engine.rounds.run_rounds`; ``first_round`` > 1 resumes."""
        return rounds.run_rounds(self, grid, initial_arrays, num_rounds, timeout, train_config,
                                 evaluate_config, evaluate_fn, first_round)

    def start_run(self, num_rounds: int, timeout: float | None) -> None:
        """T = ``num_rounds`` for a cosine schedule without its own ``num_rounds``
        (:class:`strategies.engine.rounds.RunAware`)."""
        self.total_rounds = int(num_rounds)

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, loop: GridEventLoop, timeout: float | None
                    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Alg. 1 lines 12-20, the whole round: select M^t, group (Eq. 5), run the round's
        sync events on the Grid event loop (each waits ``timeout`` seconds for its replies);
        the round's model (None: kept) and metrics."""
        if not self.announced_client_sgd:
            self.announce_client_sgd(config)
        outcome = self.run_round(server_round, arrays, config, grid, timeout)
        return outcome.arrays, outcome.metrics

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Not a round of Flower's loop: a DynamicFL round is several exchanges."""
        raise RuntimeError("DynamicFL's round is a sequence of sync events, not one Flower "
                           "configure_train / aggregate_train exchange: run it with its own "
                           "start(grid, initial_arrays, ...)")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Not a round of Flower's loop (:meth:`configure_train`)."""
        return self.configure_train(server_round, ArrayRecord(), ConfigRecord(), None)

    def announce_client_sgd(self, config: ConfigRecord) -> None:
        """Say once in the ServerApp log which SGD settings a ClientApp that calls
        ``train_chunk`` without its own optimiser will use: the train config's, else the
        paper's (:data:`strategies.contract.DYNAMICFL_PAPER_SGD`)."""
        self.announced_client_sgd = True
        paper = {k: v for k, v in C.DYNAMICFL_PAPER_SGD.items() if k not in config}
        if paper:
            log(INFO, "DynamicFL: the train config has no %s: a ClientApp that calls "
                "train_chunk without its own optimiser trains with the paper's %s (Le et al.); "
                "send them in train_config to choose, or pass your optimiser to train_chunk",
                ", ".join(f"'{k}'" for k in paper),
                ", ".join(f"{k} {v:g}" for k, v in paper.items()))

    def round_log(self, server_round: int) -> dict[str, object]:
        """Round ``server_round``'s run-log items (empty before it ran)."""
        report = self.reports.get(server_round)
        return report.log_record() if report is not None else {}

    # ------------------------------------------------------------------ clients
    def update_clients(self, grid: Grid) -> list[int]:
        """Connected nodes, in partition order; new ones are queried (partition id, size,
        label counts, byte budget) when ``query_client_info`` is on."""
        clients = self.participation.clients
        known = {n for n, info in clients.items() if not info.unreached}
        nodes = self.participation.ordered(self.participation.connected(grid))
        self.budgets.update({n: clients[n].comm_budget for n in nodes
                             if n not in known and clients[n].comm_budget is not None})
        return records.usable_nodes(nodes, clients)  # grouping needs every node's facts

    def global_distribution(self, nodes: list[int]) -> np.ndarray:
        """p(Y) from ALL connected clients' label counts (paper Sec. 3.1)."""
        info = self.participation.info
        missing = [n for n in nodes if not info(n).label_counts]
        if missing:
            one = ds.IntervalSpec(self.spec.high, self.spec.high)
            raise ValueError(f"DynamicFL needs every client's '{C.LABEL_COUNTS}' in its "
                             f"'{C.QUERY_CLIENT_INFO}' query reply; {len(missing)} of {len(nodes)} "
                             f"node(s) sent none (e.g. node {missing[0]}). Pass label_counts to "
                             f"{records.QUERY_HELPER} in the ClientApp's @app.query(), or use "
                             f"intervals '{one}' (one group, no DynaComm)")
        return dc.global_label_distribution([info(n).label_counts for n in nodes])

    def steps_per_round(self, nodes: list[int], config: ConfigRecord) -> int:
        """L: as configured, else Eq. 4 over all clients' sizes."""
        if self.local_steps > 0:
            return self.local_steps
        sizes = [self.participation.info(n).num_examples for n in nodes]
        if any(not s for s in sizes):
            raise ValueError("local_steps = 0 asks for L by Eq. 4, which needs every client's "
                             "num-examples; set local_steps (the DynamicFL run config's L) instead")
        epochs = float(config.get(C.LOCAL_EPOCHS, 5))
        batch = int(config.get(C.BATCH_SIZE, 10))
        self.local_steps = ds.steps_per_round(sizes, epochs, batch if batch > 0 else max(sizes))
        log(INFO, "DynamicFL: L = %d local steps per round (Eq. 4, E = %g, B = %d)",
            self.local_steps, epochs, batch)
        return self.local_steps

    # ------------------------------------------------------------------ grouping
    def choose_group(self, server_round: int, active: list[int], nodes: list[int],
                     model_bytes: int) -> dc.Selection:
        """z among the active nodes (positions of ``active``), by the budget mode."""
        if self.spec.single:  # everybody syncs alike: the grouping changes nothing
            return dc.Selection(tuple(range(len(active))), math.nan)
        q = self.global_distribution(nodes)
        counts = [self.participation.info(n).label_counts for n in active]
        L = self.local_steps
        nu_high = ds.num_syncs(self.spec.high, L)
        nu_low = ds.num_syncs(self.spec.low, L) if self.spec.low is not None else 0
        if self.budget_mode == "fix" and self.rich is None:
            rich = dc.fix_beta_rich(len(nodes), self.beta, seed=[self.participation.seed, 0xF1])
            self.rich = {nodes[i] for i in rich}
        cons = dc.constraints(
            self.budget_mode, len(active), beta=self.beta,
            rich=[n in self.rich for n in active] if self.rich is not None else None,
            budgets=[self.budget_of(n) for n in active], server_budget=self.server_budget,
            nu_high=nu_high, nu_low=nu_low, model_bytes=model_bytes)
        all_low = dc.server_cost(0, len(active), nu_high, nu_low, model_bytes)
        if self.budget_mode == "budget" and self.server_budget is not None \
                and all_low > self.server_budget:
            log(WARNING, "Round %d: even the all-low schedule (%d bytes) exceeds the server "
                "budget (%s bytes)", server_round, all_low, self.server_budget)
        if cons.k_max is not None and cons.k_max < self.min_group_size \
                and not self.warned_empty_group:
            self.warned_empty_group = True
            log(WARNING, "DynamicFL, round %d: no client can join the high-frequency group "
                "(k_max = %d with |M^t| = %d active clients, budget mode '%s', beta %s, "
                "min_group_size %d): every client syncs at the low interval only, i.e. FedAvg "
                "with %d sync event(s) per round. Raise beta, sample more clients "
                "(fraction_train) or use intervals='a' to say so", server_round, cons.k_max,
                len(active), self.budget_mode, self.beta, self.min_group_size, max(nu_low, 1))
        return dc.dynacomm(counts, q, eligible=cons.eligible, k_max=cons.k_max, n_ens=self.n_ens,
                           rng=[self.participation.seed, server_round, 7],
                           min_size=self.min_group_size)

    def budget_of(self, node: int) -> float | None:
        """tau_m: from the device's bandwidth with ``budget_seconds``, else as reported."""
        if self.budget_seconds > 0:
            timer = self.participation.timer
            return byte_budget(timer.clock.profile(self.participation.partition_of(node)),
                               self.budget_seconds)
        return self.budgets.get(node)

    # ------------------------------------------------------------------ simulated clock
    def round_time(self, server_round: int, synced: list[list[tuple[int, int]]],
                   config: ConfigRecord, model_bytes: int) -> ClockTime:
        """sim-seconds of the round's sync events as they ran (:func:`strategies.engine.clock.
        sync_event_times`; each sync moves the model down and up) and sim-elapsed."""
        timer, partition_of = self.participation.timer, self.participation.partition_of
        batch = int(config.get(C.BATCH_SIZE, 0))
        events = [[(partition_of(n), k) for n, k in event] for event in synced]
        examples = {}
        for event in synced:
            for node, _ in event:
                n = self.participation.info(node).num_examples or batch
                examples[partition_of(node)] = min(batch, n) if batch > 0 else n
        times = timer.event_times(events, examples, model_bytes, model_bytes)
        wait = timer.wait
        seconds = timer.finish_round(times)
        log(INFO, "Simulated clock: round %d took %.4g s over %d sync event(s), %.4g s in all",
            server_round, seconds, len(synced), timer.elapsed)
        return ClockTime(seconds, timer.elapsed, wait if wait > 0 else None)

    # ------------------------------------------------------------------ the round
    def chunk_config(self, base: ConfigRecord, server_round: int, chunk: ds.Chunk,
                     lr: float) -> ConfigRecord:
        """The ConfigRecord of one chunk (``start-step``, ``num-steps``, ``round-steps``)."""
        config = ConfigRecord(dict(base))
        config[C.SERVER_ROUND] = server_round
        config[START_STEP] = chunk.start
        config[NUM_STEPS] = chunk.num_steps
        config[C.LOCAL_STEPS] = chunk.num_steps  # a plain local-steps client does the right amount
        config[ROUND_STEPS] = self.local_steps
        config[C.LR] = lr
        return config

    def run_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                  grid: Grid, timeout: float | None) -> RoundOutcome:
        """Select M^t, group (Eq. 5), run the round's chunk schedule (Alg. 1 lines 12-20)."""
        started = time.perf_counter()
        report = self.reports[server_round] = RoundReport(server_round)
        nodes = self.update_clients(grid)
        self.apply_restored()
        L = self.steps_per_round(nodes, config)
        online, m = self.participation.online_nodes(server_round, nodes)
        model_bytes = arrays.count_bytes()
        clocked = self.participation.timer is not None
        unavailable = len(nodes) - len(online) if clocked else None
        if not online:  # no device online (simulated clock)
            log(WARNING, "Round %d: no client is online; the global model is kept", server_round)
            report.add(ParticipationSection(sampled=0, unavailable=unavailable))
            report.add(Aggregation(model_kept=True))
            report.add(self.round_time(server_round, [], config, model_bytes))
            return RoundOutcome(server_round, None, None)
        picks = self.participation.selection.select(
            server_round, online, m, self.participation.fraction_train, None)
        active = [online[k] for k in sorted(picks)]
        selection = self.choose_group(server_round, active, nodes, model_bytes)
        z = [active[i] for i in selection.members]
        schedule = ds.assign_intervals(active, z, self.spec, L, x_star_mode=self.x_star_mode)
        self.schedules[server_round] = schedule
        lr = self.round_lr(server_round, float(config.get(C.LR, 0.01)))
        run = SyncEvents(self, grid, schedule, arrays, config, server_round, lr)
        new = run.run(timeout)
        flower_args.log_counts("aggregate_train", run.received, len(run.failed))
        cost = ds.round_cost(schedule, model_bytes)
        events = max(run.events, 1)
        report.add(ParticipationSection(sampled=len(active), bytes_down=run.bytes_down, lr=lr,
                                 unavailable=unavailable))
        report.add(Aggregation(received=run.received, failed=len(run.failed),
                               bytes_up=run.bytes_up, local_steps=L,
                               train_loss=run.train_loss(), model_kept=new is None))
        if run.drift is not None:
            report.add(run.drift)
        clock_time = (self.round_time(server_round, run.synced, config, model_bytes)
                      if clocked else None)
        report.add(DynamicFLSection(
            group_size=len(z) if not self.spec.single else len(active),
            kl=selection.kl if math.isfinite(selection.kl) else None,
            kappa_hat=cost.kappa_hat, syncs=cost.syncs, sync_events=run.events,
            seconds_per_event=(time.perf_counter() - started) / events,
            sim_seconds_per_event=(clock_time.seconds / max(len(run.synced), 1)
                                   if clock_time is not None else None)))
        if clock_time is not None:
            report.add(clock_time)
        log(INFO, "Round %d: |M^t| = %d, |z| = %d (KL %s), %d sync events, kappa-hat %.4f",
            server_round, len(active), len(z),
            f"{selection.kl:.4f}" if math.isfinite(selection.kl) else "-",
            run.events, cost.kappa_hat)
        if new is not None and not trust_gate.adoptable_model(to_numpy(new), server_round):
            new = None
            report.add(dataclasses.replace(report.get(Aggregation), model_kept=True))
        if new is None:
            log(WARNING, "Round %d: no usable reply at step L, the global model is kept",
                server_round)
            return RoundOutcome(server_round, None, None)
        loss = run.train_loss()
        clients = {C.TRAIN_LOSS: loss} if loss is not None else {}
        if self.custom_metrics[0] is not None and run.final_metrics:
            clients = flower_args.flower_metrics(self.custom_metrics[0], run.final_metrics)
        return RoundOutcome(server_round, new, MetricRecord({**report.metric_items(), **clients}))

    def round_lr(self, server_round: int, lr0: float) -> float:
        """lr_t of ``lr_schedule`` (a cosine one without T gets the run's number of rounds),
        else lr_0."""
        schedule = self.lr_schedule
        if schedule is None:
            return lr0
        if isinstance(schedule, schedules.LRSchedule) and schedule.name == "cosine" \
                and schedule.num_rounds is None:
            if self.total_rounds is None:
                raise ValueError("DynamicFL: a cosine lr_schedule without num_rounds anneals "
                                 "over the run's rounds, known once start() runs; pass "
                                 "LRSchedule('cosine', num_rounds=T) to use configure_train "
                                 "directly")
            schedule = dataclasses.replace(schedule, num_rounds=self.total_rounds)
        return schedules.round_lr(schedule, server_round, lr0)

    # ------------------------------------------------------------------ replies
    def accept_chunk_reply(self, reply: Message, arrays: ArrayRecord, chunk: ds.Chunk) -> bool:
        """A usable chunk reply: the trust gate's checks against the round's global model
        (no error, the real bytes of its arrays, num-examples within the size the client
        reported, ``local-steps`` within the chunk's steps, finite metrics and arrays); else
        one log line naming node and partition."""
        node = reply.metadata.src_node_id
        if reply.has_error():
            log(WARNING, "Node %d failed a chunk: %s", node, reply.error.reason)
            return False
        problem = trust_gate.train_reply_problem(
            reply, arrays, sent={C.LOCAL_STEPS: chunk.num_steps},
            reported_size=self.participation.info(chunk.client).num_examples)
        if problem is None:
            bad = agg.all_finite(to_numpy(reply.content[C.ARRAYS]))
            problem = None if bad is None else f"array '{bad}' has NaN or Inf"
        if problem:
            trust_gate.log_refused("Chunk reply", node,
                                   self.participation.info(chunk.client).partition_id,
                                   f"{problem}; dropped for the rest of the round")
            return False
        return True

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """Flower's weighted mean of the evaluate metrics over the replies the trust gate
        accepts (:func:`strategies.engine.trust_gate.aggregate_evaluate`)."""
        return trust_gate.aggregate_evaluate(replies, self.participation.clients,
                                             self.custom_metrics[1])

    def contract_gap(self, reply: Message) -> str | None:
        """What a chunk reply lacks of the chunk contract (``local-steps``), or None."""
        metrics = reply.content.metric_records.get(C.METRICS)
        if metrics is None or C.LOCAL_STEPS_TAKEN not in metrics:
            return f"the metric '{C.LOCAL_STEPS_TAKEN}' (the chunk's steps)"
        return None

    def weight_of(self, node: int, reply: Message) -> float:
        """|D_m|: the reply's num-examples, else the query's."""
        if C.METRICS in reply.content and C.NUM_EXAMPLES in reply.content[C.METRICS]:
            n = float(reply.content[C.METRICS][C.NUM_EXAMPLES])
            if n > 0:
                return n
        return float(self.participation.info(node).num_examples or 1)


@dataclasses.dataclass(frozen=True)
class RoundOutcome:
    """What a DynamicFL round produced: the new model (None: kept) and its metrics."""

    server_round: int
    arrays: ArrayRecord | None
    metrics: MetricRecord | None


class SyncEvents:
    """One round's chunk schedule on the Grid event loop (Alg. 1 lines 12-20): each chunk is
    pushed when it starts, its reply held until the chunk's end step, and exactly the
    clients that sync at an event are averaged (|D_m|-weighted, the one averaging kernel
    :class:`strategies.engine.averaging.WeightedModelSum`) and sent their next chunk."""

    def __init__(self, strategy: DynamicFL, grid: Grid, schedule: ds.SyncSchedule,
                 arrays: ArrayRecord, config: ConfigRecord, server_round: int,
                 lr: float) -> None:
        self.strategy, self.schedule, self.arrays = strategy, schedule, arrays
        self.config, self.server_round, self.lr = config, server_round, lr
        self.loop: GridEventLoop[ds.Chunk] = GridEventLoop(grid, strategy.poll_interval)
        self.held: dict[int, Message] = {}
        self.failed: set[int] = set()
        self.answered: set[int] = set()  # clients that replied without a client error
        self.gaps: dict[int, str] = {}  # ... but without what the contract needs
        self.bytes_up = self.bytes_down = self.events = self.received = 0
        self.synced: list[list[tuple[int, int]]] = []
        self.losses: list[tuple[float, float]] = []
        self.final_metrics: list[RecordDict] = []  # the metrics of the replies at step L
        self.drift: Drift | None = None

    def push(self, chunks: list[ds.Chunk], model: ArrayRecord) -> None:
        """Send each chunk with ``model``; a chunk the link refuses fails its client."""
        messages = [Message(RecordDict({C.ARRAYS: model, C.CONFIG: self.strategy.chunk_config(
                                self.config, self.server_round, c, self.lr)}),
                            message_type=MessageType.TRAIN, dst_node_id=c.client)
                    for c in chunks]
        refused = self.loop.push(messages, chunks)
        self.failed.update(c.client for c in refused)
        self.bytes_down += model.count_bytes() * (len(chunks) - len(refused))

    def on_reply(self, chunk: ds.Chunk, reply: Message) -> None:
        """Hold a usable reply until its chunk's end step; a bad one fails its client."""
        if not reply.has_error():
            self.answered.add(chunk.client)
        if not self.strategy.accept_chunk_reply(reply, self.arrays, chunk):
            self.failed.add(chunk.client)
            return
        gap = self.strategy.contract_gap(reply)
        if gap is not None:
            log(WARNING, "Node %d: chunk reply rejected: it lacks %s",
                reply.metadata.src_node_id, gap)
            self.gaps[chunk.client] = gap
            self.failed.add(chunk.client)
            return
        self.strategy.contract_evidence.conclusive([], met=True)
        self.held[chunk.client] = reply
        self.bytes_up += reply.content[C.ARRAYS].count_bytes()

    def evidence_conclusive(self) -> bool:
        """Every reply so far lacks the contract: enough clients (or events) to say the
        ClientApp lacks it (:class:`strategies.engine.records.ContractEvidence`)?"""
        participation = self.strategy.participation
        return self.strategy.contract_evidence.conclusive(
            [participation.client_key(c) for c in self.gaps], met=False)

    def collect(self, needed: set[int], timeout: float | None) -> None:
        """Until every client in ``needed`` has a held reply or has failed; those without a
        reply ``timeout`` seconds on fail for the rest of the round."""
        def missing() -> set[int]:
            return needed - self.held.keys() - self.failed

        lost = self.loop.run_until(lambda: not missing(), self.on_reply, timeout,
                                   waiting_for=lambda: [c for c in self.loop.pending_tags()
                                                        if c.client in missing()])
        if lost:
            log(WARNING, "Round %d: %d client(s) did not reply within %.0f s and are dropped "
                "for the rest of the round", self.server_round, len({c.client for c in lost}),
                timeout)
        self.failed.update(c.client for c in lost)
        self.failed.update(missing())  # nothing pending for them: nothing can arrive any more

    def run(self, timeout: float | None) -> ArrayRecord | None:
        """The round's events in order; the model at step L (None: no client reached it)."""
        plan = self.schedule
        self.push(plan.first_chunks(), self.arrays)
        final: ArrayRecord | None = None
        for event in plan.events:
            self.collect(set(event.clients), timeout)
            if self.gaps and self.answered == set(self.gaps) and self.evidence_conclusive():
                raise records.contract_error("DynamicFL", self.server_round, len(self.gaps),
                                             next(iter(self.gaps.values())), CHUNK_HELPER)
            members = [m for m in event.clients if m in self.held]
            if not members:
                continue
            self.events += 1
            self.synced.append([(m, plan.chunk_ending(m, event.step).num_steps)
                                for m in members])
            replies = [self.held.pop(m) for m in members]
            models = [to_numpy(r.content[C.ARRAYS]) for r in replies]
            weights = [self.strategy.weight_of(m, r) for m, r in zip(members, replies)]
            if event.step < plan.local_steps:
                average = to_record(agg.weighted_mean(models, weights))
                nxt = [plan.next_chunk(m, event.step) for m in members]
                self.push([c for c in nxt if c is not None], average)
                continue
            self.received = len(members)
            if self.strategy.drift_diagnostics:  # client round updates W_m^L - W_g^{t-1}
                drift = agg.UpdateDrift(to_numpy(self.arrays))
                for model in models:
                    drift.add(model)
                self.drift = drift.summary()
            self.final_metrics = [RecordDict({C.METRICS: r.content[C.METRICS]}) for r in replies]
            for r, w in zip(replies, weights):
                loss = r.content[C.METRICS].get(C.TRAIN_LOSS)
                if isinstance(loss, (int, float)):
                    self.losses.append((float(loss), w))
            if plan.frozen:  # 'x*' code mode: untrained start models enter the final average
                models += [to_numpy(self.arrays)] * len(plan.frozen)
                weights += [float(self.strategy.participation.info(m).num_examples or 1)
                            for m in plan.frozen]
            final = to_record(agg.weighted_mean(models, weights))
        return final

    def train_loss(self) -> float | None:
        """The |D_m|-weighted mean train loss of the replies at step L."""
        if not self.losses:
            return None
        return sum(l * w for l, w in self.losses) / sum(w for _, w in self.losses)


DYNAMICFL_WHY = ("every active client does exactly L local steps and each sync event sets W to "
                 "the num-examples-weighted average")
KEYS = (
    Key("dynamicfl-intervals", "a-g",
        "DynamicFL's `<high>-<low>` sync levels a–g = 1, 4, 16, 32, 64, 128, 256 steps (capped "
        "at L), `x` (everyone at x), `x*` (only the high group trains), or step counts "
        "(`\"4-300\"`) ([DynamicFL](strategies/dynamicfl.md))", check=ds.parse_interval_spec,
        note="'x-y' (high <= low), 'x' or 'x*', x and y in a-g or step counts >= 1",
        arg="intervals"),
    Key("dynamicfl-local-steps", 0, "L, local steps per round (0 = the paper's Eq. 4)",
        interval=at_least(0), arg="local_steps"),
    Key("dynamicfl-budget-mode", "dynamic",
        "`dynamic` (k_max = ⌊β·|active|⌋), `fix` (⌈β·M⌉ rich clients), `budget` (per-node "
        "`comm-budget` + server budget), `none`", choices=dc.BUDGET_MODES, arg="budget_mode"),
    Key("dynamicfl-beta", 0.3, "β of `dynamic` and `fix`", interval=UNIT, arg="beta"),
    Key("dynamicfl-server-budget", 0.0,
        "server bytes per round (Eq. 5) in `budget` mode (0 = none)", interval=at_least(0.0),
        arg="server_budget", convert=lambda value: value or None),
    Key("dynamicfl-budget-seconds", 0.0,
        "> 0: in `budget` mode each client's τ_m is the bytes its profile's bandwidth moves in "
        "this many seconds of transfer per round (needs `device-profiles`); 0 = the "
        "`comm-budget` nodes report", interval=at_least(0.0), arg="budget_seconds"),
    Key("dynamicfl-n-ens", 10, "DynaComm's random orderings", interval=at_least(1),
        arg="n_ens"),
    Key("dynamicfl-x-star-mode", "paper",
        "the `x*` ablation's low group: `paper` (dropped) or `code` (enters the final average "
        "unchanged)", choices=ds.X_STAR_MODES, arg="x_star_mode"),
)
DYNAMICFL_REGISTRATION = {
    "engine": "events", "keys": KEYS, "client_side": "strategies.client.dynamicfl",
    "only": (*((key, (value,), DYNAMICFL_WHY) for key, value in (
        ("weighting", "examples"), ("server-lr", 1.0), ("server-momentum", 0.0),
        ("straggler-fraction", 0.0), ("round-deadline", 0.0), ("over-commitment", 0.0))),
             ("selection", ("random",), "DynamicFL samples its active clients uniformly and "
              "DynaComm forms its groups from that sample (Le et al., Alg. 1)")),
    "rules": (Rule(("dynamicfl-budget-seconds", "dynamicfl-budget-mode", "device-profiles"),
                   lambda v: v["dynamicfl-budget-seconds"] == 0 or (
                       v["dynamicfl-budget-mode"] == "budget" and v["device-profiles"] != "none"),
                   "dynamicfl-budget-seconds > 0 sets byte budgets from the device bandwidths: "
                   "it needs dynamicfl-budget-mode='budget' and device-profiles other than "
                   "'none'"),)}
register("dynamicfl", DynamicFL, "DynamicFL (Le et al., Alg. 1): clients with the bandwidth sync "
         "often, the rest rarely (client helper)", **DYNAMICFL_REGISTRATION)
register("dynamicsgd", DynamicFL, "DynamicSGD (Le et al.): every active client syncs after every "
         "local step", fixed={"intervals": "a"}, **DYNAMICFL_REGISTRATION)

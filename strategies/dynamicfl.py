"""DynamicFL (Le et al.): DynaComm grouping and two-frequency synchronisation on the Grid.

The math lives in :mod:`strategies.dynacomm` (which clients sync often, Eq. 5) and
:mod:`strategies.dynamicfl_schedule` (when everybody syncs, Alg. 1 lines 12-20); this
module only moves records. A DynamicFL round is not one send-and-receive but a
sequence of sync events, so :meth:`DynamicFL.start` replaces Flower's round loop: each
chunk is pushed when it starts (``Grid.push_messages``), its reply is pulled
(``Grid.pull_messages``) and held until the chunk's end step, so long low-frequency
chunks run while short high-frequency ones come and go. Evaluation is Flower's FedAvg's.
"""

from __future__ import annotations

import dataclasses
import io
import math
import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import Result
from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info

from . import aggregate as agg
from . import contract as C
from . import dynacomm as dc
from . import dynamicfl_schedule as ds
from . import records, sampling, schedules, trust_gate
from .clock import SimClock, byte_budget
from .contract import COMM_BUDGET, NUM_STEPS, ROUND_STEPS, START_STEP  # noqa: F401 (chunk keys)
from .fedavg import clock_timer
from .records import ClientInfo, to_numpy, to_record

STATE_VERSION = 1  # of state_dict()
CHUNK_HELPER = "strategies.client.dynamicfl.train_chunk"


class DynamicFL(FlowerFedAvg):
    """DynamicFL / DynamicAvg / DynamicSGD (Le et al., Alg. 1).

    Subclass of Flower's FedAvg for its evaluation half (``configure_evaluate``,
    ``aggregate_evaluate``) and parameters; training is :meth:`start`'s chunk schedule,
    so ``configure_train`` / ``aggregate_train`` are not used.

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
        ``lr``, 0.01 without one); a ``"cosine"`` :class:`~strategies.schedules.LRSchedule`
        without ``num_rounds`` takes T from :meth:`start`. None: lr_0 every round.
    cosine_lr_min : float, optional
        Shorthand for ``lr_schedule=LRSchedule("cosine", lr_min=cosine_lr_min)``: cosine
        annealing from lr_0 to this over the run (the official code's schedule).
    clock : SimClock, optional
        Simulated time (:mod:`strategies.clock`), accounted per sync event
        (:func:`strategies.clock.sync_event_times`): each round logs ``sim-seconds``,
        ``sim-elapsed`` and ``sim-seconds-per-event``; offline devices are not sampled.
        Needs ``query_client_info=True`` (profiles are keyed by partition id).
    budget_seconds : float
        > 0: in ``budget_mode="budget"``, each client's tau_m is the bytes its bandwidth
        moves in this many seconds of transfer per round
        (:func:`strategies.clock.byte_budget`), instead of a reported ``comm-budget``;
        needs ``clock``. 0 (default): the reported budgets.
    poll_interval : float
        Seconds between ``pull_messages`` calls while waiting for a sync event.
    fraction_train : float
        C: |M^t| = max(floor(C K), 1) active clients per round (Flower's default, 1.0;
        the paper samples C = 0.1 of 100 clients).
    fraction_evaluate, min_available_nodes, seed, query_client_info, query_timeout, \
drift_diagnostics
        As :class:`strategies.FedAvg` (Flower's defaults: ``fraction_evaluate`` 1.0,
        ``min_available_nodes`` 2).

    Contract
    --------
    Every chunk reply carries ``arrays``, ``num-examples`` and ``local-steps`` (the
    chunk's steps, run from ``start-step`` on the client's own batch stream and
    optimiser state): ``strategies.client.dynamicfl.train_chunk`` does this. A stock
    ClientApp trains whole epochs and reports no ``local-steps``: the first sync event
    whose replies all lack it stops the run with a
    :class:`strategies.records.ClientContractError` naming that helper. DynaComm's
    grouping (intervals ``"x-y"`` or ``"x*"``), L by Eq. 4 and byte budgets need the
    client-info query (``query_client_info=True`` and
    ``strategies.client.info.client_info_reply`` in the ClientApp's ``@app.query()``);
    without it such a configuration is a ValueError.
    """

    def __init__(
        self,
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
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        seed: int = 0,
        min_available_nodes: int = 2,
        query_client_info: bool = False,
        query_timeout: float = 600.0,
        drift_diagnostics: bool = False,
        clock: SimClock | None = None,
        budget_seconds: float = 0.0,
    ) -> None:
        for name, value, zero_ok in (("fraction_train", fraction_train, False),
                                     ("fraction_evaluate", fraction_evaluate, True)):
            if not ((value >= 0 if zero_ok else value > 0) and value <= 1):
                raise ValueError(f"{name} must be in {'[0, 1]' if zero_ok else '(0, 1]'}, "
                                 f"got {value}")
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
                         min_train_nodes=1, min_evaluate_nodes=1,
                         min_available_nodes=min_available_nodes)
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
        self.timer = clock_timer(type(self).__name__, clock, seed, None, query_client_info)
        if not (isinstance(budget_seconds, (int, float)) and math.isfinite(budget_seconds)
                and budget_seconds >= 0):
            raise ValueError(f"budget_seconds must be a finite number >= 0 (0 = the reported "
                             f"comm-budget), got {budget_seconds!r}")
        if budget_seconds > 0 and (clock is None or budget_mode != "budget"):
            raise ValueError(f"budget_seconds={budget_seconds} sets byte budgets from the "
                             f"device bandwidths: it needs budget_mode='budget' (got "
                             f"{budget_mode!r}) and a clock (got {clock!r})")
        self.budget_seconds = float(budget_seconds)
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
        self.seed = int(seed)
        self.query_client_info = bool(query_client_info)
        self.query_timeout = float(query_timeout)
        self.drift_diagnostics = bool(drift_diagnostics)
        self.clients: dict[int, ClientInfo] = {}
        self.all_nodes: list[int] = []
        self.current_arrays: ArrayRecord | None = None
        self.diagnostics: dict[int, dict] = {}
        self.budgets: dict[int, float] = {}
        self.rich: set[int] | None = None  # Fix-beta, drawn once over the partition order
        self.plans: dict[int, ds.RoundPlan] = {}
        self._restored: dict | None = None
        self._warned_query = False

    def state_dict(self) -> dict:
        """Cross-round state for a checkpoint: L, the Fix-beta rich set (partition ids), the
        reported byte budgets (by partition id). Plain Python, JSON-able.

        Keyed by partition id, not node id, because node ids change between runs."""
        def pid(node: int) -> int | None:
            return self.clients.get(node, ClientInfo()).partition_id
        rich = (None if self.rich is None else
                sorted(p for p in (pid(n) for n in self.rich) if p is not None))
        budgets = {str(pid(n)): b for n, b in self.budgets.items() if pid(n) is not None}
        clock = {} if self.timer is None else {"sim-elapsed": self.timer.elapsed}
        return {"fedavg-state-version": 1, "class": type(self).__name__,
                "dynamicfl-state-version": STATE_VERSION, "local-steps": self.local_steps,
                "rich-partitions": rich, "budgets": budgets, **clock}

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
        if self.timer is not None:
            self.timer.elapsed = float(state.get("sim-elapsed", 0.0))
        self._restored = state

    def _apply_restored(self) -> None:
        state = self._restored
        if not state:
            return
        by_pid = {info.partition_id: node for node, info in self.clients.items()
                  if info.partition_id is not None}
        if state.get("rich-partitions") is not None:
            self.rich = {by_pid[p] for p in state["rich-partitions"] if p in by_pid}
        for p, budget in state.get("budgets", {}).items():
            if int(p) in by_pid:
                self.budgets.setdefault(by_pid[int(p)], float(budget))
        self._restored = None

    def summary(self) -> None:
        """Log the configuration."""
        log(INFO, "\t├──> DynamicFL: intervals %s | L %s | budget %s (beta %s) | n_ens %d | "
            "seed %d | client-info query %s", self.spec, self.local_steps or "Eq. 4",
            self.budget_mode, self.beta, self.n_ens, self.seed,
            "on" if self.query_client_info else "off")
        if self.timer is not None:
            log(INFO, "\t├──> Simulated clock: %s, per sync event; budgets %s",
                type(self.timer.clock.fleet).__name__,
                f"from bandwidth ({self.budget_seconds:g} s of transfer per round)"
                if self.budget_seconds > 0 else "as reported")
        super().summary()

    # ------------------------------------------------------------------ not used
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Not used: a DynamicFL round is a chunk schedule, run by :meth:`start`."""
        raise NotImplementedError("DynamicFL trains through start() (chunked rounds)")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Not used: a DynamicFL round is a chunk schedule, run by :meth:`start`."""
        raise NotImplementedError("DynamicFL trains through start() (chunked rounds)")

    # ------------------------------------------------------------------ clients
    def update_clients(self, grid: Grid) -> list[int]:
        """Connected nodes; new ones are queried (partition id, size, label counts, byte
        budget) when ``query_client_info`` is on."""
        known = {n for n, info in self.clients.items() if not info.unreached}
        nodes, self._warned_query = records.update_clients(
            grid, self.clients, min_nodes=self.min_available_nodes, query=self.query_client_info,
            timeout=self.query_timeout, owner=type(self).__name__, warned=self._warned_query)
        self.budgets.update({n: self.clients[n].comm_budget for n in nodes
                             if n not in known and self.clients[n].comm_budget is not None})
        return records.usable_nodes(nodes, self.clients)  # grouping needs every node's facts

    def ordered_nodes(self, node_ids: list[int]) -> list[int]:
        """Nodes sorted by reported partition id; nodes without one after, by node id."""
        return records.partition_order(node_ids, self.clients)

    def global_distribution(self, nodes: list[int]) -> np.ndarray:
        """p(Y) from ALL connected clients' label counts (paper Sec. 3.1)."""
        missing = [n for n in nodes if not self.clients.get(n, ClientInfo()).label_counts]
        if missing:
            one = ds.IntervalSpec(self.spec.high, self.spec.high)
            raise ValueError(f"DynamicFL needs every client's '{C.LABEL_COUNTS}' in its "
                             f"'{C.QUERY_CLIENT_INFO}' query reply; {len(missing)} of {len(nodes)} "
                             f"node(s) sent none (e.g. node {missing[0]}). Pass label_counts to "
                             f"{records.QUERY_HELPER} in the ClientApp's @app.query(), or use "
                             f"intervals '{one}' (one group, no DynaComm)")
        return dc.global_label_distribution([self.clients[n].label_counts for n in nodes])

    def steps_per_round(self, nodes: list[int], config: ConfigRecord) -> int:
        """L: as configured, else Eq. 4 over all clients' sizes."""
        if self.local_steps > 0:
            return self.local_steps
        sizes = [self.clients.get(n, ClientInfo()).num_examples for n in nodes]
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
        counts = [self.clients[n].label_counts for n in active]
        L = self.local_steps
        nu_high = ds.num_syncs(self.spec.high, L)
        nu_low = ds.num_syncs(self.spec.low, L) if self.spec.low is not None else 0
        if self.budget_mode == "fix" and self.rich is None:
            ordered = self.ordered_nodes(nodes)
            rich = dc.fix_beta_rich(len(ordered), self.beta, seed=[self.seed, 0xF1])
            self.rich = {ordered[i] for i in rich}
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
        return dc.dynacomm(counts, q, eligible=cons.eligible, k_max=cons.k_max, n_ens=self.n_ens,
                           rng=[self.seed, server_round, 7], min_size=self.min_group_size)

    def budget_of(self, node: int) -> float | None:
        """tau_m: from the device's bandwidth with ``budget_seconds``, else as reported."""
        if self.budget_seconds > 0:
            return byte_budget(self.timer.clock.profile(self.partition_of(node)),
                               self.budget_seconds)
        return self.budgets.get(node)

    # ------------------------------------------------------------------ simulated clock
    def partition_of(self, node: int) -> int:
        """The node's partition id (the clock's profiles are keyed by it)."""
        return records.clock_partition_id("DynamicFL", self.clients, node)

    def online_nodes(self, server_round: int, ordered: list[int]) -> tuple[list[int], int | None]:
        """As :meth:`strategies.FedAvg.online_nodes`: the sampleable nodes and m."""
        if self.timer is None:
            return ordered, None
        return self.timer.online_nodes(server_round, ordered,
                                       [self.partition_of(n) for n in ordered], self.fraction_train)

    def record_round_time(self, server_round: int, synced: list[list[tuple[int, int]]],
                          config: ConfigRecord, model_bytes: int) -> None:
        """sim-seconds of the round's sync events as they ran (:func:`strategies.clock.
        sync_event_times`; each sync moves the model down and up), sim-elapsed and
        sim-seconds-per-event."""
        batch = int(config.get(C.BATCH_SIZE, 0))
        events = [[(self.partition_of(n), k) for n, k in event] for event in synced]
        examples = {}
        for event in synced:
            for node, _ in event:
                n = self.clients.get(node, ClientInfo()).num_examples or batch
                examples[self.partition_of(node)] = min(batch, n) if batch > 0 else n
        times = self.timer.event_times(events, examples, model_bytes, model_bytes)
        wait = self.timer.wait
        seconds = self.timer.finish_round(times)
        diag = self.diagnostics.setdefault(server_round, {})
        diag[C.LOG_SIM_SECONDS] = seconds
        diag[C.LOG_SIM_ELAPSED] = self.timer.elapsed
        diag[C.LOG_SIM_SECONDS_PER_EVENT] = seconds / max(len(synced), 1)
        if wait > 0:
            diag[C.LOG_SIM_WAIT_SECONDS] = wait
        log(INFO, "Simulated clock: round %d took %.4g s over %d sync event(s), %.4g s in all",
            server_round, seconds, len(synced), self.timer.elapsed)

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

    def train_round(
        self, server_round: int, num_rounds: int, arrays: ArrayRecord, config: ConfigRecord,
        grid: Grid,
        timeout: float | None,
    ) -> ArrayRecord | None:
        """Sample, group (Eq. 5), run the round's chunk schedule (Alg. 1 lines 12-20); the new
        global model (None: unchanged)."""
        started = time.perf_counter()
        nodes = self.update_clients(grid)
        self._apply_restored()
        self.all_nodes = nodes
        L = self.steps_per_round(nodes, config)
        ordered, m = self.online_nodes(server_round, self.ordered_nodes(nodes))
        model_bytes = arrays.count_bytes()
        if not ordered:  # no device online (simulated clock)
            log(WARNING, "Round %d: no client is online; the global model is kept", server_round)
            self.diagnostics[server_round] = {C.LOG_CLIENTS_SAMPLED: 0,
                                              C.LOG_CLIENTS_UNAVAILABLE: len(nodes)}
            self.record_round_time(server_round, [], config, model_bytes)
            return None
        picks = sampling.sample_round(self.seed, server_round, len(ordered), self.fraction_train,
                                      num_sampled=m)
        active = [ordered[k] for k in sorted(picks)]
        selection = self.choose_group(server_round, active, nodes, model_bytes)
        z = [active[i] for i in selection.members]
        plan = ds.assign_intervals(active, z, self.spec, L, x_star_mode=self.x_star_mode)
        self.plans[server_round] = plan
        lr = self.round_lr(server_round, num_rounds, float(config.get(C.LR, 0.01)))
        new, stats = self.run_plan_on_grid(grid, plan, arrays, config, server_round, lr, timeout)
        cost = ds.round_cost(plan, model_bytes)
        events = max(stats["events"], 1)
        self.diagnostics[server_round] = {
            C.LOG_CLIENTS_SAMPLED: len(active),
            C.LOG_CLIENTS_FAILED: len(stats["failed"]),
            C.LOG_DYNAMICFL_GROUP_SIZE: len(z) if not self.spec.single else len(active),
            C.LOG_DYNAMICFL_KL: selection.kl if math.isfinite(selection.kl) else None,
            C.LOG_KAPPA_HAT: cost.kappa_hat,
            C.LOG_SYNCS: cost.syncs,
            C.LOG_BYTES_UP: stats[C.LOG_BYTES_UP],
            C.LOG_BYTES_DOWN: stats[C.LOG_BYTES_DOWN],
            C.LOG_SYNC_EVENTS: stats["events"],
            C.LOG_SECONDS_PER_EVENT: (time.perf_counter() - started) / events,
            C.LOG_LOCAL_STEPS: L,
            C.LOG_LR: lr,
        }
        if stats[C.LOG_TRAIN_LOSS] is not None:
            self.diagnostics[server_round][C.LOG_TRAIN_LOSS] = stats[C.LOG_TRAIN_LOSS]
        self.diagnostics[server_round].update(stats.get("drift", {}))
        if self.timer is not None:
            self.diagnostics[server_round][C.LOG_CLIENTS_UNAVAILABLE] = len(nodes) - len(ordered)
            self.record_round_time(server_round, stats["synced"], config, model_bytes)
        log(INFO, "Round %d: |M^t| = %d, |z| = %d (KL %s), %d sync events, kappa-hat %.4f",
            server_round, len(active), len(z),
            f"{selection.kl:.4f}" if math.isfinite(selection.kl) else "-",
            stats["events"], cost.kappa_hat)
        return new

    def round_lr(self, server_round: int, num_rounds: int, lr0: float) -> float:
        """lr_t of ``lr_schedule`` (a cosine one without T gets ``num_rounds``), else lr_0."""
        schedule = self.lr_schedule
        if schedule is None:
            return lr0
        if isinstance(schedule, schedules.LRSchedule) and schedule.num_rounds is None:
            schedule = dataclasses.replace(schedule, num_rounds=num_rounds)
        return schedules.round_lr(schedule, server_round, lr0)

    def run_plan_on_grid(
        self, grid: Grid, plan: ds.RoundPlan, arrays: ArrayRecord, config: ConfigRecord,
        server_round: int, lr: float, timeout: float | None,
    ) -> tuple[ArrayRecord | None, dict]:
        """Push each chunk when it starts, pull and hold its reply until its end step, and
        average exactly the clients that sync at each event (|D_m|-weighted)."""
        pending: dict[str, ds.Chunk] = {}
        held: dict[int, Message] = {}
        failed: set[int] = set()
        stats = {C.LOG_BYTES_UP: 0, C.LOG_BYTES_DOWN: 0, "events": 0, "failed": failed,
                 C.LOG_TRAIN_LOSS: None, "synced": []}
        answered: set[int] = set()  # clients that replied without a client error
        gaps: dict[int, str] = {}  # ... but without what the contract needs

        def push(chunks: list[ds.Chunk], model: ArrayRecord) -> None:
            if not chunks:
                return
            messages = [
                Message(RecordDict({C.ARRAYS: model,
                                    C.CONFIG: self.chunk_config(config, server_round, c, lr)}),
                        message_type=MessageType.TRAIN, dst_node_id=c.client)
                for c in chunks]
            ids = list(grid.push_messages(messages))
            for message_id, chunk in zip(ids, chunks):
                pending[message_id] = chunk
            for chunk in chunks[len(ids):]:  # the link refused some: they fail
                failed.add(chunk.client)
            stats[C.LOG_BYTES_DOWN] += model.count_bytes() * len(ids)

        def collect(needed: set[int]) -> None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while needed - held.keys() - failed:
                replies = list(grid.pull_messages(list(pending))) if pending else []
                for reply in replies:
                    chunk = pending.pop(reply.metadata.reply_to_message_id, None)
                    if chunk is None:
                        continue
                    if not reply.has_error():
                        answered.add(chunk.client)
                    if not self.accept_chunk_reply(reply, chunk.client, chunk.num_steps):
                        failed.add(chunk.client)
                        continue
                    gap = self.contract_gap(reply)
                    if gap is not None:
                        log(WARNING, "Node %d: chunk reply rejected: it lacks %s",
                            reply.metadata.src_node_id, gap)
                        gaps[chunk.client] = gap
                        failed.add(chunk.client)
                        continue
                    held[chunk.client] = reply
                    stats[C.LOG_BYTES_UP] += reply.content[C.ARRAYS].count_bytes()
                if not pending and needed - held.keys() - failed:  # nothing can arrive any more
                    failed.update(needed - held.keys())
                if deadline is not None and time.monotonic() > deadline:
                    late = needed - held.keys() - failed
                    if late:
                        log(WARNING, "Round %d: %d client(s) did not reply within %.0f s and "
                            "are dropped for the rest of the round", server_round, len(late),
                            timeout)
                    failed.update(late)
                    for message_id in [i for i, c in pending.items() if c.client in late]:
                        del pending[message_id]
                if not replies and needed - held.keys() - failed:
                    time.sleep(self.poll_interval)

        push(plan.first_chunks(), arrays)
        final: ArrayRecord | None = None
        last_losses: list[tuple[float, float]] = []
        for event in plan.events:
            collect(set(event.clients))
            if gaps and answered == set(gaps):  # every reply so far lacks the contract's keys
                raise records.contract_error(type(self).__name__, server_round, len(gaps),
                                             next(iter(gaps.values())), CHUNK_HELPER)
            members = [m for m in event.clients if m in held]
            if not members:
                continue
            stats["events"] += 1
            stats["synced"].append([(m, plan.chunk_ending(m, event.step).num_steps)
                                    for m in members])
            replies = [held.pop(m) for m in members]
            models = [to_numpy(r.content[C.ARRAYS]) for r in replies]
            weights = [self.weight_of(m, r) for m, r in zip(members, replies)]
            if event.step == plan.local_steps:
                if self.drift_diagnostics and models:  # client round updates W_m^L - W_g^{t-1}
                    drift = agg.UpdateDrift(to_numpy(arrays))
                    for model in models:
                        drift.add(model)
                    stats["drift"] = drift.summary()
                for r, w in zip(replies, weights):
                    metrics = r.content[C.METRICS] if C.METRICS in r.content else {}
                    loss = metrics.get(C.TRAIN_LOSS)
                    if isinstance(loss, (int, float)):
                        last_losses.append((float(loss), w))
                if plan.frozen:  # 'x*' code mode: untrained start models enter the final average
                    start = to_numpy(arrays)
                    models += [start] * len(plan.frozen)
                    weights += [float(self.clients.get(m, ClientInfo()).num_examples or 1)
                                for m in plan.frozen]
                final = to_record(ds.weighted_average(models, weights))
                continue
            average = to_record(ds.weighted_average(models, weights))
            nxt = [plan.next_chunk(m, event.step) for m in members]
            push([c for c in nxt if c is not None], average)
        if last_losses:
            stats[C.LOG_TRAIN_LOSS] = (sum(l * w for l, w in last_losses)
                                       / sum(w for _, w in last_losses))
        return final, stats

    def accept_chunk_reply(self, reply: Message, node: int, num_steps: int | None = None
                           ) -> bool:
        """A usable chunk reply: the trust gate's checks (no error, the real bytes of the
        model's arrays, num-examples within the size the client reported, ``local-steps``
        within the chunk's ``num_steps``, finite metrics and arrays)."""
        if reply.has_error():
            log(WARNING, "Node %d failed a chunk: %s", reply.metadata.src_node_id,
                reply.error.reason)
            return False
        if C.ARRAYS not in reply.content:
            log(WARNING, "Node %d replied without '%s'", reply.metadata.src_node_id, C.ARRAYS)
            return False
        problem = None
        if self.current_arrays is not None:
            problem = records.reply_problem(
                reply, self.current_arrays,
                sent=None if num_steps is None else {C.LOCAL_STEPS: num_steps},
                reported_size=self.clients.get(node, ClientInfo()).num_examples)
        if problem:
            trust_gate.log_refused("Chunk reply", reply.metadata.src_node_id,
                                   trust_gate.partition_of(self.clients, node),
                                   f"{problem}; dropped for the rest of the round")
            return False
        bad = agg.all_finite(to_numpy(reply.content[C.ARRAYS]))
        if bad is not None:
            log(WARNING, "Node %d: array '%s' has NaN or Inf; dropped for the rest of the round",
                reply.metadata.src_node_id, bad)
            return False
        return True

    def contract_gap(self, reply: Message) -> str | None:
        """What a chunk reply lacks of the chunk contract (``local-steps``), or None."""
        metrics = reply.content.metric_records.get(C.METRICS)
        if metrics is None or C.LOCAL_STEPS_TAKEN not in metrics:
            return f"the metric '{C.LOCAL_STEPS_TAKEN}' (the chunk's steps)"
        return None

    def reply_problem(self, reply: Message) -> str | None:
        """What is wrong with a reply, or None (:func:`strategies.records.reply_problem`)."""
        return records.reply_problem(reply, self.current_arrays)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """Flower's weighted mean of the evaluate metrics over the replies the trust gate
        accepts (:func:`strategies.trust_gate.aggregate_evaluate`)."""
        return trust_gate.aggregate_evaluate(replies, self.clients)

    def weight_of(self, node: int, reply: Message) -> float:
        """|D_m|: the reply's num-examples, else the query's."""
        if C.METRICS in reply.content and C.NUM_EXAMPLES in reply.content[C.METRICS]:
            n = float(reply.content[C.METRICS][C.NUM_EXAMPLES])
            if n > 0:
                return n
        return float(self.clients.get(node, ClientInfo()).num_examples or 1)


    # ------------------------------------------------------------------ the run
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        first_round: int = 1,
    ) -> Result:
        """Flower's round loop (``Strategy.start``) with the training step replaced by the
        DynamicFL schedule; logs as Flower's does (server-side evaluation per round, the
        final Result).

        ``first_round`` > 1 resumes a checkpoint (fedapp/checkpoint.py): ``initial_arrays``
        is the model after round ``first_round - 1``, which is not evaluated again.
        """
        log(INFO, "Starting %s strategy:", self.__class__.__name__)
        log_strategy_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
        self.summary()
        log(INFO, "")
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = Result()
        t_start = time.time()
        if evaluate_fn and first_round <= 1:
            res = evaluate_fn(0, initial_arrays)
            log(INFO, "Initial global evaluation results: %s", res)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        arrays = initial_arrays
        result.arrays = arrays
        for current_round in range(max(first_round, 1), num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", current_round, num_rounds)
            self.current_arrays = arrays  # what chunk replies are checked against
            new = self.train_round(current_round, num_rounds, arrays, train_config, grid, timeout)
            if new is not None and not trust_gate.adoptable_model(to_numpy(new), current_round):
                new = None
            self.diagnostics.setdefault(current_round, {})[C.LOG_MODEL_KEPT] = new is None
            if new is not None:
                arrays = result.arrays = new
            else:
                log(WARNING, "Round %d: no usable reply at step L, the global model is kept",
                    current_round)
            diag = self.diagnostics.get(current_round, {})
            if C.LOG_TRAIN_LOSS in diag:
                train_metrics = MetricRecord({C.TRAIN_LOSS: diag[C.LOG_TRAIN_LOSS]})
                log(INFO, "\t└──> Aggregated MetricRecord: %s", train_metrics)
                result.train_metrics_clientapp[current_round] = train_metrics
            replies = grid.send_and_receive(
                self.configure_evaluate(current_round, arrays, evaluate_config, grid),
                timeout=timeout)
            agg_eval = self.aggregate_evaluate(current_round, replies)
            if agg_eval is not None:
                log(INFO, "\t└──> Aggregated MetricRecord: %s", agg_eval)
                result.evaluate_metrics_clientapp[current_round] = agg_eval
            if evaluate_fn:
                log(INFO, "Global evaluation")
                res = evaluate_fn(current_round, arrays)
                log(INFO, "\t└──> MetricRecord: %s", res)
                if res is not None:
                    result.evaluate_metrics_serverapp[current_round] = res
        log(INFO, "")
        log(INFO, "Strategy execution finished in %.2fs", time.time() - t_start)
        log(INFO, "")
        log(INFO, "Final results:")
        log(INFO, "")
        for line in io.StringIO(str(result)):
            log(INFO, "\t%s", line.strip("\n"))
        log(INFO, "")
        return result

"""FedAvg (McMahan et al. 2017, Algorithm 1) with the weightings of McMahan et al. and Li et al.

Algorithm 1, as the two hooks of Flower's message-API strategy:

* ``configure_train`` (round t): m = max(floor(C K), 1); S_t = a random set of m clients
  (:mod:`strategies.sampling`); send w_t to each k in S_t.
* ``aggregate_train``: w_{t+1} = w_t + eta_g sum_{k in S_t} c_k (w_k - w_t), c_k of the
  weighting (:mod:`strategies.aggregate`; eta_g = 1 with c_k = n_k / m_t is Algorithm 1).

Around that, what a heterogeneity study needs: reproducible sampling keyed by the
``partition-id`` each client reports through the optional client-info query (Flower's
node ids are random per run), simulated stragglers (Li et al. 2020, FedProx, Sec. 5.2),
one bad reply rejected with one log line instead of ending the run, a per-round learning
rate (:mod:`strategies.schedules`), and per-round diagnostics in
``self.diagnostics[server_round]`` (keys ``strategies.contract.LOG_*``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from . import aggregate as agg
from . import contract as C
from . import records
from . import sampling
from . import schedules
from . import trust_gate
from .clock import RoundTimer, SimClock
from .records import ClientInfo

__all__ = ["FedAvg", "WEIGHTINGS", "STRAGGLER_POLICIES", "STRAGGLER_UNITS"]

WEIGHTINGS = ("examples", "uniform", "pre-erratum", "scheme-i", "scheme-ii")
QUERY_WEIGHTINGS = ("pre-erratum", "scheme-i", "scheme-ii")  # need every client's n_k
STRAGGLER_POLICIES = ("drop", "partial")
STRAGGLER_UNITS = ("steps", "epochs")


class FedAvg(FlowerFedAvg):
    """Federated Averaging (McMahan et al. 2017, Algorithm 1) with heterogeneity options.

    Parameters
    ----------
    fraction_train : float
        C, the fraction of connected clients sampled per round; m = max(floor(C K), 1).
    fraction_evaluate : float
        Fraction of clients asked to evaluate the global model (0 disables; Flower's
        default, 1.0).
    weighting : str
        ``"examples"``: c_k = n_k / m_t over the aggregated clients (Algorithm 1, erratum;
        default). ``"uniform"``: 1 / |S_t|. ``"pre-erratum"``: n_k / n over all clients,
        the unsampled ones keeping w_t. ``"scheme-i"``: K draws with replacement with
        probability p_k = n_k / n, plain mean. ``"scheme-ii"``: K of N uniformly,
        c_k = p_k N / K (both Li et al. 2020). The last three need every client's n_k,
        hence ``query_client_info=True``.
    server_lr : float
        eta_g in w <- w + eta_g sum_k c_k (w_k - w); 1.0 is plain averaging.
    seed : int
        Seeds sampling: round r samples with ``default_rng([seed, r])``.
    min_available_nodes : int
        Wait until this many nodes are connected before sampling (Flower's default, 2).
    query_client_info : bool
        Ask every new node for its partition id, dataset size and label histogram before
        sampling (a ``query`` message). Off by default: a stock ClientApp has no query
        handler, and Flower logs an ERROR traceback for every unanswered query. Without
        it, sampling follows node-id order (not reproducible across runs; one WARNING
        says so). To turn it on, register ``strategies.client.info.client_info_reply`` in
        the ClientApp's ``@app.query()``.
    query_timeout : float
        Seconds to wait for the client-info query replies.
    straggler_fraction : float
        Simulated system heterogeneity (Li et al. 2020, FedProx, Sec. 5.2): each round
        floor(f m) of the m sampled clients, drawn with ``default_rng([seed, round, 1])``,
        can only do part of the local work: uniform in 1..tau_i steps, tau_i =
        ``local-steps`` or floor(E n_i / B) (:func:`strategies.sampling.steps_for_epochs`).
    straggler_policy : str
        ``"drop"`` (FedAvg in the FedProx paper: stragglers are not waited for, so they
        are not sent any work) or ``"partial"`` (FedProx: partial updates aggregated).
    straggler_unit : str
        ``"steps"``: a straggler does 1..tau_i steps; ``"epochs"``: 1..E whole epochs (the
        FedProx paper's x ~ U[1, E]; with ``local-steps`` set it falls back to steps).
    drift_diagnostics : bool
        Log client drift per round: per layer the mean pairwise cosine similarity of the
        client updates (Hsieh et al., IID->non-IID study, Fig. 13) and the spread of their
        norms. Costs one more model-sized buffer and one more pass over each reply.
    lr_schedule : LRSchedule, str or callable, optional
        Per-round learning rate: round t sends ``lr`` = lr_t = ``lr_schedule(t, lr_0)``,
        lr_0 the train config's ``lr`` (:mod:`strategies.schedules`: ``"exponential"`` is
        McMahan et al.'s decay, ``"inverse"`` Li et al.'s eta_t = beta / (t + gamma)). A
        name takes the default parameters; ``"cosine"`` needs
        ``LRSchedule("cosine", num_rounds=T)``. None (default): ``lr`` is sent as given.
    clock : SimClock, optional
        Simulated time on a heterogeneous fleet (:mod:`strategies.clock`): each round logs
        ``sim-seconds`` (eq. 1 of :mod:`strategies.clock`: the slowest client's download,
        local steps and upload; the deadline when a client was dropped) and ``sim-elapsed``;
        devices that are offline (:mod:`strategies.devices` availability) are not sampled:
        m = max(floor(C K), 1) of the K connected clients are drawn among the online ones.
        Profiles are keyed by partition id, so it needs ``query_client_info=True``.
    round_deadline : float, optional
        D, simulated seconds per round (needs ``clock``): a sampled client whose local work
        does not fit by D is a straggler that can do only the steps that fit
        (:func:`strategies.clock.steps_within`); ``straggler_policy`` ``"drop"`` does not
        send it work (FedAvg), ``"partial"`` sends it those steps (FedProx, FedNova,
        FedVeca); a client that fits no step is never sent work. The realistic alternative
        to ``straggler_fraction`` (not both).

    Notes
    -----
    Difference from Flower's FedAvg: ``min_train_nodes`` is 1, since m = max(floor(C K), 1)
    is Algorithm 1's rule (Flower's default is 2); :meth:`summary` logs it. The other
    shared parameters have Flower's defaults.

    Contract
    --------
    Sends ``config`` with ``server-round`` plus the ``train_config`` given to ``start``
    (with ``lr`` = lr_t under ``lr_schedule``; the round's ``lr`` is logged as ``lr``).
    Expects per reply an ArrayRecord ``arrays`` with the global model's keys, shapes and
    dtypes and a MetricRecord ``metrics`` with ``num-examples`` > 0 (``train-loss`` or
    Flower's ``train_loss`` optional): what Flower's PyTorch template sends.
    """

    CLIENT_HELPER: str | None = None
    """``strategies.client`` helper a ClientApp calls to honour the contract (subclasses)."""
    MIN_PARTIAL_STEPS: int = 1
    """Fewest local steps a deadline straggler is sent; fewer fit: it gets no work."""

    def __init__(
        self,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        weighting: str = "examples",
        server_lr: float = 1.0,
        seed: int = 0,
        min_available_nodes: int = 2,
        query_client_info: bool = False,
        query_timeout: float = 600.0,
        straggler_fraction: float = 0.0,
        straggler_policy: str = "drop",
        straggler_unit: str = "steps",
        drift_diagnostics: bool = False,
        lr_schedule: schedules.LRSchedule | schedules.Schedule | str | None = None,
        clock: SimClock | None = None,
        round_deadline: float | None = None,
    ) -> None:
        _check_fraction("fraction_train", fraction_train, allow_zero=False)
        _check_fraction("fraction_evaluate", fraction_evaluate, allow_zero=True)
        _check_choice("weighting", weighting, WEIGHTINGS)
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        _check_whole("seed", seed, minimum=0)
        _check_whole("min_available_nodes", min_available_nodes, minimum=1)
        if not (isinstance(query_timeout, (int, float)) and query_timeout > 0):
            raise ValueError(f"query_timeout must be > 0 seconds (how long a client-info query "
                             f"waits for replies), got {query_timeout!r}")
        _check_fraction("straggler_fraction", straggler_fraction, allow_zero=True)
        _check_choice("straggler_unit", straggler_unit, STRAGGLER_UNITS)
        _check_choice("straggler_policy", straggler_policy, STRAGGLER_POLICIES)
        lr_schedule = schedules.as_schedule(lr_schedule)
        if isinstance(lr_schedule, schedules.LRSchedule) and lr_schedule.name == "cosine" \
                and lr_schedule.num_rounds is None:
            raise ValueError("lr_schedule 'cosine' needs num_rounds: FedAvg does not know the "
                             "run's number of rounds; pass LRSchedule('cosine', num_rounds=T)")
        if weighting in QUERY_WEIGHTINGS and not query_client_info:
            raise records.query_required(
                type(self).__name__, f"weighting={weighting!r} (every client's n_k)",
                "use weighting='examples' or 'uniform'")
        timer = clock_timer(type(self).__name__, clock, seed, round_deadline, query_client_info)
        if round_deadline is not None and straggler_fraction > 0:
            raise ValueError(f"round_deadline={round_deadline} and straggler_fraction="
                             f"{straggler_fraction} are alternatives (the deadline makes the "
                             f"stragglers); set straggler_fraction=0 or round_deadline=None")
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=1,
            min_evaluate_nodes=1,
            min_available_nodes=min_available_nodes,
        )
        self.weighting = weighting
        self.server_lr = float(server_lr)
        self.seed = int(seed)
        self.query_client_info = bool(query_client_info)
        self.query_timeout = float(query_timeout)
        self.straggler_fraction = float(straggler_fraction)
        self.straggler_policy = straggler_policy
        self.straggler_unit = straggler_unit
        self.drift_diagnostics = bool(drift_diagnostics)
        self.lr_schedule = lr_schedule
        self.timer = timer  # the simulated clock's state (None: no clock)
        self.transfer_bytes = (0, 0)  # expected bytes down / up per client this round
        self.deadline_dropped = 0  # sampled clients not sent work because of the deadline
        self.straggler_work: dict[int, int] = {}
        self.sent_configs: dict[int, ConfigRecord] = {}
        self.all_nodes: list[int] = []
        self.clients: dict[int, ClientInfo] = {}
        self.current_arrays: ArrayRecord | None = None
        self.draws: dict[int, int] = {}
        self.diagnostics: dict[int, dict] = {}
        self._warned_query = False

    # ------------------------------------------------------------------ summary
    def summary(self) -> None:
        """Log the configuration, including where the defaults differ from Flower's."""
        log(INFO, "\t├──> Weighting: %s | server lr: %s | seed: %s | client-info query: %s",
            self.weighting, self.server_lr, self.seed, "on" if self.query_client_info else "off")
        log(INFO, "\t├──> Differs from Flower's FedAvg: m = max(floor(C K), 1) clients per "
            "round (min_train_nodes 1, Flower's default 2)")
        if self.lr_schedule is not None:
            log(INFO, "\t├──> Learning rate per round: %s", self.lr_schedule)
        if self.straggler_fraction > 0:
            log(INFO, "\t├──> Stragglers: %.0f%% per round, policy '%s'",
                100 * self.straggler_fraction, self.straggler_policy)
        if self.timer is not None:
            log(INFO, "\t├──> Simulated clock: %s, deadline %s, policy '%s'",
                type(self.timer.clock.fleet).__name__, self.timer.deadline or "none",
                self.straggler_policy)
        super().summary()

    # ------------------------------------------------------------------ clients
    def update_clients(self, grid: Grid) -> list[int]:
        """Connected nodes (at least ``min_available_nodes``); new ones are queried when
        ``query_client_info`` is on (:func:`strategies.records.update_clients`)."""
        nodes, self._warned_query = records.update_clients(
            grid, self.clients, min_nodes=self.min_available_nodes, query=self.query_client_info,
            timeout=self.query_timeout, owner=type(self).__name__, warned=self._warned_query)
        # the clock keys profiles by partition id: nodes whose answer was refused sit out
        return nodes if self.timer is None else records.usable_nodes(nodes, self.clients)

    def ordered_nodes(self, node_ids: list[int]) -> list[int]:
        """Nodes sorted by reported partition id; nodes without one after, by node id."""
        return records.partition_order(node_ids, self.clients)

    def client_sizes(self, node_ids: list[int]) -> list[int | None]:
        """n_k of the given nodes as far as known."""
        return [self.clients.get(n, ClientInfo()).num_examples for n in node_ids]

    def data_shares(self, node_ids: list[int]) -> np.ndarray:
        """p_k = n_k / n over the given nodes (uniform, with a warning, if a size is unknown)."""
        shares = agg.data_shares(self.client_sizes(node_ids))
        if shares is None:
            log(WARNING, "Some clients did not report num-examples: p_k taken as uniform")
            return np.full(len(node_ids), 1.0 / len(node_ids))
        return shares

    # ------------------------------------------------------------------ train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Algorithm 1, server side of round t: sample S_t and send w_t to each k in S_t."""
        self.current_arrays = arrays
        self.all_nodes = self.update_clients(grid)
        ordered, m = self.online_nodes(server_round, self.ordered_nodes(self.all_nodes))
        picks = {}
        if ordered:
            probabilities = self.data_shares(ordered) if self.weighting == "scheme-i" else None
            picks = sampling.sample_round(self.seed, server_round, len(ordered),
                                          self.fraction_train, probabilities, num_sampled=m)
        self.draws = {ordered[k]: d for k, d in picks.items()}
        config[C.SERVER_ROUND] = server_round
        config = self.round_config(server_round, config)
        sampled = len(self.draws)
        self.transfer_bytes = self.expected_bytes(arrays)
        stragglers = self.assign_stragglers(server_round, config)
        if self.straggler_policy == "drop":
            self.draws = {n: d for n, d in self.draws.items() if n not in stragglers}
        else:  # partial work; a client that fits no step by the deadline is not sent any
            self.draws = {n: d for n, d in self.draws.items() if stragglers.get(n, 1) > 0}
        self.deadline_dropped = sampled - len(self.draws) if self.timer is not None else 0
        self.sent_configs = {n: self.node_config(n, server_round, config) for n in self.draws}
        messages = [
            Message(content=RecordDict({C.ARRAYS: arrays, C.CONFIG: self.sent_configs[node]}),
                    message_type=MessageType.TRAIN, dst_node_id=node)
            for node in self.draws
        ]
        log(INFO, "configure_train: sampled %d of %d nodes (%d stragglers, policy %s)",
            sampled, len(self.all_nodes), len(stragglers), self.straggler_policy)
        self.diagnostics[server_round] = {
            C.LOG_CLIENTS_SAMPLED: sampled,
            C.LOG_CLIENTS_STRAGGLERS: len(stragglers),
            C.LOG_CLIENTS_DROPPED: sampled - len(messages),
            C.LOG_BYTES_DOWN: len(messages) * arrays.count_bytes(),
        }
        lr = config.get(C.LR)
        if isinstance(lr, (int, float)) and not isinstance(lr, bool):
            self.diagnostics[server_round][C.LOG_LR] = float(lr)
        if self.timer is not None:
            self.diagnostics[server_round][C.LOG_CLIENTS_UNAVAILABLE] = (
                len(self.all_nodes) - len(ordered))
        return messages

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """The round's config: with ``lr_schedule`` a copy whose ``lr`` is lr_t (the caller's
        record keeps lr_0 for the next rounds), else ``config`` itself."""
        if self.lr_schedule is None:
            return config
        if C.LR not in config:
            raise ValueError(f"lr_schedule needs lr_0: the train config has no '{C.LR}'; pass "
                             f"train_config=ConfigRecord({{'{C.LR}': ...}}) to start()")
        own = ConfigRecord(dict(config))
        own[C.LR] = schedules.round_lr(self.lr_schedule, server_round, float(config[C.LR]))
        return own

    def assign_stragglers(self, server_round: int, config: ConfigRecord) -> dict[int, int]:
        """This round's stragglers among the sampled nodes -> their reduced local work: the
        steps that fit ``round_deadline``, or ``straggler_fraction``'s random ones."""
        if self.timer is not None and self.timer.deadline is not None:
            self.straggler_work = self.deadline_work(config)
            return self.straggler_work
        nodes = list(self.draws)
        in_epochs = self.work_in_epochs(config)

        def full_work(positions: list[int]) -> list[int]:
            if in_epochs:
                return [int(config.get(C.LOCAL_EPOCHS, 1))] * len(positions)
            return [self.full_local_steps(nodes[i], config) for i in positions]

        work = sampling.round_stragglers(self.seed, server_round, len(nodes),
                                         self.straggler_fraction, full_work)
        self.straggler_work = {nodes[i]: w for i, w in work.items()}
        return self.straggler_work

    def full_local_steps(self, node_id: int, config: ConfigRecord) -> int:
        """tau_i of a non-straggler: ``local-steps`` if set, else floor(E n_i / B)."""
        steps = int(config.get(C.LOCAL_STEPS, 0))
        if steps > 0:
            return steps
        epochs = config.get(C.LOCAL_EPOCHS, 1)  # may be a fraction of an epoch
        n = self.clients.get(node_id, ClientInfo()).num_examples
        if not n:
            return max(int(epochs), 1)
        return max(sampling.steps_for_epochs(n, int(config.get(C.BATCH_SIZE, 0)), epochs), 1)

    def work_in_epochs(self, config: ConfigRecord) -> bool:
        """Stragglers' work counts whole epochs (``straggler_unit="epochs"`` without
        ``local-steps``; a deadline always cuts steps)."""
        return (self.straggler_unit == "epochs" and int(config.get(C.LOCAL_STEPS, 0)) == 0
                and (self.timer is None or self.timer.deadline is None))

    def node_config(self, node_id: int, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """The ConfigRecord sent to one node: a straggler's asks for its reduced work."""
        if node_id not in self.straggler_work:
            return config
        own = ConfigRecord(dict(config))
        if self.work_in_epochs(config):
            own[C.LOCAL_EPOCHS] = self.straggler_work[node_id]
        else:
            own[C.LOCAL_STEPS] = self.straggler_work[node_id]
        return own

    # ------------------------------------------------------------------ simulated clock
    def online_nodes(self, server_round: int, ordered: list[int]) -> tuple[list[int], int | None]:
        """The nodes that can be sampled this round and m: all of them and None (m =
        max(floor(C K), 1)) without a clock; with one, :meth:`strategies.clock.RoundTimer.
        online_nodes`."""
        if self.timer is None:
            return ordered, None
        return self.timer.online_nodes(server_round, ordered,
                                       [self.partition_of(n) for n in ordered], self.fraction_train)

    def partition_of(self, node_id: int) -> int:
        """The node's partition id (the clock's profiles are keyed by it)."""
        return records.clock_partition_id(type(self).__name__, self.clients, node_id)

    def expected_bytes(self, arrays: ArrayRecord) -> tuple[int, int]:
        """Bytes down and up per client this round, as the clock plans them: the model each
        way. A subclass that sends or returns more arrays (FedVeca's gradient, control
        variates) adds them here; the time of a reply counts its actual arrays."""
        size = arrays.count_bytes()
        return size, size

    def examples_per_step(self, node_id: int, config: ConfigRecord) -> int:
        """b_i = min(B, n_i) examples per local step; n_i for a full batch (B = 0)."""
        batch = int(config.get(C.BATCH_SIZE, 0))
        n = self.clients.get(node_id, ClientInfo()).num_examples
        if batch > 0:
            return min(batch, n) if n else batch
        if not n:
            raise ValueError(f"{type(self).__name__}: the simulated clock needs node "
                             f"{node_id}'s num-examples for a full-batch step; it answers the "
                             f"client-info query with none")
        return n

    def extra_examples(self, node_id: int, config: ConfigRecord) -> int:
        """e_i of :mod:`strategies.clock` eq. (1): examples of any forward-backward pass
        beyond the local steps (none for FedAvg)."""
        return 0

    def planned_steps(self, node_id: int) -> int:
        """tau_i as sent: the config's ``local-steps``, else floor(E n_i / B)."""
        sent = self.sent_configs.get(node_id, ConfigRecord())
        steps = int(sent.get(C.LOCAL_STEPS, 0))
        return steps if steps > 0 else self.full_local_steps(node_id, sent)

    def deadline_work(self, config: ConfigRecord) -> dict[int, int]:
        """Sampled node -> the steps that fit ``round_deadline``, for the nodes whose full
        work does not (0: not even one step, or fewer than the strategy's minimum)."""
        down, up = self.transfer_bytes
        work = {}
        for node in self.draws:
            full = self.full_local_steps(node, config)
            fit = self.timer.steps_by_deadline(self.partition_of(node),
                                               self.examples_per_step(node, config), down, up,
                                               self.extra_examples(node, config))
            if fit < full:
                work[node] = fit if fit >= self.MIN_PARTIAL_STEPS else 0
        return work

    def record_round_time(self, server_round: int, accepted: list[Message]) -> None:
        """sim-seconds and sim-elapsed of the round: eq. (1) of :mod:`strategies.clock` per
        client sent work, with the steps and array bytes of its accepted reply, else (no
        usable reply) the planned ones; the deadline when it dropped a client."""
        down, expected_up = self.transfer_bytes
        replies = {r.metadata.src_node_id: r for r in accepted}
        times = []
        for node in self.draws:
            steps, up = self.planned_steps(node), expected_up
            reply = replies.get(node)
            if reply is not None:
                taken = reply.content[C.METRICS].get(C.LOCAL_STEPS_TAKEN)
                if isinstance(taken, int) and not isinstance(taken, bool) and taken >= 1:
                    steps = taken
                up = sum(rec.count_bytes() for rec in reply.content.array_records.values())
            config = self.sent_configs.get(node, ConfigRecord())
            times.append(self.timer.client_seconds(self.partition_of(node), steps,
                                                   self.examples_per_step(node, config),
                                                   down, up, self.extra_examples(node, config)))
        wait = self.timer.wait
        seconds = self.timer.finish_round(times, waited_for_deadline=self.deadline_dropped > 0)
        diag = self.diagnostics.setdefault(server_round, {})
        diag[C.LOG_SIM_SECONDS] = seconds
        diag[C.LOG_SIM_ELAPSED] = self.timer.elapsed
        if wait > 0:
            diag[C.LOG_SIM_WAIT_SECONDS] = wait
        log(INFO, "Simulated clock: round %d took %.4g s (%d client(s) cut by the deadline, "
            "%d not sent work), %.4g s in all", server_round, seconds,
            len(self.straggler_work) if self.timer.deadline is not None else 0,
            self.deadline_dropped, self.timer.elapsed)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Algorithm 1, w_{t+1} = w_t + eta_g sum_k c_k (w_k - w_t) over the usable replies."""
        new, accepted = self.aggregate_replies(server_round, replies)
        return self.train_result(server_round, new, accepted)

    def aggregate_replies(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[agg.NDArrays | None, list[Message]]:
        """Check the replies in partition order, then stream the usable ones into the update.

        Returns the new model (None: keep w_t) and the replies it was computed from.
        """
        return self.aggregate_checked(server_round, self.checked_replies(server_round, replies))

    def aggregate_checked(
        self, server_round: int, checked: list[Message]
    ) -> tuple[agg.NDArrays | None, list[Message]]:
        """The update over replies that passed :meth:`checked_replies`, minus those with NaN
        / Inf in their arrays (one log line each), and the round's diagnostics.

        The client models are read in place from the replies (views, no copies) into one
        accumulator (:func:`strategies.aggregate.streamed_update`).
        """
        global_arrays = records.to_numpy(self.current_arrays)
        models = [(k, records.to_numpy(r.content[C.ARRAYS])) for k, r in enumerate(checked)]
        new, used = (None, [])
        if checked:
            new, used = self.update_model(server_round, global_arrays, checked, models)
        accepted = [checked[k] for k in used]
        diag = self.diagnostics.setdefault(server_round, {})
        diag[C.LOG_CLIENTS_RECEIVED] = len(accepted)
        diag[C.LOG_CLIENTS_FAILED] = len(self.draws) - len(accepted)
        diag[C.LOG_BYTES_UP] = sum(r.content[C.ARRAYS].count_bytes() for r in accepted)
        steps = [r.content[C.METRICS].get(C.LOCAL_STEPS_TAKEN) for r in accepted]
        if steps and all(isinstance(s, (int, float)) for s in steps):
            diag[C.LOG_LOCAL_STEPS] = [int(s) for s in steps]
        if self.drift_diagnostics and accepted:
            drift = agg.UpdateDrift(global_arrays)
            for k in used:
                drift.add(models[k][1])
            diag.update(drift.summary())
        diag[C.LOG_MODEL_KEPT] = not accepted
        if self.timer is not None:
            self.record_round_time(server_round, accepted)
        return (new if accepted else None), accepted

    def update_model(
        self, server_round: int, global_arrays: agg.NDArrays, replies: list[Message],
        models: list[tuple[int, agg.NDArrays]],
    ) -> tuple[agg.NDArrays | None, list[int]]:
        """The weighting's coefficients over ``replies`` and the streamed update of
        :func:`strategies.aggregate.streamed_update`; the new model and the indices used."""
        new, used, _ = agg.streamed_update(global_arrays, models, self.coefficients(replies),
                                           self.server_lr, on_reject=self.rejecter(replies))
        return new, used

    @staticmethod
    def rejecter(replies: list[Message]):
        """``on_reject(k, key)`` for the streamed updates: one log line per non-finite reply."""
        def reject(k: int, key: str) -> None:
            log(WARNING, "Reply from node %d rejected: array '%s' has NaN or Inf",
                replies[k].metadata.src_node_id, key)
        return reject

    def coefficients(self, replies: list[Message]) -> agg.Coefficients:
        """c_k of the configured weighting over the checked replies."""
        nodes = [r.metadata.src_node_id for r in replies]
        n = [float(r.content[C.METRICS][C.NUM_EXAMPLES]) for r in replies]
        if self.weighting == "examples":
            return agg.coefficients_by_examples(n)
        if self.weighting == "uniform":
            return agg.coefficients_uniform(len(replies))
        if self.weighting == "scheme-i":
            return agg.coefficients_scheme_i([self.draws.get(node, 1) for node in nodes])
        if self.weighting == "scheme-ii":
            shares = self.data_shares(self.all_nodes)
            index = {node: i for i, node in enumerate(self.all_nodes)}
            return agg.coefficients_scheme_ii([shares[index[node]] for node in nodes],
                                              len(self.all_nodes))
        for node, n_k in zip(nodes, n):  # pre-erratum: a reply's n_k is the latest known
            self.clients.setdefault(node, ClientInfo()).num_examples = int(n_k)
        total = agg.total_examples(self.client_sizes(self.all_nodes))
        return agg.coefficients_pre_erratum(n, total)

    def train_result(self, server_round: int, new: agg.NDArrays | None, accepted: list[Message]
                     ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's return value of ``aggregate_train``; logs the train loss."""
        if new is None:
            log(WARNING, "Round %d: no usable reply, the global model is kept", server_round)
            return None, None
        if not trust_gate.adoptable_model(new, server_round):
            self.diagnostics.setdefault(server_round, {})[C.LOG_MODEL_KEPT] = True
            return None, None
        metrics = records.mean_metrics(accepted)
        if C.TRAIN_LOSS in metrics or C.STOCK_TRAIN_LOSS in metrics:
            self.diagnostics[server_round][C.LOG_TRAIN_LOSS] = metrics.get(
                C.TRAIN_LOSS, metrics.get(C.STOCK_TRAIN_LOSS))
        return records.to_record(new), MetricRecord(metrics)

    # ------------------------------------------------------------------ replies
    def checked_replies(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """The replies that pass :meth:`reply_problem`, in partition order.

        Raises :class:`strategies.records.ClientContractError` when every reply that came
        without a client error lacks what this strategy's contract needs
        (:meth:`contract_gap`): the ClientApp does not implement it.
        """
        ordered = records.replies_in_order(replies, self.clients)
        answered = [r for r in ordered if not r.has_error()]
        gaps = [self.contract_gap(r) for r in answered]
        if answered and all(gaps) and self.CLIENT_HELPER:
            raise records.contract_error(type(self).__name__, server_round, len(answered),
                                         gaps[0], self.CLIENT_HELPER)
        return [r for r in ordered if self.accept_reply(r)]

    def contract_gap(self, reply: Message) -> str | None:
        """What a reply without a client error lacks of this strategy's own contract, or
        None. FedAvg's contract is Flower's template: nothing beyond :meth:`reply_problem`."""
        return None

    def accept_reply(self, reply: Message) -> bool:
        """True if the reply can be aggregated; else one log line saying why."""
        problem = self.reply_problem(reply)
        if problem:
            node = reply.metadata.src_node_id
            trust_gate.log_refused("Reply", node, trust_gate.partition_of(self.clients, node),
                                   problem)
            return False
        return True

    def reply_problem(self, reply: Message) -> str | None:
        """What is wrong with a reply, or None (:func:`strategies.records.reply_problem`:
        the trust gate, against the model, config and size this node was sent / reported)."""
        node = reply.metadata.src_node_id
        size = self.clients.get(node, ClientInfo()).num_examples
        return records.reply_problem(reply, self.current_arrays,
                                     sent=self.sent_configs.get(node), reported_size=size)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """Flower's weighted mean of the evaluate metrics over the replies the trust gate
        accepts (:func:`strategies.trust_gate.aggregate_evaluate`)."""
        return trust_gate.aggregate_evaluate(replies, self.clients)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Cross-round state for a checkpoint (see fedapp/checkpoint.py).

        FedAvg keeps none that a resumed run could not rebuild: sampling and stragglers
        are drawn from ``default_rng([seed, server_round(, 1)])`` afresh every round, and
        the client table is re-queried (node ids change between runs, partition ids do
        not). Subclasses add their own state. With a clock: the simulated time so far.
        """
        state = {"fedavg-state-version": 1, "class": type(self).__name__}
        if self.timer is not None:
            state["sim-elapsed"] = self.timer.elapsed
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (checks it is this class's)."""
        if state.get("class") != type(self).__name__:
            raise ValueError(f"checkpoint holds the state of {state.get('class')!r}, "
                             f"not of {type(self).__name__}")
        if self.timer is not None:
            self.timer.elapsed = float(state.get("sim-elapsed", 0.0))


def clock_timer(owner: str, clock: SimClock | None, seed: int, deadline: float | None,
                query_client_info: bool) -> RoundTimer | None:
    """The strategy's :class:`~strategies.clock.RoundTimer` (None without a clock), checked:
    the profiles are keyed by partition id (the client-info query), a deadline needs a clock."""
    if deadline is not None and not (isinstance(deadline, (int, float)) and deadline > 0
                                     and math.isfinite(deadline)):
        raise ValueError(f"round_deadline must be a finite number of simulated seconds > 0 "
                         f"(None: no deadline), got {deadline!r}")
    if clock is None:
        if deadline is not None:
            raise ValueError(f"round_deadline={deadline} needs a simulated clock: pass "
                             f"clock=SimClock(fleet, seconds_per_example) (strategies.clock)")
        return None
    if not query_client_info:
        raise records.query_required(owner, "clock (device profiles are keyed by the clients' "
                                     f"'{C.PARTITION_ID}')", "leave clock=None")
    return RoundTimer(clock, seed, deadline)


def _check_fraction(name: str, value: float, allow_zero: bool) -> None:
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value <= 1):
        allowed = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must be in {allowed}, got {value}")


def _check_whole(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not known; use one of {', '.join(allowed)}")

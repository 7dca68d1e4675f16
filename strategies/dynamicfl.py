"""DynamicFL (Le et al.): DynaComm grouping and two-frequency synchronisation on the Grid.

Subclass of :class:`strategies.FedAvg` (sampling by partition id, the client-info
query, diagnostics). The math lives in :mod:`strategies.dynacomm` (which clients sync
often) and :mod:`strategies.dynamicfl_schedule` (when everybody syncs); this module
only moves records. ``start`` is overridden because a DynamicFL round is not one
send-and-receive but a sequence of sync events: each chunk is pushed when it starts
(``Grid.push_messages``) and its reply is pulled (``Grid.pull_messages``) and held until
the chunk's end step, so long low-frequency chunks run while short high-frequency ones
come and go. See docs/dynamicfl.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from logging import INFO, WARNING

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from . import aggregate as agg
from . import contract as C
from . import dynacomm as dc
from . import dynamicfl_schedule as ds
from .contract import COMM_BUDGET, NUM_STEPS, ROUND_STEPS, START_STEP  # the chunk keys (re-exported)
from .fedavg import ClientInfo, FedAvg

STATE_VERSION = 1  # of state_dict()


class DynamicFL(FedAvg):
    """DynamicFL / DynamicAvg / DynamicSGD (Le et al., Alg. 1).

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
    cosine_lr_min : float, optional
        If set, lr_t = cosine schedule from the train config's ``lr`` to this over the run.
    poll_interval : float
        Seconds between ``pull_messages`` calls while waiting for a sync event.
    other parameters
        As :class:`strategies.FedAvg` (``fraction_train`` = C, ``seed``, ...).
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
        cosine_lr_min: float | None = None,
        poll_interval: float = 0.01,
        fraction_train: float = 0.1,
        fraction_evaluate: float = 0.0,
        seed: int = 0,
        min_available_nodes: int = 1,
        query_timeout: float = 600.0,
        drift_diagnostics: bool = False,
    ) -> None:
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate, seed=seed,
                         min_available_nodes=min_available_nodes, query_timeout=query_timeout,
                         drift_diagnostics=drift_diagnostics)
        self.spec = ds.parse_interval_spec(intervals)
        if budget_mode not in dc.BUDGET_MODES:
            raise ValueError(f"budget_mode={budget_mode!r} is not known; use one of {', '.join(dc.BUDGET_MODES)}")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        if x_star_mode not in ds.X_STAR_MODES:
            raise ValueError(f"x_star_mode={x_star_mode!r} is not known; use one of {', '.join(ds.X_STAR_MODES)}")
        if local_steps < 0 or n_ens < 1 or min_group_size < 1 or poll_interval < 0:
            raise ValueError(f"need local_steps >= 0 (0 = Eq. 4), n_ens >= 1, min_group_size >= 1 and "
                             f"poll_interval >= 0; got {local_steps}, {n_ens}, {min_group_size}, {poll_interval}")
        self.local_steps = int(local_steps)
        self.budget_mode = budget_mode
        self.beta = float(beta)
        self.server_budget = server_budget
        self.n_ens = int(n_ens)
        self.x_star_mode = x_star_mode
        self.min_group_size = int(min_group_size)
        self.cosine_lr_min = cosine_lr_min
        self.poll_interval = float(poll_interval)
        self.budgets: dict[int, float] = {}
        self.rich: set[int] | None = None  # Fix-beta, drawn once over the partition order
        self.plans: dict[int, ds.RoundPlan] = {}

    def state_dict(self) -> dict:
        """Cross-round state for a checkpoint: L, the Fix-beta rich set (partition ids), the
        reported byte budgets (by partition id). Plain Python, JSON-able.

        Keyed by partition id, not node id, because node ids change between runs."""
        def pid(node: int) -> int | None:
            return self.clients.get(node, ClientInfo()).partition_id
        rich = None if self.rich is None else sorted(p for p in (pid(n) for n in self.rich) if p is not None)
        budgets = {str(pid(n)): b for n, b in self.budgets.items() if pid(n) is not None}
        base = super().state_dict() if hasattr(super(), "state_dict") else {}
        return {**base, "dynamicfl-state-version": STATE_VERSION, "local-steps": self.local_steps,
                "rich-partitions": rich, "budgets": budgets}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned. The rich set and budgets are mapped back to
        node ids once the nodes have answered the client-info query (first round)."""
        if hasattr(super(), "load_state_dict"):
            super().load_state_dict(state)  # FedAvg's check that this is a DynamicFL state
        if state.get("dynamicfl-state-version") != STATE_VERSION:
            raise ValueError(f"DynamicFL state version {state.get('dynamicfl-state-version')!r} is not "
                             f"{STATE_VERSION}; start the run afresh")
        steps = int(state["local-steps"])
        if steps < 0:
            raise ValueError(f"DynamicFL state has local-steps={steps}; it must be >= 0")
        self.local_steps = steps
        self._restored = state

    def _apply_restored(self) -> None:
        state = getattr(self, "_restored", None)
        if not state:
            return
        by_pid = {info.partition_id: node for node, info in self.clients.items() if info.partition_id is not None}
        if state.get("rich-partitions") is not None:
            self.rich = {by_pid[p] for p in state["rich-partitions"] if p in by_pid}
        for p, budget in state.get("budgets", {}).items():
            if int(p) in by_pid:
                self.budgets.setdefault(by_pid[int(p)], float(budget))
        self._restored = None

    def summary(self) -> None:
        log(INFO, "\t├──> DynamicFL: intervals %s | L %s | budget %s (beta %s) | n_ens %d | seed %d",
            self.spec, self.local_steps or "Eq. 4", self.budget_mode, self.beta, self.n_ens, self.seed)

    # ------------------------------------------------------------------ clients
    def register_clients(self, grid: Grid, node_ids: list[int]) -> None:
        """The client-info query of FedAvg, plus the optional ``comm-budget`` of each node."""
        unknown = [n for n in node_ids if n not in self.clients]
        if not unknown:
            return
        content = RecordDict({C.CONFIG: ConfigRecord({C.QUERY: C.QUERY_CLIENT_INFO})})
        messages = [Message(content=content, message_type=MessageType.QUERY, dst_node_id=n) for n in unknown]
        for reply in grid.send_and_receive(messages, timeout=self.query_timeout):
            node = reply.metadata.src_node_id
            info = ClientInfo()
            if not reply.has_error() and C.METRICS in reply.content:
                metrics = reply.content[C.METRICS]
                if C.PARTITION_ID in metrics:
                    info.partition_id = int(metrics[C.PARTITION_ID])
                if C.NUM_EXAMPLES in metrics:
                    info.num_examples = int(metrics[C.NUM_EXAMPLES])
                if C.LABEL_COUNTS in metrics:
                    info.label_counts = [int(c) for c in metrics[C.LABEL_COUNTS]]
                if COMM_BUDGET in metrics:
                    self.budgets[node] = float(metrics[COMM_BUDGET])
            self.clients[node] = info
        for node in unknown:
            self.clients.setdefault(node, ClientInfo())

    def global_distribution(self, nodes: list[int]) -> np.ndarray:
        """p(Y) from ALL connected clients' label counts (paper Sec. 3.1)."""
        missing = [n for n in nodes if not self.clients.get(n, ClientInfo()).label_counts]
        if missing:
            raise ValueError(f"DynamicFL needs every client's '{C.LABEL_COUNTS}' in its '{C.QUERY_CLIENT_INFO}' "
                             f"query reply; {len(missing)} of {len(nodes)} node(s) sent none (e.g. node "
                             f"{missing[0]}). Add a query handler to the ClientApp, or use intervals "
                             f"'{ds.IntervalSpec(self.spec.high, self.spec.high)}' (one group, no DynaComm)")
        return dc.global_label_distribution([self.clients[n].label_counts for n in nodes])

    def steps_per_round(self, nodes: list[int], config: ConfigRecord) -> int:
        """L: as configured, else Eq. 4 over all clients' sizes."""
        if self.local_steps > 0:
            return self.local_steps
        sizes = [self.clients.get(n, ClientInfo()).num_examples for n in nodes]
        if any(not s for s in sizes):
            raise ValueError("local_steps = 0 asks for L by Eq. 4, which needs every client's num-examples; "
                             "set local_steps (the DynamicFL run config's L) instead")
        epochs = float(config.get(C.LOCAL_EPOCHS, 5))
        batch = int(config.get(C.BATCH_SIZE, 10))
        self.local_steps = ds.steps_per_round(sizes, epochs, batch if batch > 0 else max(sizes))
        log(INFO, "DynamicFL: L = %d local steps per round (Eq. 4, E = %g, B = %d)", self.local_steps, epochs, batch)
        return self.local_steps

    # ------------------------------------------------------------------ grouping
    def choose_group(self, server_round: int, active: list[int], nodes: list[int], model_bytes: int) -> dc.Selection:
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
            self.rich = {ordered[i] for i in dc.fix_beta_rich(len(ordered), self.beta, seed=[self.seed, 0xF1])}
        cons = dc.constraints(
            self.budget_mode, len(active), beta=self.beta,
            rich=[n in self.rich for n in active] if self.rich is not None else None,
            budgets=[self.budgets.get(n) for n in active], server_budget=self.server_budget,
            nu_high=nu_high, nu_low=nu_low, model_bytes=model_bytes)
        if self.budget_mode == "budget" and self.server_budget is not None and \
                dc.server_cost(0, len(active), nu_high, nu_low, model_bytes) > self.server_budget:
            log(WARNING, "Round %d: even the all-low schedule (%d bytes) exceeds the server budget (%s bytes)",
                server_round, dc.server_cost(0, len(active), nu_high, nu_low, model_bytes), self.server_budget)
        return dc.dynacomm(counts, q, eligible=cons.eligible, k_max=cons.k_max, n_ens=self.n_ens,
                           rng=[self.seed, server_round, 7], min_size=self.min_group_size)

    # ------------------------------------------------------------------ the round
    def chunk_config(self, base: ConfigRecord, server_round: int, chunk: ds.Chunk, lr: float) -> ConfigRecord:
        config = ConfigRecord(dict(base))
        config[C.SERVER_ROUND] = server_round
        config[START_STEP] = chunk.start
        config[NUM_STEPS] = chunk.num_steps
        config[C.LOCAL_STEPS] = chunk.num_steps  # a client without chunk support still does the right amount
        config[ROUND_STEPS] = self.local_steps
        config[C.LR] = lr
        return config

    def train_round(
        self, server_round: int, num_rounds: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
        timeout: float | None,
    ) -> ArrayRecord | None:
        """Sample, group, and run the round's chunk schedule; the new global model (None: unchanged)."""
        started = time.perf_counter()
        nodes = self.wait_for_nodes(grid)
        self.register_clients(grid, nodes)
        self._apply_restored()
        self.all_nodes = nodes
        L = self.steps_per_round(nodes, config)
        active = self.ordered_nodes(list(self.sample(server_round, nodes)))
        model_bytes = arrays.count_bytes()
        selection = self.choose_group(server_round, active, nodes, model_bytes)
        z = [active[i] for i in selection.members]
        plan = ds.assign_intervals(active, z, self.spec, L, x_star_mode=self.x_star_mode)
        self.plans[server_round] = plan
        lr0 = float(config.get(C.LR, 0.01))
        lr = lr0 if self.cosine_lr_min is None else ds.cosine_lr(server_round, num_rounds, lr0, self.cosine_lr_min)
        new, stats = self.run_plan_on_grid(grid, plan, arrays, config, server_round, lr, timeout)
        cost = ds.round_cost(plan, model_bytes)
        events = max(stats["events"], 1)
        self.diagnostics[server_round] = {
            "clients-sampled": len(active),
            "clients-failed": len(stats["failed"]),
            "dynamicfl-group-size": len(z) if not self.spec.single else len(active),
            "dynamicfl-kl": selection.kl if math.isfinite(selection.kl) else None,
            "kappa-hat": cost.kappa_hat,
            "syncs": cost.syncs,
            "bytes-up": stats["bytes-up"],
            "bytes-down": stats["bytes-down"],
            "sync-events": stats["events"],
            "seconds-per-event": (time.perf_counter() - started) / events,
            "local-steps": L,
            "lr": lr,
        }
        if stats["train-loss"] is not None:
            self.diagnostics[server_round]["train-loss"] = stats["train-loss"]
        self.diagnostics[server_round].update(stats.get("drift", {}))
        log(INFO, "Round %d: |M^t| = %d, |z| = %d (KL %s), %d sync events, kappa-hat %.4f",
            server_round, len(active), len(z), f"{selection.kl:.4f}" if math.isfinite(selection.kl) else "-",
            stats["events"], cost.kappa_hat)
        return new

    def run_plan_on_grid(
        self, grid: Grid, plan: ds.RoundPlan, arrays: ArrayRecord, config: ConfigRecord, server_round: int,
        lr: float, timeout: float | None,
    ) -> tuple[ArrayRecord | None, dict]:
        """Push each chunk when it starts, pull and hold its reply until its end step, and
        average exactly the clients that sync at each event (|D_m|-weighted)."""
        pending: dict[str, ds.Chunk] = {}
        held: dict[int, Message] = {}
        failed: set[int] = set()
        stats = {"bytes-up": 0, "bytes-down": 0, "events": 0, "failed": failed, "train-loss": None}

        def push(chunks: list[ds.Chunk], model: ArrayRecord) -> None:
            if not chunks:
                return
            messages = [Message(RecordDict({C.ARRAYS: model, C.CONFIG: self.chunk_config(config, server_round, c, lr)}),
                                message_type=MessageType.TRAIN, dst_node_id=c.client) for c in chunks]
            ids = list(grid.push_messages(messages))
            for message_id, chunk in zip(ids, chunks):
                pending[message_id] = chunk
            for chunk in chunks[len(ids):]:  # the link refused some: they fail
                failed.add(chunk.client)
            stats["bytes-down"] += model.count_bytes() * len(ids)

        def collect(needed: set[int]) -> None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while needed - held.keys() - failed:
                replies = list(grid.pull_messages(list(pending))) if pending else []
                for reply in replies:
                    chunk = pending.pop(reply.metadata.reply_to_message_id, None)
                    if chunk is None:
                        continue
                    if self.accept_chunk_reply(reply, chunk.client):
                        held[chunk.client] = reply
                        stats["bytes-up"] += reply.content[C.ARRAYS].count_bytes()
                    else:
                        failed.add(chunk.client)
                if not pending and needed - held.keys() - failed:  # nothing can arrive any more
                    failed.update(needed - held.keys())
                if deadline is not None and time.monotonic() > deadline:
                    late = needed - held.keys() - failed
                    if late:
                        log(WARNING, "Round %d: %d client(s) did not reply within %.0f s and are dropped for "
                            "the rest of the round", server_round, len(late), timeout)
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
            members = [m for m in event.clients if m in held]
            if not members:
                continue
            stats["events"] += 1
            replies = [held.pop(m) for m in members]
            models = [_to_numpy(r.content[C.ARRAYS]) for r in replies]
            weights = [self.weight_of(m, r) for m, r in zip(members, replies)]
            if event.step == plan.local_steps:
                if self.drift_diagnostics and models:  # each client's round update W_m^L - W_g^{t-1}
                    drift = agg.UpdateDrift(_to_numpy(arrays))
                    for model in models:
                        drift.add(model)
                    stats["drift"] = drift.summary()
                for r, w in zip(replies, weights):
                    loss = r.content[C.METRICS].get(C.TRAIN_LOSS) if C.METRICS in r.content else None
                    if isinstance(loss, (int, float)):
                        last_losses.append((float(loss), w))
                if plan.frozen:  # 'x*' code mode: untrained start models enter the final average
                    start = _to_numpy(arrays)
                    models += [start] * len(plan.frozen)
                    weights += [float(self.clients.get(m, ClientInfo()).num_examples or 1) for m in plan.frozen]
                final = _to_record(ds.weighted_average(models, weights))
                continue
            average = _to_record(ds.weighted_average(models, weights))
            push([c for c in (plan.next_chunk(m, event.step) for m in members) if c is not None], average)
        if last_losses:
            stats["train-loss"] = sum(l * w for l, w in last_losses) / sum(w for _, w in last_losses)
        return final, stats

    def accept_chunk_reply(self, reply: Message, node: int) -> bool:
        """A usable chunk reply: FedAvg's checks (no error, the model's keys / shapes / dtypes,
        num-examples a positive integer, finite metrics), and finite arrays."""
        if reply.has_error():
            log(WARNING, "Node %d failed a chunk: %s", reply.metadata.src_node_id, reply.error.reason)
            return False
        if C.ARRAYS not in reply.content:
            log(WARNING, "Node %d replied without '%s'", reply.metadata.src_node_id, C.ARRAYS)
            return False
        problem = self.reply_problem(reply) if self.current_arrays is not None else None
        if problem:
            log(WARNING, "Node %d: chunk reply rejected: %s; dropped for the rest of the round",
                reply.metadata.src_node_id, problem)
            return False
        arrays = _to_numpy(reply.content[C.ARRAYS])
        bad = next((k for k, v in arrays.items() if np.issubdtype(v.dtype, np.floating) and not np.isfinite(v).all()),
                   None)
        if bad is not None:
            log(WARNING, "Node %d: array '%s' has NaN or Inf; dropped for the rest of the round",
                reply.metadata.src_node_id, bad)
            return False
        return True

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
        """Flower's round loop with the training step replaced by the DynamicFL schedule.

        ``first_round`` > 1 resumes a checkpoint (fedapp/checkpoint.py): ``initial_arrays``
        is the model after round ``first_round - 1``, which is not evaluated again.
        """
        log(INFO, "Starting %s strategy:", self.__class__.__name__)
        self.summary()
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = Result()
        if evaluate_fn and first_round <= 1:
            res = evaluate_fn(0, initial_arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        arrays = initial_arrays
        result.arrays = arrays
        for current_round in range(max(first_round, 1), num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", current_round, num_rounds)
            self.current_arrays = arrays  # what accept_chunk_reply checks keys, shapes and dtypes against
            new = self.train_round(current_round, num_rounds, arrays, train_config, grid, timeout)
            self.diagnostics.setdefault(current_round, {})["model-kept"] = new is None
            if new is not None:
                arrays = result.arrays = new
            else:
                log(WARNING, "Round %d: no usable reply at step L, the global model is kept", current_round)
            diag = self.diagnostics.get(current_round, {})
            if "train-loss" in diag:
                result.train_metrics_clientapp[current_round] = MetricRecord({C.TRAIN_LOSS: diag["train-loss"]})
            replies = grid.send_and_receive(
                self.configure_evaluate(current_round, arrays, evaluate_config, grid), timeout=timeout)
            agg_eval = self.aggregate_evaluate(current_round, replies)
            if agg_eval is not None:
                result.evaluate_metrics_clientapp[current_round] = agg_eval
            if evaluate_fn:
                res = evaluate_fn(current_round, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[current_round] = res
        return result


def _to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {key: array.numpy() for key, array in record.items()}


def _to_record(arrays) -> ArrayRecord:
    return ArrayRecord({key: Array(np.ascontiguousarray(value)) for key, value in arrays.items()})

"""FedAvg with the weighting and sampling schemes of McMahan et al. and Li et al.

Subclass of Flower's message-API ``FedAvg``. It only translates Flower records to
and from the numpy math in :mod:`strategies.aggregate`, and adds what a
heterogeneity study needs from a FedAvg server:

* reproducible sampling keyed by the ``partition-id`` each client reports (Flower's
  node ids are random per run), seeded by ``(seed, server_round)``;
* the five weighting schemes (``WEIGHTINGS``) and a server learning rate eta_g;
* one bad reply is rejected with one log line instead of ending the run;
* per-round diagnostics (clients sampled/failed, bytes up/down, train loss) in
  ``self.diagnostics[server_round]`` for the run log.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
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
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from . import aggregate as agg
from . import contract as C

WEIGHTINGS = ("examples", "uniform", "pre-erratum", "scheme-i", "scheme-ii")
STRAGGLER_POLICIES = ("drop", "partial")
STRAGGLER_UNITS = ("steps", "epochs")


@dataclass
class ClientInfo:
    """What the server knows of one node (from the client-info query)."""

    partition_id: int | None = None
    num_examples: int | None = None
    label_counts: list[int] | None = None


class FedAvg(FlowerFedAvg):
    """Federated Averaging (McMahan et al. 2017, Alg. 1) with heterogeneity options.

    Parameters
    ----------
    fraction_train : float
        C, the fraction of connected clients sampled per round; m = max(floor(C K), 1).
    fraction_evaluate : float
        Fraction of clients asked to evaluate the global model (0 disables).
    weighting : str
        ``"examples"``: n_k / m_t over the sampled clients (Alg. 1, erratum; default).
        ``"uniform"``: 1 / |S_t|. ``"pre-erratum"``: n_k / n over all clients, the
        unsampled ones keeping w_t. ``"scheme-i"``: K draws with replacement with
        probability p_k = n_k / n, plain mean (Li et al. ICLR'20). ``"scheme-ii"``:
        K of N uniformly, coefficients p_k N / K (Li et al. ICLR'20).
    server_lr : float
        eta_g in w <- w + eta_g * sum_k c_k (w_k - w); 1.0 is plain averaging.
    seed : int
        Seeds client sampling: round r samples with ``default_rng([seed, r])``.
    min_available_nodes : int
        Wait until this many nodes are connected before sampling.
    query_timeout : float
        Seconds to wait for the client-info query replies.
    straggler_fraction : float
        Simulated system heterogeneity (FedProx Sec. 5.2): each round floor(f * m) of
        the m sampled clients, chosen with ``default_rng([seed, round, 1])``, are
        stragglers that can only do part of the local work: uniform in 1..tau_i steps,
        tau_i = ``local-steps`` or floor(E n_i / B).
    straggler_policy : str
        ``"drop"`` (FedAvg in the FedProx paper: stragglers are not waited for, their
        work is discarded, so they are not sent any) or ``"partial"`` (FedProx: their
        partial updates are aggregated).
    straggler_unit : str
        ``"steps"``: a straggler does 1..tau_i steps, uniformly; ``"epochs"``: 1..E whole
        epochs, uniformly (the FedProx paper's x ~ U[1, E]; with ``local-steps`` set it
        falls back to steps).
    drift_diagnostics : bool
        Log client drift per round: per layer the mean pairwise cosine similarity of the
        client updates (IID->non-IID study, Fig. 13) and the spread of their norms.
        Costs one more model-sized buffer and about one more pass over each reply.

    Contract
    --------
    Sends ``config`` with ``server-round`` plus whatever ``train_config`` holds
    (``lr``, ``local-epochs``/``local-steps``, ``batch-size``, ...). Expects per reply
    one ArrayRecord ``arrays`` with the global model's keys and shapes and a
    MetricRecord ``metrics`` with ``num-examples`` > 0 (``train-loss`` or
    ``train_loss`` optional). Sampling by partition needs a ``query`` handler that
    answers ``partition-id`` and ``num-examples``; without one (a stock Flower
    client) sampling falls back to node-id order, with one warning.
    """

    def __init__(
        self,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 0.0,
        weighting: str = "examples",
        server_lr: float = 1.0,
        seed: int = 0,
        min_available_nodes: int = 1,
        query_timeout: float = 600.0,
        straggler_fraction: float = 0.0,
        straggler_policy: str = "drop",
        straggler_unit: str = "steps",
        drift_diagnostics: bool = False,
    ) -> None:
        _check_fraction("fraction_train", fraction_train, allow_zero=False)
        _check_fraction("fraction_evaluate", fraction_evaluate, allow_zero=True)
        if weighting not in WEIGHTINGS:
            raise ValueError(
                f"weighting={weighting!r} is not known; use one of {', '.join(WEIGHTINGS)}"
            )
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        _check_fraction("straggler_fraction", straggler_fraction, allow_zero=True)
        if straggler_unit not in STRAGGLER_UNITS:
            raise ValueError(f"straggler_unit={straggler_unit!r} is not known; use one of "
                             f"{', '.join(STRAGGLER_UNITS)}")
        if straggler_policy not in STRAGGLER_POLICIES:
            raise ValueError(f"straggler_policy={straggler_policy!r} is not known; use one of "
                             f"{', '.join(STRAGGLER_POLICIES)}")
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
        self.query_timeout = float(query_timeout)
        self.straggler_fraction = float(straggler_fraction)
        self.straggler_policy = straggler_policy
        self.straggler_unit = straggler_unit
        self.drift_diagnostics = bool(drift_diagnostics)
        self._drift: agg.UpdateDrift | None = None
        self.straggler_work: dict[int, int] = {}
        self.sent_configs: dict[int, ConfigRecord] = {}
        self.all_nodes: list[int] = []
        self.clients: dict[int, ClientInfo] = {}
        self.current_arrays: ArrayRecord | None = None
        self.draws: dict[int, int] = {}
        self.diagnostics: dict[int, dict] = {}
        self._warned_stock = False

    # ------------------------------------------------------------------ summary
    def summary(self) -> None:
        """Log the configuration."""
        log(INFO, "\t├──> Weighting: %s | server lr: %s | seed: %s",
            self.weighting, self.server_lr, self.seed)
        if self.straggler_fraction > 0:
            log(INFO, "\t├──> Stragglers: %.0f%% per round, policy '%s'",
                100 * self.straggler_fraction, self.straggler_policy)
        super().summary()

    # ------------------------------------------------------------------ sampling
    def wait_for_nodes(self, grid: Grid) -> list[int]:
        """Connected node ids, sorted, once at least ``min_available_nodes`` are there."""
        last_log = 0.0
        while len(nodes := sorted(grid.get_node_ids())) < self.min_available_nodes:
            if time.monotonic() - last_log > 10:
                log(INFO, "Waiting for nodes: %d connected, need %d",
                    len(nodes), self.min_available_nodes)
                last_log = time.monotonic()
            time.sleep(1)
        return nodes

    def register_clients(self, grid: Grid, node_ids: list[int]) -> None:
        """Ask nodes not seen before for their partition id and dataset size."""
        unknown = [n for n in node_ids if n not in self.clients]
        if not unknown:
            return
        content = RecordDict({C.CONFIG: ConfigRecord({C.QUERY: C.QUERY_CLIENT_INFO})})
        messages = [
            Message(content=content, message_type=MessageType.QUERY, dst_node_id=n)
            for n in unknown
        ]
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
            self.clients[node] = info
        for node in unknown:
            self.clients.setdefault(node, ClientInfo())
        stock = [n for n in unknown if self.clients[n].partition_id is None]
        if stock and not self._warned_stock:
            self._warned_stock = True
            log(WARNING, "%d node(s) did not answer the '%s' query with '%s' (a ClientApp "
                "without a query handler?): they are sampled in node-id order, which is "
                "not reproducible across runs", len(stock), C.QUERY_CLIENT_INFO, C.PARTITION_ID)

    def ordered_nodes(self, node_ids: list[int]) -> list[int]:
        """Nodes sorted by reported partition id; nodes without one after, by node id."""
        def key(node: int) -> tuple[int, int]:
            pid = self.clients.get(node, ClientInfo()).partition_id
            return (0, pid) if pid is not None else (1, node)
        return sorted(node_ids, key=key)

    def data_shares(self, node_ids: list[int]) -> np.ndarray:
        """p_k = n_k / n over the given nodes (uniform if a size is unknown)."""
        sizes = [self.clients.get(n, ClientInfo()).num_examples for n in node_ids]
        if any(s is None or s <= 0 for s in sizes):
            log(WARNING, "Some clients did not report num-examples: p_k taken as uniform")
            return np.full(len(node_ids), 1.0 / len(node_ids))
        arr = np.asarray(sizes, dtype=np.float64)
        return arr / arr.sum()

    def total_examples(self) -> float:
        """n over all connected clients; a size not known yet counts as the mean known size."""
        known = [self.clients.get(x, ClientInfo()).num_examples for x in self.all_nodes]
        sizes = [k for k in known if k]
        fill = float(np.mean(sizes)) if sizes else 0.0
        return float(sum(k if k else fill for k in known))

    def sample(self, server_round: int, node_ids: list[int]) -> dict[int, int]:
        """Node id -> number of draws (1 unless scheme-i draws a node twice)."""
        ordered = self.ordered_nodes(node_ids)
        m = agg.num_to_sample(self.fraction_train, len(ordered))
        rng = np.random.default_rng([self.seed, server_round])
        if self.weighting == "scheme-i":
            counts = agg.sample_with_replacement(rng, self.data_shares(ordered), m)
            return {n: int(c) for n, c in zip(ordered, counts) if c > 0}
        return {ordered[i]: 1 for i in agg.sample_without_replacement(rng, len(ordered), m)}

    # ------------------------------------------------------------------ train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample by partition id and build one train message per sampled node."""
        self.current_arrays = arrays
        nodes = self.wait_for_nodes(grid)
        self.register_clients(grid, nodes)
        self.all_nodes = nodes
        self.draws = self.sample(server_round, nodes)
        config[C.SERVER_ROUND] = server_round
        sampled = len(self.draws)
        stragglers = self.assign_stragglers(server_round, config)
        if self.straggler_policy == "drop":
            self.draws = {n: d for n, d in self.draws.items() if n not in stragglers}
        self.sent_configs = {node: self.node_config(node, server_round, config) for node in self.draws}
        messages = [
            Message(
                content=RecordDict({C.ARRAYS: arrays, C.CONFIG: self.sent_configs[node]}),
                message_type=MessageType.TRAIN,
                dst_node_id=node,
            )
            for node in self.draws
        ]
        log(INFO, "configure_train: sampled %d of %d nodes (%d stragglers, policy %s)",
            sampled, len(nodes), len(stragglers), self.straggler_policy)
        self.diagnostics[server_round] = {
            "clients-sampled": sampled,
            "clients-stragglers": len(stragglers),
            "clients-dropped": sampled - len(messages),
            "bytes-down": len(messages) * arrays.count_bytes(),
        }
        return messages

    def assign_stragglers(self, server_round: int, config: ConfigRecord) -> dict[int, int]:
        """Choose this round's stragglers among the sampled nodes and their local steps."""
        self.straggler_work = {}
        if self.straggler_fraction <= 0:
            return {}
        nodes = list(self.draws)
        rng = np.random.default_rng([self.seed, server_round, 1])
        mask = agg.choose_stragglers(rng, len(nodes), self.straggler_fraction)
        chosen = [n for n, is_straggler in zip(nodes, mask) if is_straggler]
        if self.straggler_unit == "epochs" and int(config.get(C.LOCAL_STEPS, 0)) == 0:
            full = [int(config.get(C.LOCAL_EPOCHS, 1))] * len(chosen)
        else:
            full = [self.full_local_steps(n, config) for n in chosen]
        self.straggler_work = {n: int(s) for n, s in zip(chosen, agg.straggler_steps(rng, full))}
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
        return max(agg.steps_for_epochs(n, int(config.get(C.BATCH_SIZE, 0)), epochs), 1)

    def node_config(self, node_id: int, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """The ConfigRecord sent to one node; subclasses add per-client keys.

        A straggler's record asks for its reduced number of local steps.
        """
        if node_id not in self.straggler_work:
            return config
        own = ConfigRecord(dict(config))
        if self.straggler_unit == "epochs" and int(config.get(C.LOCAL_STEPS, 0)) == 0:
            own[C.LOCAL_EPOCHS] = self.straggler_work[node_id]
        else:
            own[C.LOCAL_STEPS] = self.straggler_work[node_id]
        return own

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check replies one by one, then stream them into the weighting scheme's update.

        Only one client model is deserialised at a time (plus one accumulator).
        """
        checked = [r for r in self.in_partition_order(replies) if self.accept_reply(r)]
        acc, accepted, planned = agg.WeightedModelSum(), [], 0.0
        self._drift = agg.UpdateDrift(_to_numpy(self.current_arrays)) if self.drift_diagnostics and checked else None
        if checked:
            weights, extras = self.client_weights(checked)
            planned = float(np.sum(weights))
            acc, accepted = self.accumulate(checked, weights / planned, extras)
        diag = self.diagnostics.setdefault(server_round, {})
        diag["clients-received"] = len(accepted)
        diag["clients-failed"] = len(self.draws) - len(accepted)
        diag["bytes-up"] = sum(r.content[C.ARRAYS].count_bytes() for r in accepted)
        steps = [r.content[C.METRICS].get(C.LOCAL_STEPS_TAKEN) for r in accepted]
        if steps and all(isinstance(s, (int, float)) for s in steps):
            diag["local-steps"] = [int(s) for s in steps]
        if self._drift is not None:
            diag.update(self._drift.summary())
        diag["model-kept"] = not accepted
        if not accepted:
            log(WARNING, "Round %d: no usable reply, the global model is kept", server_round)
            return None, None
        new = self.new_arrays(server_round, acc, planned)
        metrics = _mean_metrics(accepted)
        if C.TRAIN_LOSS in metrics or C.STOCK_TRAIN_LOSS in metrics:
            diag["train-loss"] = metrics.get(C.TRAIN_LOSS, metrics.get(C.STOCK_TRAIN_LOSS))
        return _to_record(new), MetricRecord(metrics)

    def in_partition_order(self, replies: Iterable[Message]) -> list[Message]:
        """Replies sorted by the sender's partition id (node id after), not by arrival.

        Flower's Grid returns replies in arrival order, which varies between runs; the
        floating-point sums of the aggregation (and the per-client lists in the run log)
        depend on the order, so a fixed order is what makes two runs with the same seed,
        and a resumed run, bit-identical.
        """
        def key(reply: Message) -> tuple[int, int]:
            node = reply.metadata.src_node_id
            pid = self.clients.get(node, ClientInfo()).partition_id
            return (0, pid) if pid is not None else (1, node)
        return sorted(replies, key=key)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Cross-round state for a checkpoint (see fedapp/checkpoint.py).

        FedAvg keeps none that a resumed run could not rebuild: sampling and stragglers
        are drawn from ``default_rng([seed, server_round(, 1)])`` afresh every round (no
        generator state to carry), and the client table is re-queried (node ids change
        between runs; partition ids do not). Subclasses add their own state.
        """
        return {"fedavg-state-version": 1, "class": type(self).__name__}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (checks it is this class's)."""
        if state.get("class") != type(self).__name__:
            raise ValueError(f"checkpoint holds the state of {state.get('class')!r}, not of {type(self).__name__}")

    def accumulate(
        self, replies: list[Message], weights: np.ndarray, extras: list[dict[str, float]]
    ) -> tuple[agg.WeightedModelSum, list[Message]]:
        """S = sum r_k w_k over the replies whose arrays are finite (the others are logged)."""
        acc, accepted = agg.WeightedModelSum(), []
        for reply, weight, extra in zip(replies, weights, extras):
            arrays = _to_numpy(reply.content[C.ARRAYS])
            bad_key = agg.all_finite(arrays)
            if bad_key is not None:
                log(WARNING, "Reply from node %d rejected: array '%s' has NaN or Inf",
                    reply.metadata.src_node_id, bad_key)
                continue
            if self._drift is not None:
                self._drift.add(arrays)
            acc.add(arrays, float(weight), owned=True, **extra)
            accepted.append(reply)
        return acc, accepted

    def client_weights(self, replies: list[Message]) -> tuple[np.ndarray, list[dict[str, float]]]:
        """Raw weights r_k of the configured scheme (c_k is proportional to r_k)."""
        nodes = [r.metadata.src_node_id for r in replies]
        n = np.array([float(r.content[C.METRICS][C.NUM_EXAMPLES]) for r in replies])
        if self.weighting in ("examples", "pre-erratum"):
            raw = n
        elif self.weighting == "uniform":
            raw = np.ones(len(replies))
        elif self.weighting == "scheme-i":
            raw = np.array([float(self.draws.get(node, 1)) for node in nodes])
        else:  # scheme-ii: p_k N
            shares = self.data_shares(self.all_nodes)
            raw = np.array([shares[self.all_nodes.index(node)] for node in nodes]) * len(self.all_nodes)
        if self.weighting == "pre-erratum":  # a node's size is known from its reply
            for node, n_k in zip(nodes, n):
                self.clients.setdefault(node, ClientInfo()).num_examples = int(n_k)
        return raw, [{} for _ in replies]

    def new_arrays(self, server_round: int, acc: agg.WeightedModelSum, planned: float) -> agg.NDArrays:
        """w + eta_g sum c_k (w_k - w) with c_k of the weighting, over the accepted replies.

        The replies were added with r_k / planned, so c_k = scale * (r_k / planned).
        """
        if self.weighting == "pre-erratum":  # c_k = n_k / n over all clients
            scale = planned / self.total_examples()
        elif self.weighting == "scheme-ii":  # c_k = p_k N / K' over the K' replies
            scale = planned / acc.count
        else:  # renormalised over the accepted replies
            scale = 1.0 / acc.total
        return acc.update(_to_numpy(self.current_arrays), scale, self.server_lr)

    def accept_reply(self, reply: Message) -> bool:
        """True if the reply can be aggregated; else one log line saying why."""
        node = reply.metadata.src_node_id
        problem = self.reply_problem(reply)
        if problem:
            log(WARNING, "Reply from node %d rejected: %s", node, problem)
            return False
        return True

    def reply_problem(self, reply: Message) -> str | None:
        """What is wrong with a reply, or None."""
        if reply.has_error():
            return f"client error: {reply.error.reason}"
        content = reply.content
        if C.ARRAYS not in content or C.METRICS not in content:
            return f"needs an ArrayRecord '{C.ARRAYS}' and a MetricRecord '{C.METRICS}'"
        metrics = content[C.METRICS]
        n = metrics.get(C.NUM_EXAMPLES)
        if n == 0 and not isinstance(n, bool):
            return f"'{C.NUM_EXAMPLES}' is 0 (an empty partition?): nothing to aggregate, skipped"
        if (not isinstance(n, (int, float)) or isinstance(n, bool) or not math.isfinite(n)
                or n <= 0 or n != int(n)):
            return f"'{C.NUM_EXAMPLES}' must be a positive integer, got {n!r}"
        for key, value in metrics.items():
            values = value if isinstance(value, list) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                return f"metric '{key}' is NaN or Inf ({value!r})"
        expected = self.current_arrays
        arrays = content[C.ARRAYS]
        if set(arrays.keys()) != set(expected.keys()):
            missing = sorted(set(expected.keys()) - set(arrays.keys()))
            extra = sorted(set(arrays.keys()) - set(expected.keys()))
            return f"array keys differ from the global model's (missing {missing}, unexpected {extra})"
        for key, array in arrays.items():
            ref = expected[key]
            if tuple(array.shape) != tuple(ref.shape) or array.dtype != ref.dtype:
                return f"array '{key}' is {array.dtype}{tuple(array.shape)}, expected {ref.dtype}{tuple(ref.shape)}"
        return None  # NaN / Inf are found while aggregating, without a second deserialisation


def _check_fraction(name: str, value: float, allow_zero: bool) -> None:
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value <= 1):
        allowed = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must be in {allowed}, got {value}")


def _to_numpy(record: ArrayRecord) -> agg.NDArrays:
    return {key: array.numpy() for key, array in record.items()}


def _to_record(arrays: agg.NDArrays) -> ArrayRecord:
    return ArrayRecord({key: Array(value) for key, value in arrays.items()})


def _mean_metrics(replies: list[Message]) -> dict[str, float]:
    """num-examples-weighted mean of every scalar metric all replies share."""
    records = [r.content[C.METRICS] for r in replies]
    weights = [float(m[C.NUM_EXAMPLES]) for m in records]
    shared = set(records[0].keys()).intersection(*[set(m.keys()) for m in records[1:]])
    out: dict[str, float] = {}
    for key in sorted(shared - {C.NUM_EXAMPLES, C.PARTITION_ID}):
        values = [m[key] for m in records]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = agg.weighted_mean(values, weights)
    out[C.NUM_EXAMPLES] = float(sum(weights))
    return out

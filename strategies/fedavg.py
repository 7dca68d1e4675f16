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
        full = [self.full_local_steps(n, config) for n in chosen]
        self.straggler_work = {n: int(s) for n, s in zip(chosen, agg.straggler_steps(rng, full))}
        return self.straggler_work

    def full_local_steps(self, node_id: int, config: ConfigRecord) -> int:
        """tau_i of a non-straggler: ``local-steps`` if set, else floor(E n_i / B)."""
        steps = int(config.get(C.LOCAL_STEPS, 0))
        if steps > 0:
            return steps
        epochs = int(config.get(C.LOCAL_EPOCHS, 1))
        n = self.clients.get(node_id, ClientInfo()).num_examples
        if not n:
            return max(epochs, 1)
        return max(agg.steps_for_epochs(n, int(config.get(C.BATCH_SIZE, 0)), epochs), 1)

    def node_config(self, node_id: int, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """The ConfigRecord sent to one node; subclasses add per-client keys.

        A straggler's record asks for its reduced number of local steps.
        """
        if node_id not in self.straggler_work:
            return config
        own = ConfigRecord(dict(config))
        own[C.LOCAL_STEPS] = self.straggler_work[node_id]
        return own

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies one by one, then apply the weighting scheme's update."""
        replies = list(replies)
        good = [r for r in replies if self.accept_reply(r)]
        diag = self.diagnostics.setdefault(server_round, {})
        diag["clients-received"] = len(good)
        diag["clients-failed"] = len(self.draws) - len(good)
        steps = [r.content[C.METRICS][C.LOCAL_STEPS_TAKEN] for r in good
                 if C.LOCAL_STEPS_TAKEN in r.content[C.METRICS]]
        if steps:
            diag["local-steps"] = [int(s) for s in steps]
        diag["bytes-up"] = sum(r.content[C.ARRAYS].count_bytes() for r in good)
        if not good:
            log(WARNING, "Round %d: no usable reply, the global model is kept", server_round)
            return None, None
        new = self.aggregate_arrays(server_round, good)
        metrics = _mean_metrics(good)
        if C.TRAIN_LOSS in metrics or C.STOCK_TRAIN_LOSS in metrics:
            diag["train-loss"] = metrics.get(C.TRAIN_LOSS, metrics.get(C.STOCK_TRAIN_LOSS))
        return _to_record(new), MetricRecord(metrics)

    def aggregate_arrays(self, server_round: int, replies: list[Message]) -> agg.NDArrays:
        """The new global arrays from accepted replies (the weighting scheme's update)."""
        return agg.apply_update(
            _to_numpy(self.current_arrays), [_to_numpy(r.content[C.ARRAYS]) for r in replies],
            self.coefficients(replies), self.server_lr,
        )

    def coefficients(self, replies: list[Message]) -> np.ndarray:
        """c_k of the configured weighting, renormalised over the replies received."""
        nodes = [r.metadata.src_node_id for r in replies]
        n = [int(r.content[C.METRICS][C.NUM_EXAMPLES]) for r in replies]
        if self.weighting == "examples":
            return agg.coefficients_by_examples(n)
        if self.weighting == "uniform":
            return agg.coefficients_uniform(len(replies))
        if self.weighting == "scheme-i":
            return agg.coefficients_scheme_i([self.draws.get(node, 1) for node in nodes])
        if self.weighting == "scheme-ii":
            shares = self.data_shares(self.all_nodes)
            p = [shares[self.all_nodes.index(node)] for node in nodes]
            return agg.coefficients_scheme_ii(p, len(self.all_nodes), len(replies))
        # pre-erratum: n over all clients; a node's size comes from its reply when known
        for node, n_k in zip(nodes, n):
            self.clients.setdefault(node, ClientInfo()).num_examples = n_k
        known = [self.clients.get(x, ClientInfo()).num_examples for x in self.all_nodes]
        sizes = [k for k in known if k]
        fill = float(np.mean(sizes)) if sizes else 0.0
        total = sum(k if k else fill for k in known)
        return agg.coefficients_pre_erratum(n, total)

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
        if (not isinstance(n, (int, float)) or isinstance(n, bool) or not math.isfinite(n)
                or n <= 0 or n != int(n)):
            return f"'{C.NUM_EXAMPLES}' must be a positive integer, got {n!r}"
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
            values = array.numpy()
            if np.issubdtype(values.dtype, np.floating) and not np.all(np.isfinite(values)):
                return f"array '{key}' has NaN or Inf"
        return None


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

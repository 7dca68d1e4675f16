"""The round plan: what ``configure_train`` decided and ``aggregate_train`` consumes.

The participation model (:mod:`strategies.engine.participation`) makes one :class:`RoundPlan`
per round: the global model w_t sent, the connected nodes, and one :class:`ClientTask`
per client sent work (its config, its draws, a straggler's reduced work). The strategy
then adds its own keys to each task's config and aggregates the replies against the same
plan; the round's :class:`~strategies.engine.round_report.RoundReport` travels with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord

from .round_report import RoundReport

__all__ = ["ClientTask", "RoundPlan"]


@dataclass(frozen=True)
class ClientTask:
    """One client's work in a round.

    ``config`` is what the node is sent (the round's config with a straggler's reduced
    ``local-steps`` / ``local-epochs``, plus the strategy's own keys once it has added
    them); ``draws`` how often the client was drawn (Li et al. 2020, Scheme I: can be > 1);
    ``reduced_work`` the steps (or epochs) of a straggler, None for full work.
    """

    node_id: int
    partition_id: int | None
    config: ConfigRecord
    draws: int = 1
    reduced_work: int | None = None

    def with_config(self, config: ConfigRecord) -> ClientTask:
        """The same task sending ``config``."""
        return ClientTask(self.node_id, self.partition_id, config, self.draws,
                          self.reduced_work)


@dataclass
class RoundPlan:
    """Round ``server_round``: w_t (``arrays``), the round's common ``config``, the
    connected ``nodes`` (sorted by partition id) and the ``tasks`` by node id.

    ``straggler_work`` maps each selected straggler to its reduced work (0: none fits the
    deadline), those not sent work included; ``bytes_down`` / ``bytes_up`` are what the
    clock expects each client to move; ``deadline_dropped`` the sampled clients not sent
    work because nothing of it fits the round's deadline; ``close_after`` the m replies
    an over-committed round closes at (None: it waits for all); ``sub_models`` the
    (indices, arrays) of the sub-model each node was sent, in a round of sub-models
    (:mod:`strategies.engine.submodels`); ``dropped_out`` the clients sent work that drop
    out before replying -> the fraction of their time at which they drop (None: the clock
    drops nobody; :meth:`strategies.engine.participation.Participation.dropouts`).
    """

    server_round: int
    arrays: ArrayRecord
    config: ConfigRecord
    nodes: tuple[int, ...]
    tasks: Mapping[int, ClientTask]
    sampled: int = 0
    straggler_work: Mapping[int, int] = field(default_factory=dict)
    unavailable: int | None = None
    deadline_dropped: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    close_after: int | None = None
    report: RoundReport = field(default=None)  # type: ignore[assignment]
    sub_models: Mapping[int, tuple[Mapping, Mapping[str, np.ndarray]]] | None = None
    dropped_out: Mapping[int, float] | None = None

    def __post_init__(self) -> None:
        if self.report is None:
            self.report = RoundReport(self.server_round)

    @property
    def stragglers(self) -> int:
        """How many selected clients were stragglers this round."""
        return len(self.straggler_work)

    def sent_arrays(self, node_id: int) -> ArrayRecord | Mapping[str, np.ndarray] | None:
        """What node ``node_id``'s reply must match: the model sent to it (w_t, or its own
        sub-model when the round sends sub-models; None when it was sent none)."""
        if self.sub_models is None:
            return self.arrays
        sent = self.sub_models.get(node_id)
        return None if sent is None else sent[1]

    def client_key(self, node_id: int) -> str:
        """A sent client's key in cross-round tables: its partition id, else ``node-<id>``
        (:func:`strategies.engine.records.client_key`)."""
        task = self.tasks.get(node_id)
        pid = task.partition_id if task is not None else None
        return str(pid) if pid is not None else f"node-{node_id}"

    def sent(self, node_id: int) -> ConfigRecord:
        """The config node ``node_id`` was sent (empty if it was sent no work)."""
        task = self.tasks.get(node_id)
        return task.config if task is not None else ConfigRecord()

    @classmethod
    def of_sent(cls, server_round: int, arrays: ArrayRecord,
                sent: Mapping[int, ConfigRecord | Mapping],
                partition_ids: Mapping[int, int] | None = None,
                draws: Mapping[int, int] | None = None,
                nodes: tuple[int, ...] | None = None) -> RoundPlan:
        """The plan of a round in which ``arrays`` were sent to the nodes of ``sent`` with
        their configs: what aggregating replies to a known send needs (tools, tests)."""
        pids = partition_ids or {}
        tasks = {node: ClientTask(node, pids.get(node), ConfigRecord(dict(config)),
                                  (draws or {}).get(node, 1))
                 for node, config in sent.items()}
        return cls(server_round, arrays, ConfigRecord(), tuple(nodes or sorted(sent)), tasks,
                   sampled=len(tasks))

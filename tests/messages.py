"""Helpers to build Flower records and messages in tests (outside a running task)."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from strategies import contract as C


def record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


def numpy_of(rec: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: a.numpy() for k, a in rec.items()}


def instruction(node: int) -> Message:
    return Message(
        content=RecordDict({C.CONFIG: ConfigRecord({C.SERVER_ROUND: 1})}),
        message_type=MessageType.TRAIN,
        dst_node_id=node,
    )


class Prepared:
    """A strategy plus the plan of a round whose messages were sent: ``aggregate_train(r,
    replies)`` aggregates the replies against that plan (``strategy.aggregate_round``), the
    rest is the strategy's. What a test that builds replies by hand needs instead of
    running ``configure_train``."""

    def __init__(self, strategy, plan) -> None:
        self.strategy, self.plan = strategy, plan

    def aggregate_train(self, server_round: int, replies):
        self.plan.server_round = server_round
        self.plan.report.server_round = server_round
        self.strategy.reports[server_round] = self.plan.report
        return self.strategy.aggregate_round(self.plan, replies)

    def __getattr__(self, name: str):
        return getattr(self.strategy, name)

    def __setattr__(self, name: str, value) -> None:
        if name in ("strategy", "plan"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.strategy, name, value)


def prepared_round(strategy, global_arrays: dict, sent: dict, *, draws: dict | None = None,
                   nodes: list[int] | None = None) -> Prepared:
    """``strategy`` with the plan of a round that sent ``global_arrays`` to the nodes of
    ``sent`` (node -> the config it was sent); partition ids from the strategy's client
    table."""
    from strategies.engine.round_plan import RoundPlan

    clients = strategy.participation.clients
    plan = RoundPlan.of_sent(1, record(global_arrays), sent,
                             {n: i.partition_id for n, i in clients.items()
                              if i.partition_id is not None},
                             draws=draws, nodes=tuple(nodes) if nodes is not None else None)
    return Prepared(strategy, plan)

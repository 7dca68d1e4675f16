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

"""The client-info query: the facts a strategy samples, weights and groups clients by.

fedhetero's strategies send every new node one QUERY message whose config says
``query = "client-info"``; the reply's MetricRecord carries the node's partition id
(reproducible, partition-keyed sampling), its number of examples (p_k = n_k / n) and,
for DynamicFL's DynaComm (Le et al., Eq. 1), its label histogram and optional byte budget.
A ClientApp answers it in three lines::

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return client_info_reply(msg, partition_id=..., num_examples=...)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from flwr.app import Message, MetricRecord, RecordDict

from .. import contract as C
from ..engine.records import sent_config


def is_client_info_query(msg: Message) -> bool:
    """True when ``msg`` is a strategy's client-info query (its config has ``query``)."""
    return (sent_config(msg.content) or {}).get(C.QUERY) == C.QUERY_CLIENT_INFO


def label_counts(y: Any, num_classes: int) -> list[int]:
    """The label histogram (length ``num_classes``) that a query reply sends.

    ``y``: the local labels (a torch tensor, a numpy array or a list of ints).
    """
    import numpy as np  # noqa: PLC0415

    if hasattr(y, "detach"):  # a torch tensor
        y = y.detach().cpu().numpy()
    labels = np.asarray(y, dtype=np.int64).ravel()
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), "
                         f"got [{labels.min()}, {labels.max()}]")
    return [int(c) for c in np.bincount(labels, minlength=num_classes)]


def client_info_reply(
    msg: Message,
    *,
    partition_id: int,
    num_examples: int,
    label_counts: Sequence[int] | None = None,
    comm_budget: float | None = None,
) -> Message:
    """The reply to a strategy's client-info query (``@app.query()``).

    Parameters
    ----------
    msg
        The received query message.
    partition_id
        This node's data partition (``context.node_config["partition-id"]``).
    num_examples
        Size of the local training set (the weight n_k).
    label_counts
        Optional label histogram, one count per class (needed by DynamicFL);
        :func:`strategies.client.info.label_counts` computes it.
    comm_budget
        Optional bytes per round this node can move (DynamicFL's tau_m, budget mode).

    Returns
    -------
    Message
        A reply whose MetricRecord ``"metrics"`` has ``partition-id``, ``num-examples`` and,
        when given, ``label-counts`` and ``comm-budget``.
    """
    config = sent_config(msg.content)
    asked = config.get(C.QUERY) if config is not None else None
    if asked is not None and asked != C.QUERY_CLIENT_INFO:
        raise ValueError(f"client_info_reply answers the '{C.QUERY}={C.QUERY_CLIENT_INFO}' query; "
                         f"this message asks '{C.QUERY}={asked}'")
    if int(num_examples) < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    metrics = MetricRecord({C.PARTITION_ID: int(partition_id), C.NUM_EXAMPLES: int(num_examples)})
    if label_counts is not None:
        counts = [int(c) for c in label_counts]
        if any(c < 0 for c in counts):
            raise ValueError(f"label_counts must be >= 0, got {counts}")
        metrics[C.LABEL_COUNTS] = counts
    if comm_budget is not None:
        budget = float(comm_budget)
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(f"comm_budget must be a finite number of bytes > 0, got {comm_budget}")
        metrics[C.COMM_BUDGET] = budget
    return Message(RecordDict({C.METRICS: metrics}), reply_to=msg)

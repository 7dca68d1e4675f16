"""FedLC's client side (Zhang et al., ICML 2022): the cross-entropy on logits calibrated by the
client's own label counts, for any training loop.

    counts = label_counts(train_labels, num_classes)      # once: n_{k,y} of this client
    loss = calibrated_loss(model(x), y, counts, tau)      # tau = config["fedlc-tau"]

:class:`LogitCalibration` is the same loss on the one local-SGD loop (the fedhetero
ClientApp finds it from the message's ``fedlc-tau``). torch is imported inside the helpers.
"""

from __future__ import annotations

from typing import Any

from flwr.app import Message

from .. import contract as C
from ..algorithms.fedlc import FEDLC_TAU
from ..engine.records import sent_config
from .sides import ClientSide, register_client_side

__all__ = ["LogitCalibration", "ZERO_COUNT", "calibrated_loss", "is_fedlc_message"]

ZERO_COUNT = 1e-8  # a label the client lacks (FL-bench's): its logit is pulled down by 100 tau


def is_fedlc_message(msg: Message) -> bool:
    """True when a train message's config carries ``fedlc-tau`` (a FedLC server)."""
    return FEDLC_TAU in (sent_config(msg.content) or {})


def calibrated_loss(logits: Any, y: Any, counts: Any, tau: float) -> Any:
    """The mean cross-entropy of ``logits - tau n^(-1/4)`` (n = ``counts``, this client's label
    counts, ``ZERO_COUNT`` for a label it lacks) at the labels ``y``."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812

    n = torch.as_tensor(counts, dtype=logits.dtype, device=logits.device).clamp_min(ZERO_COUNT)
    return F.cross_entropy(logits - tau * n.pow(-0.25), y)


class LogitCalibration:
    """FedLC's loss on the one local-SGD loop, for one train message: ``tau`` from its config,
    the label counts of ``labels`` (the client's whole training set), counted once."""

    def __init__(self, msg: Message, labels: Any) -> None:
        if not is_fedlc_message(msg):
            raise ValueError(f"not a FedLC train message: its config has no '{FEDLC_TAU}'")
        self.tau = float(msg.content[C.CONFIG][FEDLC_TAU])
        self.labels, self.counts = labels, None

    def loss_fn(self, logits: Any, y: Any) -> Any:
        """:func:`calibrated_loss` with this client's counts."""
        import torch  # noqa: PLC0415

        if self.counts is None:
            self.counts = torch.bincount(self.labels.reshape(-1).long(),
                                         minlength=logits.shape[-1])
        return calibrated_loss(logits, y, self.counts, self.tau)


register_client_side(ClientSide(
    "strategies.client.fedlc.LogitCalibration", is_fedlc_message,
    hook=lambda task: LogitCalibration(task.msg, task.y)))

"""FedLC (Zhang, Li, Li, Xu, Wu, Ding and Wu, "Federated Learning with Label Distribution Skew
via Logits Calibration", ICML 2022): FedAvg whose clients train with a loss calibrated by
their own label counts.

Client k subtracts tau n_{k,y}^(-1/4) from the logit of every class y before the softmax
cross-entropy (n_{k,y} its count of label y in its training set): the logits of its frequent
labels are pulled down least, so the loss asks for a margin in favour of its rare labels,
tau (n_{k,y}^(-1/4) - n_{k,j}^(-1/4)) between the true class y and any other j. The server
is FedAvg's and sends tau (``fedlc-tau``); the client side is
:class:`strategies.client.fedlc.LogitCalibration` (:func:`strategies.client.fedlc.
calibrated_loss`). Where the sources differ: a transcription of the paper's loss (FL-bench
issue #5; the paper's text was not available here) sums the softmax denominator over the
classes j != y, which is unbounded below and reported to collapse; every public
implementation (FL-bench, FedDecorr, PFLlib, Flower's baseline) sums over all classes, as
this one does. A label the client lacks counts 1e-8 (FL-bench's choice: its logit is pulled
down by 100 tau). The paper gives no tau; 1.0 is FL-bench's and PFLlib's default.
"""

from __future__ import annotations

import math

from ..engine.algorithm import Algorithm, Contract, Outgoing
from ..engine.keys import Key, at_least
from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.round_plan import RoundPlan

__all__ = ["FEDLC_TAU", "FedLC", "LabelCalibration"]

FEDLC_TAU = "fedlc-tau"  # server -> client, ConfigRecord "config": float tau >= 0


class LabelCalibration(Algorithm):
    """FedLC's algorithm: tau beside the model, FedAvg's update."""

    name = "FedLC"
    contract = Contract(helper="strategies.client.fedlc.calibrated_loss")

    def __init__(self, tau: float = 1.0) -> None:
        if isinstance(tau, bool) or not (isinstance(tau, (int, float)) and math.isfinite(tau)
                                         and tau >= 0):
            raise ValueError(f"FedLC's tau must be a finite number >= 0 (0: FedAvg), got {tau!r}")
        self.tau = float(tau)

    def send(self, plan: RoundPlan) -> Outgoing:
        """tau of the calibration, to every client."""
        return Outgoing(common={FEDLC_TAU: self.tau})


class FedLC(RoundEngine):
    """FedLC: FedAvg's server, clients trained with the label-count-calibrated loss.

    Parameters
    ----------
    tau : float
        tau >= 0 of the calibration tau n_{k,y}^(-1/4) (1.0: FL-bench's and PFLlib's
        default; the paper gives none); 0 is FedAvg.
    **kwargs
        As :class:`~strategies.engine.round_engine.RoundEngine`.

    Contract
    --------
    Sends ``fedlc-tau`` in every train config; the client computes its label counts once and
    trains with :func:`strategies.client.fedlc.calibrated_loss` (the ClientApp's loss, or
    :class:`strategies.client.fedlc.LogitCalibration` on the one local-SGD loop); replies as
    Flower's template. A stock ClientApp ignores tau and runs FedAvg.
    """

    def __init__(self, *flower_args, tau: float = 1.0, **kwargs) -> None:
        super().__init__(*flower_args, algorithm=LabelCalibration(tau), **kwargs)


register("fedlc", FedLC, "FedLC (Zhang et al. 2022): client loss calibrated by its label counts "
         "(client helper)", client_side="strategies.client.fedlc",
         keys=(Key("fedlc-tau", 1.0, "FedLC's τ: client k trains with cross-entropy on the "
                   "logits z_y − τ·n_{k,y}^(−1/4) (0 = FedAvg; 1.0: FL-bench's default, the "
                   "paper gives none)", interval=at_least(0.0), arg="tau"),))

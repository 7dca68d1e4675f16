"""What the task trains with: the device, and the optimiser built from a train message.

The local-SGD loop itself is :func:`strategies.client.local_sgd` (the one loop, with the
hooks of every strategy: FedProx's proximal term, SCAFFOLD's correction, FedDyn's linear
term, MOON's loss, DynamicFL's chunks, FedVeca's gradient capture). It lives in
``strategies.client`` because the helpers a user's ClientApp calls run it too, and
``strategies`` cannot import ``task`` (ARCHITECTURE.md, "Layers"). The app's ClientApp
(fedapp/client_app.py) is one such user: it builds :func:`sgd_optimizer` here, lets the
helpers wrap it, and hands it to the loop, as any ClientApp would with its own optimiser.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from strategies import contract as C

__all__ = ["resolve_device", "sgd_optimizer"]


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' picks CUDA when present, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def sgd_optimizer(model: torch.nn.Module, config: Mapping[str, Any], *, lr: float,
                  momentum: float = 0.0, weight_decay: float = 0.0) -> torch.optim.SGD:
    """``torch.optim.SGD`` over the model's parameters with the train config's ``lr``,
    ``momentum`` and ``weight-decay``; the keyword values where the config has none (the
    run config's, in the app)."""
    return torch.optim.SGD(model.parameters(), lr=float(config.get(C.LR, lr)),
                           momentum=float(config.get(C.MOMENTUM, momentum)),
                           weight_decay=float(config.get(C.WEIGHT_DECAY, weight_decay)))

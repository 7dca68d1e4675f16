"""An optimiser's per-parameter state as named arrays, to carry it from one message to the next.

DynamicFL cuts a client's round into chunks that arrive as separate messages (often in a
new process), and Algorithm 1 (Le et al.) runs the round's steps as one: the optimiser's
state (SGD's momentum buffers, Adam's moments and step counts, ...) must continue where
the previous chunk left it. :func:`optimizer_state_arrays` names every tensor of
``optimizer.state`` by parameter name and entry (``"features.0.weight/momentum_buffer"``),
which an ArrayRecord in ``Context.state`` can hold; :func:`load_optimizer_state` puts them
back into a fresh optimiser of the same kind through ``Optimizer.load_state_dict`` (which
casts each entry to its parameter's device and dtype as torch does for a checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

SEPARATOR = "/"  # between the parameter's name and the state entry (names use dots)


def optimizer_state_arrays(optimizer: Any, model: Any) -> dict[str, np.ndarray]:
    """Every tensor of ``optimizer.state``, keyed ``"<parameter name>/<entry>"`` (numpy, CPU).

    Raises ValueError for state that is not a tensor (nothing of torch's optimisers keeps
    any) or that belongs to a parameter ``model`` does not have.
    """
    import torch  # noqa: PLC0415  (lazy: strategies never needs torch at import)

    names = {id(p): name for name, p in model.named_parameters()}
    out: dict[str, np.ndarray] = {}
    for param, entries in optimizer.state.items():
        name = names.get(id(param))
        if name is None:
            raise ValueError("the optimizer keeps state for a parameter the model does not "
                             "have; build it over model.parameters()")
        for entry, value in entries.items():
            if value is None:
                continue
            if not torch.is_tensor(value):
                raise ValueError(f"optimizer state '{name}{SEPARATOR}{entry}' is a "
                                 f"{type(value).__name__}, not a tensor; it cannot be carried "
                                 f"between messages")
            out[f"{name}{SEPARATOR}{entry}"] = value.detach().cpu().numpy().copy()
    return out


def load_optimizer_state(optimizer: Any, model: Any, arrays: Mapping[str, Any]) -> None:
    """Replace the optimiser's state by ``arrays`` (from :func:`optimizer_state_arrays`).

    Raises ValueError naming the entry when it names a parameter the optimiser does not
    hold.
    """
    import torch  # noqa: PLC0415

    saved = optimizer.state_dict()
    ids = [i for group in saved["param_groups"] for i in group["params"]]
    held = [p for group in optimizer.param_groups for p in group["params"]]
    index = {id(p): i for p, i in zip(held, ids)}
    params = dict(model.named_parameters())
    state: dict[int, dict[str, Any]] = {}
    for key, value in arrays.items():
        name, _, entry = key.rpartition(SEPARATOR)
        param = params.get(name)
        if param is None or id(param) not in index:
            raise ValueError(f"optimizer state '{key}' names a parameter '{name}' this "
                             f"optimizer does not hold; carried state must come from an "
                             f"optimizer over the same model")
        state.setdefault(index[id(param)], {})[entry] = torch.from_numpy(np.array(value))
    saved["state"] = state
    optimizer.load_state_dict(saved)

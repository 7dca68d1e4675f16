"""Client state that survives across rounds: named arrays in Flower's ``Context.state``.

Strategies whose clients keep something between messages (DynamicFL's momentum across
chunks; SCAFFOLD's control variate c_i, Karimireddy et al. 2020; FedDyn's gradient
correction, Acar et al. 2021) keep it in ``context.state``, a RecordDict that Flower
keeps per node and run: in the simulation engine, in a deployed SuperNode (which starts
a new ClientApp process per message, so a module-level variable would be lost) and
across a resumed run of the same node. Arrays go into an ArrayRecord under ``key``, a
few scalars (e.g. the round they belong to) into a ConfigRecord under ``key + "-meta"``::

    c_i = load_arrays(context.state, "scaffold-c") or zeros_like_model()
    ...
    save_arrays(context.state, "scaffold-c", new_c_i, meta={"round": server_round})

Values are numpy arrays (torch tensors are accepted when saving and come back as numpy).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

META_SUFFIX = "-meta"


def meta_key(key: str) -> str:
    """The ConfigRecord key that holds ``key``'s scalars."""
    return key + META_SUFFIX


def _as_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(value)


def save_arrays(state: RecordDict, key: str, arrays: Mapping[str, Any],
                meta: Mapping[str, int | float | str | bool] | None = None) -> None:
    """Store named arrays (and optional scalars) in ``state`` under ``key``.

    An empty ``arrays`` removes ``key`` (and its scalars) instead, so a later
    :func:`load_arrays` returns None.
    """
    if not arrays:
        clear_arrays(state, key)
        return
    state[key] = ArrayRecord({name: Array(_as_numpy(value)) for name, value in arrays.items()})
    if meta is not None:
        state[meta_key(key)] = ConfigRecord(dict(meta))
    elif meta_key(key) in state:
        del state[meta_key(key)]


def load_arrays(state: RecordDict, key: str) -> dict[str, np.ndarray] | None:
    """The arrays stored under ``key`` (writable copies), or None when there are none."""
    if key not in state.array_records:
        return None
    return {name: np.array(array.numpy()) for name, array in state.array_records[key].items()}


def load_meta(state: RecordDict, key: str) -> dict[str, Any] | None:
    """The scalars stored with ``key``'s arrays, or None."""
    if meta_key(key) not in state.config_records:
        return None
    return dict(state.config_records[meta_key(key)])


def clear_arrays(state: RecordDict, key: str) -> None:
    """Forget ``key``'s arrays and scalars."""
    for name in (key, meta_key(key)):
        if name in state:
            del state[name]

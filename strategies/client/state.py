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

State the server must be able to restore (SCAFFOLD's c_i; FedDyn's and MOON's state use
the same path) goes through :func:`resolve_state` and :func:`save_state`, the client half
of :mod:`strategies.engine.client_states`: the server sends ``state-round`` with every train
message (and attaches its copy when it cannot be sure this node holds that version), so
the state survives a resumed run, a lost or rejected reply and a SuperNode restart::

    c_i, used = resolve_state(context.state, "scaffold-c-i", msg.content, initial=zeros)
    ...
    save_state(context.state, "scaffold-c-i", new_c_i, server_round)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from .. import contract as C
from ..engine.records import record_of, sent_arrays, sent_config

META_SUFFIX = "-meta"
ROUND = "round"  # the meta scalar saved by save_state: the round that produced the state


class ClientStateLost(RuntimeError):
    """The server expects state this node does not hold (e.g. the SuperNode restarted)."""


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
    record = record_of(state, key, ArrayRecord)
    if record is None:
        return None
    return {name: np.array(array.numpy()) for name, array in record.items()}


def load_meta(state: RecordDict, key: str) -> dict[str, Any] | None:
    """The scalars stored with ``key``'s arrays, or None."""
    record = record_of(state, meta_key(key), ConfigRecord)
    return None if record is None else dict(record)


def clear_arrays(state: RecordDict, key: str) -> None:
    """Forget ``key``'s arrays and scalars."""
    for name in (key, meta_key(key)):
        if name in state:
            del state[name]


def resolve_state(state: RecordDict, key: str, content: RecordDict,
                  initial: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
    """The state a train message asks for, and the round it belongs to.

    In this order (:mod:`strategies.engine.client_states`): the server's copy when the message
    carries one (ArrayRecord ``client-state``; it is installed in ``state``); the initial
    state when ``state-round`` is 0 (or absent); the state saved under ``key`` when its
    round equals ``state-round``.

    Raises
    ------
    ClientStateLost
        Otherwise: this node lost the state (a SuperNode restart) or holds another version.
        The reply becomes an error, and the server attaches its copy to the next message.
    """
    config = sent_config(content) or {}
    wanted = int(config.get(C.STATE_ROUND, 0))
    sent = sent_arrays(content, C.CLIENT_STATE)
    if sent is not None:
        arrays = {name: np.array(a.numpy()) for name, a in sent.items()}
        save_state(state, key, arrays, wanted)
        return arrays, wanted
    if wanted == 0:
        return {name: np.array(_as_numpy(v)) for name, v in initial.items()}, 0
    meta = load_meta(state, key)
    held = None if meta is None else int(meta.get(ROUND, -1))
    if held == wanted:
        return load_arrays(state, key), wanted
    have = "no state" if held is None else f"the state of round {held}"
    raise ClientStateLost(
        f"client state '{key}': the server expects the state of round {wanted}, but this "
        f"node's Context.state holds {have} (a SuperNode restart loses Context.state). This "
        f"reply is an error; the server attaches its copy to the next message to this client")


def save_state(state: RecordDict, key: str, arrays: Mapping[str, Any], server_round: int) -> None:
    """Keep ``arrays`` as the state produced by ``server_round`` (see :func:`resolve_state`)."""
    save_arrays(state, key, arrays, meta={ROUND: int(server_round)})

"""Client state that survives a resume, lost replies and SuperNode restarts: the server's
mirror (strategies.engine.client_states) and the client's resolve/save (strategies.client.state)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from strategies import contract as C
from strategies.client.state import (ClientStateLost, load_arrays, load_meta, resolve_state,
                                     save_state)
from strategies.engine.client_states import ClientStateMirror, must_attach, state_digest, state_problem


def state(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full(3, value, np.float32)}


def content(state_round: int, attached: dict | None = None) -> RecordDict:
    records = RecordDict({C.CONFIG: ConfigRecord({C.STATE_ROUND: state_round})})
    if attached is not None:
        records[C.CLIENT_STATE] = ArrayRecord({k: Array(v) for k, v in attached.items()})
    return records


# ----------------------------------------------------------------- the attach rule
@pytest.mark.parametrize("state_round, holder, node, attach", [
    (0, None, 5, False),  # the initial state: the client builds it
    (0, 7, 5, False),
    (3, 5, 5, False),     # the node whose accepted reply produced round 3
    (3, None, 5, True),   # unknown holder: after a resume, or after a failed message
    (3, 7, 5, True),      # another node now serves this partition
])
def test_must_attach(state_round, holder, node, attach):
    assert must_attach(state_round, holder, node) is attach


def test_mirror_round_trip_of_one_client():
    mirror = ClientStateMirror()
    assert mirror.message("0", 11) is None and mirror.state_round("0") == 0  # round 1: initial
    mirror.accept("0", 11, 1, state(1.0))
    mirror.end_round()
    assert mirror.state_round("0") == 1 and mirror.digest_of("0") == state_digest(state(1.0))
    assert mirror.message("0", 11) is None  # the same node holds round 1
    mirror.end_round()  # ... but its reply of round 2 was lost (crash, late, rejected)
    assert mirror.state_round("0") == 1
    attached = mirror.message("0", 11)  # so round 3 carries the copy
    assert attached is not None and np.array_equal(attached["w"], state(1.0)["w"])
    mirror.accept("0", 11, 3, state(3.0))
    mirror.end_round()
    assert mirror.message("0", 99) is not None  # a new node id for partition 0: attach


def test_mirror_state_dict_forgets_holders():
    mirror = ClientStateMirror()
    mirror.message("2", 5)
    mirror.accept("2", 5, 4, state(2.0))
    mirror.end_round()
    saved = mirror.state_dict()
    saved["arrays"]["2"]["w"][0] = 123.0  # a copy: the mirror is not touched
    assert mirror.state_of("2")["w"][0] == 2.0
    resumed = ClientStateMirror()
    resumed.load_state_dict(mirror.state_dict())
    assert resumed.state_round("2") == 4 and resumed.digest_of("2") == mirror.digest_of("2")
    assert resumed.message("2", 5) is not None  # a resumed server attaches on first contact
    with pytest.raises(ValueError, match="version"):
        resumed.load_state_dict({"version": 99})


def test_state_digest_sees_every_bit_key_and_dtype():
    base = state_digest(state(1.0))
    assert base == state_digest(state(1.0)) and 0 <= base < 2**63
    assert base != state_digest(state(np.nextafter(np.float32(1.0), np.float32(2.0))))
    assert base != state_digest({"v": state(1.0)["w"]})
    assert base != state_digest({"w": np.full(3, 1.0, np.float64)})


# ----------------------------------------------------------------- the client side
def test_resolve_round_zero_is_the_initial_state_even_over_old_local_state():
    local = RecordDict()
    save_state(local, "k", state(5.0), 4)
    arrays, used = resolve_state(local, "k", content(0), initial=state(0.0))
    assert used == 0 and not arrays["w"].any()


def test_resolve_uses_local_state_of_the_asked_round():
    local = RecordDict()
    save_state(local, "k", state(2.0), 2)
    arrays, used = resolve_state(local, "k", content(2), initial=state(0.0))
    assert used == 2 and arrays["w"][0] == 2.0
    assert load_meta(local, "k") == {"round": 2}


def test_resolve_installs_an_attached_copy():
    local = RecordDict()
    save_state(local, "k", state(9.0), 5)  # a newer state whose reply the server never accepted
    arrays, used = resolve_state(local, "k", content(4, attached=state(4.0)), initial=state(0.0))
    assert used == 4 and arrays["w"][0] == 4.0
    assert load_arrays(local, "k")["w"][0] == 4.0 and load_meta(local, "k") == {"round": 4}


@pytest.mark.parametrize("saved, says", [(None, "holds no state"), (3, "state of round 3")])
def test_resolve_raises_when_the_node_lost_the_state(saved, says):
    local = RecordDict()
    if saved is not None:
        save_state(local, "k", state(3.0), saved)
    with pytest.raises(ClientStateLost, match=says) as info:
        resolve_state(local, "k", content(4), initial=state(0.0))
    assert "round 4" in str(info.value) and "attaches its copy" in str(info.value)


def test_state_problem_names_the_round_or_the_digest():
    mirror = ClientStateMirror()
    mirror.accept("0", 5, 2, state(2.0))
    good = {C.STATE_ROUND_USED: 2, C.STATE_DIGEST: state_digest(state(2.0))}
    assert state_problem(mirror, "0", 2, good) is None
    assert state_problem(mirror, "0", 2, {}) is None  # both fields are optional
    assert "its state of round 1, the server's copy is of round 2" in state_problem(
        mirror, "0", 2, {**good, C.STATE_ROUND_USED: 1})
    assert "differs from the server's copy" in state_problem(
        mirror, "0", 2, {**good, C.STATE_DIGEST: state_digest(state(2.5))})
    assert state_problem(mirror, "1", 0, {C.STATE_ROUND_USED: 0, C.STATE_DIGEST: 7}) is None

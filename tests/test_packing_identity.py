"""Packed runs give the same numbers as unpacked ones: N = 6 virtual clients on 2
in-process SuperNodes against 6 SuperNodes, the ServerApp and ClientApp of the app, every
strategy family, with crash and late faults: bit-identical final models and run logs
(timings aside), round by round. Client state (SCAFFOLD, FedDyn, MOON, DynamicFL) follows
its client whichever worker serves it, and a packed run killed and resumed from its
checkpoint ends as the uninterrupted one."""

from __future__ import annotations

import pytest

from fedapp.checkpoint import load_checkpoint
from simulation.reliability import SimulatedKill, run_inprocess
from strategies import contract as C
from tests.reliability_common import config, resend_aside, run, same_model, without_timings

pytestmark = pytest.mark.usefixtures("processes")

FAMILIES = ["fedavg", "fedprox", "fednova", "fedveca", "scaffold", "feddyn", "moon",
            "dynamicfl", "fedbuff", "fedasync"]
VIRTUAL = 6
FAULTY = {"num-server-rounds": 4, "fault-crash-prob": 0.2, "fault-late-prob": 0.1, "seed": 1}
PACKED = {"virtual-clients": VIRTUAL}


@pytest.mark.parametrize("strategy", FAMILIES)
def test_a_packed_run_equals_the_unpacked_run_bit_for_bit(strategy, tmp_path):
    _, _, unpacked, unpacked_model = run(strategy, tmp_path / "unpacked", VIRTUAL, **FAULTY)
    grid, _, packed, packed_model = run(strategy, tmp_path / "packed", 2, **FAULTY, **PACKED)
    assert {node for node, _ in grid.calls} == set(grid.node_ids)  # both workers served
    assert len(unpacked) == FAULTY["num-server-rounds"] + 1
    for unpacked_round, packed_round in zip(without_timings(unpacked), without_timings(packed)):
        assert packed_round == unpacked_round
    assert same_model(packed_model, unpacked_model)
    failed = sum(r.get(C.LOG_CLIENTS_FAILED, 0) for r in unpacked)
    assert failed > 0  # the faults hit some virtual clients, and the same ones


CLOCKED = {"device-profiles": "lognormal", "round-deadline": 2.0, "over-commitment": 0.3,
           "fraction-train": 0.5}


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox"])
def test_deadlines_and_over_commitment_on_the_clock_are_the_same_packed(strategy, tmp_path):
    _, _, unpacked, unpacked_model = run(strategy, tmp_path / "u", VIRTUAL, **FAULTY, **CLOCKED)
    _, _, packed, packed_model = run(strategy, tmp_path / "p", 2, **FAULTY, **CLOCKED, **PACKED)
    assert without_timings(packed) == without_timings(unpacked)
    assert same_model(packed_model, unpacked_model)
    assert any(r.get(C.LOG_CLIENTS_LATE, 0) or r.get(C.LOG_CLIENTS_STRAGGLERS, 0)
               for r in unpacked[1:])  # the clock cut or left out someone


def test_a_packed_run_killed_and_resumed_equals_the_uninterrupted_one(tmp_path):
    rc = {**FAULTY, **PACKED, "checkpoint-every": 2}
    _, _, full_rounds, full_model = run("scaffold", tmp_path / "full", 2, **rc)
    with pytest.raises(SimulatedKill):
        run_inprocess(config("scaffold", tmp_path / "killed", **rc), 2, kill_after_round=3)
    killed = next((tmp_path / "killed").iterdir())
    assert load_checkpoint(killed)["round"] == 2
    _, _, resumed_rounds, resumed_model = run("scaffold", tmp_path / "resumed", 2,
                                              **rc, **{"resume-from": str(killed)})
    full, resumed = without_timings(full_rounds), without_timings(resumed_rounds)
    assert resend_aside(full, resumed, 3) > 0  # the server's copies of c_i are sent again
    assert resumed == full
    assert same_model(resumed_model, full_model)

"""A run with the simulated clock, killed and resumed from its checkpoint, logs the same
sim-seconds and sim-elapsed as an uninterrupted one (in-process, faults on, offline devices)."""

from __future__ import annotations

import pytest

from simulation.reliability import SimulatedKill, run_inprocess
from strategies import contract as C
from tests.reliability_common import config, run, same_model, without_timings

pytestmark = pytest.mark.usefixtures("processes")

CLOCKED = {"num-server-rounds": 4, "fault-crash-prob": 0.2, "seed": 1, "checkpoint-every": 2,
           "device-profiles": "lognormal", "device-availability": 0.8}
# partition 0's transfers alone take longer than these deadlines (seed 1's fleet)


@pytest.mark.parametrize("strategy, extra", [("fedprox", {"round-deadline": 0.9}),
                                             ("fedveca", {"round-deadline": 1.6}),
                                             ("dynamicfl", {}),
                                             ("fedavg", {"round-deadline": 1.6,
                                                         "server-momentum": 0.9})])
def test_resumed_clock_equals_uninterrupted(strategy, extra, tmp_path):
    _, _, full_rounds, full_model = run(strategy, tmp_path / "full", 3, **CLOCKED, **extra)
    assert all(r[C.LOG_SIM_SECONDS] > 0 for r in full_rounds[1:])
    killed = config(strategy, tmp_path / "killed", **CLOCKED, **extra)
    with pytest.raises(SimulatedKill):
        run_inprocess(killed, 3, kill_after_round=3)
    killed_dir = next((tmp_path / "killed").iterdir())
    _, _, resumed_rounds, resumed_model = run(strategy, tmp_path / "resumed", 3, **CLOCKED,
                                              **extra, **{"resume-from": str(killed_dir)})
    assert without_timings(resumed_rounds) == without_timings(full_rounds)
    assert same_model(resumed_model, full_model)

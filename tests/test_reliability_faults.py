"""Client faults injected by run config (fault-crash-prob, fault-late-prob, round-timeout),
for every registered strategy, on the in-process FaultGrid (virtual time: a late reply
arrives after the round timeout and is lost)."""

from __future__ import annotations

import pytest
import torch

from fedapp.faults import fault_of
from strategies import contract as C
from tests.reliability_common import ASYNC_STRATEGIES, SYNC_STRATEGIES, run, warnings_of

CRASH, LATE, NODES, ROUNDS = 0.3, 0.2, 4, 3


def expected_faults(server_round: int, seed: int = 0) -> dict[int, str]:
    return {pid: f for pid in range(NODES) if (f := fault_of(seed, server_round, pid, CRASH, LATE))}


def test_fault_draw_is_seeded_and_has_the_asked_rates():
    draws = [fault_of(3, r, p, 0.25, 0.15) for r in range(1, 201) for p in range(20)]
    assert draws == [fault_of(3, r, p, 0.25, 0.15) for r in range(1, 201) for p in range(20)]
    assert draws != [fault_of(4, r, p, 0.25, 0.15) for r in range(1, 201) for p in range(20)]
    assert abs(draws.count("crash") / len(draws) - 0.25) < 0.03
    assert abs(draws.count("late") / len(draws) - 0.15) < 0.03
    assert fault_of(3, 1, 0, 0.0, 0.0) is None and fault_of(3, 1, 0, 1.0, 0.0) == "crash"
    assert fault_of(3, 1, 0, 0.0, 1.0) == "late"


def test_this_seed_has_a_round_where_every_client_fails():
    # the runs below rely on it: round 2 of seed 0 loses all 4 clients
    assert len(expected_faults(2)) == NODES and 0 < len(expected_faults(1)) < NODES
    assert {"crash", "late"} <= set(expected_faults(2).values()) | set(expected_faults(3).values())


@pytest.mark.parametrize("strategy", SYNC_STRATEGIES)
@pytest.mark.usefixtures("processes")
def test_strategies_keep_going_count_failures_and_keep_the_model(strategy, tmp_path, caplog):
    grid, _, rounds, final = run(
        strategy,
        tmp_path,
        NODES,
        **{"num-server-rounds": ROUNDS, "fault-crash-prob": CRASH, "fault-late-prob": LATE},
    )
    assert [r["round"] for r in rounds] == list(range(ROUNDS + 1))
    for r in rounds[1:]:
        faults = expected_faults(r["round"])
        assert r[C.LOG_CLIENTS_FAILED] == len(faults), (r["round"], faults)
        assert r[C.LOG_MODEL_KEPT] is (len(faults) == NODES)
    kept = rounds[2]
    assert (
        kept[C.LOG_MODEL_KEPT]
        and kept["accuracy"] == rounds[1]["accuracy"]
        and kept["loss"] == rounds[1]["loss"]
    )
    assert any("Round 2: no usable reply" in m for m in warnings_of(caplog))
    assert rounds[3]["accuracy"] != rounds[2]["accuracy"]  # training resumes with the survivors
    assert all(torch.isfinite(v).all() for v in final.values() if v.is_floating_point())
    late = {(grid.contexts[n].node_config["partition-id"], r) for n, r in grid.late}
    assert late == {
        (p, r) for r in range(1, ROUNDS + 1) for p, f in expected_faults(r).items() if f == "late"
    }


@pytest.mark.parametrize("strategy", ASYNC_STRATEGIES)
@pytest.mark.usefixtures("processes")
def test_async_strategies_free_failed_clients_and_keep_making_updates(strategy, tmp_path):
    # every task of a faulty (round, partition) faults; round 2 loses all 4 partitions, so it
    # ends after 5 failures per concurrency slot: FedBuff keeps the model (its buffer is not
    # full), FedAsync keeps the mixes of the tasks sent in round 1 that came back
    grid, _, rounds, final = run(
        strategy, tmp_path, NODES,
        **{"num-server-rounds": ROUNDS, "fault-crash-prob": CRASH, "fault-late-prob": LATE,
           "async-concurrency": 2, "fedbuff-buffer-size": 2, "fedasync-updates-per-round": 2},
    )
    assert [r["round"] for r in rounds] == list(range(ROUNDS + 1))
    for r in rounds[1:]:
        faults = expected_faults(r["round"])
        assert faults or r[C.LOG_CLIENTS_FAILED] == 0  # a partition may not be asked at all
        assert r[C.LOG_MODEL_KEPT] is (len(faults) == NODES and (
            strategy == "fedbuff" or r[C.LOG_CLIENTS_RECEIVED] == 0)), (r, faults)
    lost = rounds[2]
    assert lost[C.LOG_CLIENTS_FAILED] == 5 * 2 and lost[C.LOG_CLIENTS_RECEIVED] < 2
    assert rounds[3][C.LOG_CLIENTS_RECEIVED] >= 1 and not rounds[3][C.LOG_MODEL_KEPT]
    assert all(torch.isfinite(v).all() for v in final.values() if v.is_floating_point())
    late_rounds = {r for _, r in grid.late}
    assert late_rounds <= {r for r in range(1, ROUNDS + 1)
                           if "late" in expected_faults(r).values()}


@pytest.mark.usefixtures("processes")
def test_fedveca_tau_table_only_moves_for_clients_that_replied(tmp_path):
    _, _, rounds, _ = run(
        "fedveca",
        tmp_path,
        NODES,
        **{
            "num-server-rounds": 5,
            "fault-crash-prob": CRASH,
            "fault-late-prob": LATE,
            "local-steps": 0,
        },
    )
    table = {}
    for r in rounds[1:]:
        failed = set(map(str, expected_faults(r["round"])))
        new = r.get(C.LOG_FEDVECA_TAU_TABLE, table)  # absent when nobody replied
        for key in failed:
            assert new.get(key) == table.get(key), (r["round"], key)
        sent = r[
            C.LOG_FEDVECA_TAU_SENT
        ]  # every sampled client was sent its current table entry (or tau_init)
        assert all(sent[k] == table.get(k, 2) for k in sent)
        table = dict(new)
    assert table, "no adaptive tau was ever computed"


@pytest.mark.usefixtures("processes")
def test_dynamicfl_client_lost_mid_round_schedule_continues(tmp_path, caplog):
    """Partition 1's *second* chunk of round 1 fails: the high-frequency schedule of the others
    continues, the round ends with a model averaged over the clients still in."""
    from flwr.app import Error, Message  # noqa: PLC0415

    calls = {"n": 0}

    def second_chunk_fails(msg, reply, context):
        if msg.metadata.message_type == "train" and context.node_config["partition-id"] == 1:
            calls["n"] += 1
            if calls["n"] == 2:
                return Message(Error(code=0, reason="device lost mid-round"), reply_to=msg)
        return reply

    grid, _, rounds, final = run(
        "dynamicfl",
        tmp_path,
        NODES,
        grid_kwargs={"reply_hook": second_chunk_fails},
        **{"num-server-rounds": 2, "dynamicfl-beta": 1.0},
    )
    assert rounds[1][C.LOG_CLIENTS_FAILED] == 1 and rounds[1][C.LOG_MODEL_KEPT] is False
    assert rounds[2][C.LOG_CLIENTS_FAILED] == 0
    assert any("device lost mid-round" in m for m in warnings_of(caplog))
    assert all(torch.isfinite(v).all() for v in final.values())

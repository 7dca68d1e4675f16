"""``python -m simulation bench packed-split``: a packed round in one process split into the
ServerApp's own work, the ClientApp calls and the training in them. The arithmetic and the
timers are ``unit``; one tiny real in-process run is ``app`` (its evaluation process)."""

from __future__ import annotations

import pytest

from simulation.bench.packed_split import round_split, run_split, split_line, timed_calls

RECORDS = [{"round": 0, "wall-seconds": 0.0}, {"round": 1, "wall-seconds": 9.0},
           {"round": 2, "wall-seconds": 2.0}, {"round": 3, "wall-seconds": 3.0},
           {"round": 4, "wall-seconds": 7.0}]


def test_the_split_averages_the_warm_rounds_and_leaves_out_the_first_and_the_last():
    calls = {"clientapp": [(1, 8.0), (2, 0.75), (2, 0.75), (3, 1.0), (3, 1.5), (4, 6.0)],
             "training": [(1, 5.0), (2, 1.0), (3, 2.0), (4, 5.0)]}
    split = round_split(RECORDS, calls)
    # rounds 2 and 3: wall 2 and 3, ClientApp calls 1.5 and 2.5, training 1 and 2
    assert split == {"round": 2.5, "clientapp": 2.0, "training": 1.5, "server": 0.5}
    assert split_line(1000, 16, split) == (
        "1000 clients, W=16: round 2.500 s = ClientApp calls 2.000 s (training 1.500 s) + the "
        "ServerApp's own work 0.500 s (0.50 ms per client)")


def test_a_run_log_without_a_warm_round_is_refused():
    with pytest.raises(ValueError, match="no warm round"):
        round_split(RECORDS[:3], {})


def test_the_timers_charge_each_call_to_the_round_in_flight_and_put_the_functions_back():
    import fedapp.client_app as client_app
    import fedapp.vectorised_share as share
    from simulation.reliability.grid import FaultGrid

    originals = (FaultGrid.deliver, share.vectorised_sgd, client_app.local_sgd)
    current = iter([2, 3])
    with timed_calls(lambda: next(current)) as calls:
        assert share.vectorised_sgd is not originals[1]
        with pytest.raises(ValueError, match="non-increasing"):
            share.vectorised_sgd(None, {}, None, [1, 2], lr=0.1)  # refused: still timed
        with pytest.raises(ValueError, match="non-increasing"):
            share.vectorised_sgd(None, {}, None, [], lr=0.1)
    assert (FaultGrid.deliver, share.vectorised_sgd, client_app.local_sgd) == originals
    assert [k for k, _ in calls["training"]] == [2, 3] and "clientapp" not in calls


@pytest.mark.usefixtures("processes")
def test_a_tiny_in_process_run_splits_its_warm_round():
    split = run_split(clients=6, workers=2, rounds=3, vectorised="on",
                      data_dir="/usr/share/datasets/fashion-mnist")
    assert split["round"] > 0 and 0 < split["training"] <= split["clientapp"] < split["round"]
    assert split["server"] == pytest.approx(split["round"] - split["clientapp"])

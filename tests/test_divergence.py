"""The divergence check: non-finite or tenfold test loss, one warning per run."""

from __future__ import annotations

import logging
import math

from fedapp.divergence import DivergenceWatch, divergence, likely_cause


def test_divergence_is_a_non_finite_loss_or_ten_times_the_best():
    assert divergence(float("nan"), 1.0) == "test loss is nan"
    assert divergence(math.inf, None) == "test loss is inf"
    assert divergence(10.0, 1.0) is None  # exactly tenfold is not yet
    assert divergence(10.5, 1.0) == "test loss 10.5 is 10x its best so far (1)"
    assert divergence(5.0, None) is None and divergence(5.0, 0.0) is None


def test_the_watch_names_the_round_and_the_values_once():
    watch = DivergenceWatch("the learning rate is too high")
    rounds = [(0, 2.3), (1, 0.5), (2, None), (3, 0.4), (4, 4.5), (5, float("nan"))]
    found = [watch.check({"round": r, **({} if loss is None else {"loss": loss})})
             for r, loss in rounds]
    assert found[:4] == [None, None, None, None] and found[5] is None  # once per run
    assert found[4] == "round 4: test loss 4.5 is 11x its best so far (0.4), best in round 3"
    assert watch.warning(found[4]) == (
        "The run is diverging: round 4: test loss 4.5 is 11x its best so far (0.4), best in "
        "round 3. Likely cause: the learning rate is too high")


def test_a_nan_in_the_first_evaluation_is_divergence():
    watch = DivergenceWatch()
    assert watch.check({"round": 0, "loss": float("nan")}) == "round 0: test loss is nan"


def test_the_likely_cause_fits_the_strategy():
    plain = likely_cause("fedavg", 0.5)
    assert plain.startswith("the learning rate is too high (lr = 0.5") and "trust gate" in plain
    assert "tau_eff" not in likely_cause("fednova", 0.1)
    assert likely_cause("fednova", 0.1, cut_work=True).startswith("FedNova scales")
    assert "server-lr = 3" in likely_cause("fedadam", 0.1, server_lr=3.0)


def test_the_serverapp_warns_once_where_it_logs_the_rounds(tmp_path, caplog):
    from fedapp.run_log import RunLog
    from fedapp.server_app import ServerEvaluator

    log = RunLog.create(tmp_path, "fedavg", 1, {"run-config": {}})
    evaluator = ServerEvaluator(None, None, log)
    evaluator.divergence.cause = likely_cause("fedavg", 0.5)
    with caplog.at_level(logging.WARNING):
        for server_round, loss in enumerate([2.3, 0.2, 2.5, float("inf")]):
            evaluator.finish({"round": server_round, "loss": loss}, None, None, None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["The run is diverging: round 2: test loss 2.5 is 12x its best so far "
                        "(0.2), best in round 1. Likely cause: " + likely_cause("fedavg", 0.5)]

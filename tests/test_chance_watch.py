"""A run that stays at chance says so once, with the likely cause (#58 item 2: the HeteroFL
command of docs/strategies/width.md ended at 0.10 accuracy with no warning)."""

from __future__ import annotations

import logging

from fedapp.chance import EVALUATIONS, ChanceWatch, chance_cause


def records(accuracies):
    return [{"round": r, "accuracy": a} for r, a in enumerate(accuracies)]


def test_three_evaluations_at_chance_after_round_0_are_said_once():
    watch = ChanceWatch(10, "cause")
    said = [watch.check(r) for r in records([0.1, 0.1, 0.105, 0.09, 0.1, 0.1])]
    assert said[:3] == [None, None, None] and said[4:] == [None, None]
    assert said[3] == ("The run is at chance: test accuracy within 2% of 1/10 = 0.100 in rounds "
                       "1, 2, 3. Likely cause: cause") and EVALUATIONS == 3


def test_learning_resets_the_count_and_unevaluated_rounds_are_passed_over():
    watch = ChanceWatch(10)
    said = [watch.check(r) for r in records([0.1, 0.1, 0.1, 0.5, 0.1, 0.1])]
    assert said == [None] * 6
    assert watch.check({"round": 7}) is None  # not evaluated
    assert ChanceWatch(2).check({"round": 1, "accuracy": 0.51}) is None


def test_the_cause_names_the_scaler_for_heterofl_and_the_lr_for_every_run():
    assert "width-scaler='off'" in chance_cause("heterofl", 0.05, "auto")
    assert "width-scaler" not in chance_cause("fjord", 0.05, "auto")
    assert "width-scaler='off'" in chance_cause("fjord", 0.05, "on")
    assert chance_cause("fedavg", 0.5).startswith("the learning rate (lr = 0.5) is too high")


def test_the_serverapp_logs_it(tmp_path, caplog):
    from fedapp.run_log import RunLog  # noqa: PLC0415
    from fedapp.server_app import ServerEvaluator  # noqa: PLC0415

    evaluator = ServerEvaluator(None, None, RunLog.create(tmp_path, "fedavg", 1, {}))
    evaluator.at_chance = ChanceWatch(10, chance_cause("heterofl", 0.05))
    with caplog.at_level(logging.WARNING):
        for record in records([0.1, 0.1, 0.1, 0.1]):
            evaluator.finish(dict(record, loss=2.3), None, None, None)
    warned = [r.getMessage() for r in caplog.records if "at chance" in r.getMessage()]
    assert len(warned) == 1 and "width-scaler='off'" in warned[0]

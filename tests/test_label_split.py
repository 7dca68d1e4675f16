"""HeteroFL's and FedRolex's label split, as the authors' code runs it, against references
written here: the masked cross-entropy of HeteroFL's models (``out.masked_fill(label_mask ==
0, 0)``, then ``F.cross_entropy``), re-derived with numpy; the server's ``combine`` of
``src/fed.py`` (and FedRolex's ``resnet_server.py``), transcribed with dense per-entry sums
and counts in which a client adds its output-layer rows only for its labels; hostile label
masks cost only their reply; ``label_split=False`` keeps every row of every holder."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from fedapp.config import ConfigError, RunConfig
from fedapp.config_keys import BY_NAME, REGISTRATIONS
from fedapp.registry import constructor_arguments
from strategies import FedRolex, FjORD, HeteroFL
from strategies import contract as C
from strategies.client import local_sgd
from strategies.client.width import (LabelSplit, is_label_split_message, label_mask,
                                     masked_cross_entropy, sent_label_split)
from strategies.engine import submodel_math as sm
from strategies.engine.records import ClientContractError
from strategies.engine.robust import Median
from strategies.engine.submodels import SubModels, width_spec_of
from tests.inprocess import InProcessGrid, partition_facts
from tests.messages import numpy_of, record

# hidden dimension h of 4 units, 3 inputs, 3 classes: w2 / b2 are the output layer
SPEC = {"w1": (("h", 1), None), "b1": (("h", 1),), "w2": (None, ("h", 1)), "b2": (None,)}
UNITS, CLASSES = 4, 3


def global_model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": rng.normal(size=(UNITS, 3)).astype(np.float32),
            "b1": rng.normal(size=UNITS).astype(np.float32),
            "w2": rng.normal(size=(CLASSES, UNITS)).astype(np.float32),
            "b2": rng.normal(size=CLASSES).astype(np.float32)}


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


# ----------------------------------------------------------------- the reference
def kept_units(width: float, scheme: str, server_round: int) -> np.ndarray:
    """The hidden units a client of ``width`` holds, by hand: the first ceil(width K), or
    FedRolex's window from (round - 1) mod K."""
    n = math.ceil(width * UNITS)
    start = (server_round - 1) % UNITS if scheme == "rolling" else 0
    return (start + np.arange(n)) % UNITS


def authors_combine(w: dict[str, np.ndarray], clients: list[tuple], label_split: bool
                    ) -> dict[str, np.ndarray]:
    """``combine`` transcribed: per key a float64 sum and count over the global shape; each
    client (units, labels, its reply's arrays, weight) adds weight * value at the entries
    it holds, on the output layer only at the rows of its labels (``label_split``); entries
    with count > 0 become sum / count, the others keep w."""
    out = {}
    for key, value in w.items():
        total, count = np.zeros(value.shape), np.zeros(value.shape)
        for units, labels, arrays, weight in clients:
            sub = arrays[key].astype(np.float64)
            if key == "w1":
                rows, cols = units, np.arange(3)
            elif key == "w2":
                rows, cols = np.arange(CLASSES), units
            else:
                rows, cols = (units if key == "b1" else np.arange(CLASSES)), None
            if key in ("w2", "b2") and label_split:
                rows, sub = rows[labels], sub[labels]
            place = rows if cols is None else np.ix_(rows, cols)
            total[place] += weight * sub
            count[place] += weight
        new = value.astype(np.float64).copy()
        new[count > 0] = total[count > 0] / count[count > 0]
        out[key] = new.astype(value.dtype)
    return out


def labels_of(mask: list[int]) -> np.ndarray:
    return np.array([c for c, bit in enumerate(mask) if bit == 1])


MASKS = {0: [1, 0, 0], 1: [0, 1, 1], 2: [1, 1, 0], 3: [0, 0, 1]}


def client_app(replies: list, masks: dict = MASKS) -> ClientApp:
    """Partition p returns its sub-model plus a seeded draw per (round, p) and replies
    ``masks[p]`` when asked for the label split (no entry: no ``label-mask``); each reply is
    recorded as (round, p, width, arrays)."""
    app = ClientApp()
    app.query()(partition_facts)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        config = msg.content[C.CONFIG]
        rnd = int(config[C.SERVER_ROUND])
        rng = np.random.default_rng([rnd, pid])
        out = {k: (v + rng.normal(size=v.shape)).astype(v.dtype)
               for k, v in numpy_of(msg.content[C.ARRAYS]).items()}
        replies.append((rnd, pid, float(config[C.MODEL_WIDTH]), out))
        metrics = {C.NUM_EXAMPLES: 10 * (pid + 1)}
        if config.get(C.LABEL_SPLIT) and pid in masks:
            metrics[C.LABEL_MASK] = masks[pid]
        return Message(RecordDict({C.ARRAYS: record(out), C.METRICS: MetricRecord(metrics)}),
                       reply_to=msg)

    return app


def run(strategy, app, nodes: int = 4, rounds: int = 1) -> dict[str, np.ndarray]:
    result = strategy.start(InProcessGrid(app, nodes, {}), record(global_model()),
                            num_rounds=rounds, train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    return numpy_of(result.arrays)


def reference(replies: list, scheme: str, label_split: bool, masks: dict = MASKS,
              weighted: bool = False, left_out: tuple = ()) -> dict[str, np.ndarray]:
    """The rounds of ``replies`` by :func:`authors_combine` from the initial model."""
    w = global_model()
    for rnd in sorted({r for r, *_ in replies}):
        clients = [(kept_units(width, scheme, rnd), labels_of(masks.get(pid, [1] * CLASSES)),
                    arrays, 10.0 * (pid + 1) if weighted else 1.0)
                   for r, pid, width, arrays in replies if r == rnd and pid not in left_out]
        w = authors_combine(w, clients, label_split)
    return w


def kwargs(**extra):
    return {"query_client_info": True, "fraction_evaluate": 0.0, "width_spec": SPEC,
            "levels": (1.0, 0.5), **extra}


# ----------------------------------------------------------------- the server
def test_heterofl_averages_each_output_row_over_the_clients_holding_its_label():
    """Widths 1, 1/2, 1, 1/2 (fixed rule); labels {0}, {1, 2}, {0, 1}, {2}."""
    replies = []
    strategy = HeteroFL(**kwargs())
    new = run(strategy, client_app(replies))
    want = reference(replies, "static", label_split=True)
    for key in want:
        np.testing.assert_allclose(new[key], want[key], rtol=1e-6, atol=1e-6, err_msg=key)
    # by hand: row 2 of w2 is held by partitions 1 and 3 (label 2) on units 0-1 only, so its
    # units 2-3 keep w; row 0 by partitions 0 and 2 on every unit
    w, by = global_model(), {pid: arrays for _, pid, _, arrays in replies}
    np.testing.assert_array_equal(new["w2"][2, 2:], w["w2"][2, 2:])
    np.testing.assert_allclose(new["w2"][2, :2], (by[1]["w2"][2] + by[3]["w2"][2]) / 2,
                               rtol=1e-6)
    np.testing.assert_allclose(new["b2"][0], (by[0]["b2"][0] + by[2]["b2"][0]) / 2, rtol=1e-6)
    np.testing.assert_allclose(new["b1"][2:], (by[0]["b1"][2:] + by[2]["b1"][2:]) / 2,
                               rtol=1e-6)  # hidden units: every holder, whatever its labels
    # the authors' rule differs from counting every holder of a row
    every_row = reference(replies, "static", label_split=False)
    assert not np.allclose(new["b2"], every_row["b2"])


def test_fedrolex_rolls_its_windows_and_splits_the_labels_round_after_round():
    replies = []
    new = run(FedRolex(**kwargs()), client_app(replies), rounds=3)
    want = reference(replies, "rolling", label_split=True)
    assert {width for _, _, width, _ in replies} == {1.0, 0.5} and len(replies) == 12
    for key in want:
        np.testing.assert_allclose(new[key], want[key], rtol=1e-5, atol=1e-5, err_msg=key)


def test_example_weights_apply_to_the_rows_a_client_holds():
    replies = []
    new = run(HeteroFL(**kwargs(weighting="examples")), client_app(replies))
    want = reference(replies, "static", label_split=True, weighted=True)
    for key in want:
        np.testing.assert_allclose(new[key], want[key], rtol=1e-6, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("cls, scheme", [(HeteroFL, "static"), (FedRolex, "rolling")])
def test_the_option_off_averages_every_row_over_every_holder(cls, scheme):
    """label_split=False: no ``label-split`` sent, no mask needed, every row of a client's
    sub-model counts (fedhetero's behaviour before the label split)."""
    replies = []
    app = client_app(replies, masks={})
    strategy = cls(**kwargs(label_split=False))
    new = run(strategy, app, rounds=2)
    want = reference(replies, scheme, label_split=False)
    for key in want:
        np.testing.assert_allclose(new[key], want[key], rtol=1e-5, atol=1e-5, err_msg=key)
    assert strategy.round_log(2)[C.LOG_CLIENTS_RECEIVED] == 4
    msgs = strategy.configure_train(3, record(global_model()), ConfigRecord(),
                                    InProcessGrid(app, 4, {}))
    assert all(C.LABEL_SPLIT not in m.content[C.CONFIG] for m in msgs)
    assert not strategy.algorithm.label_split and strategy.algorithm.contract.metrics == ()


# ----------------------------------------------------------------- hostile masks
@pytest.mark.parametrize("mask, words", [
    ([1, 1], "has 2 entries, not one per class"),
    ([1, 1, 0, 1], "has 4 entries, not one per class"),
    ([1, 2, 0], "has entries other than 0 and 1"),
    ([1, -1, 0], "has entries other than 0 and 1"),
    ([0, 0, 0], "claims no label"),
    ([], "has 0 entries, not one per class"),
    ([1.0, 0.0, 1.0], "is not a list of ints"),
    (7, "is not a list of ints"),
    (None, "needs the metric 'label-mask'"),
])
def test_a_mask_that_does_not_fit_the_update_costs_only_its_reply(mask, words, caplog):
    masks = {**MASKS, 1: mask} if mask is not None else {p: m for p, m in MASKS.items()
                                                         if p != 1}
    replies = []
    strategy = HeteroFL(**kwargs())
    with caplog.at_level(logging.WARNING):
        new = run(strategy, client_app(replies, masks))
    lines = [r.getMessage() for r in caplog.records if "(partition 1) rejected" in r.getMessage()]
    assert len(lines) == 1 and words in lines[0], caplog.text
    if mask is not None:
        assert f"metric 'label-mask'={mask!r}" in lines[0]
        assert ("send one 0/1 entry per class (3, the rows of 'w2'), 1 for each label in the "
                "client's training data, at least one "
                "(strategies.client.width.label_mask(y, 3))") in lines[0]
    else:
        assert "strategies.client.width.LabelSplit" in lines[0]
    assert strategy.round_log(1)[C.LOG_CLIENTS_RECEIVED] == 3
    want = reference(replies, "static", label_split=True, left_out=(1,))
    for key in want:
        np.testing.assert_allclose(new[key], want[key], rtol=1e-6, atol=1e-6, err_msg=key)


def test_a_long_hostile_mask_is_shown_cut(caplog):
    with caplog.at_level(logging.WARNING):
        run(HeteroFL(**kwargs()), client_app([], {**MASKS, 1: [1] * 5000}))
    (line,) = [r.getMessage() for r in caplog.records if "(partition 1) rejected" in
               r.getMessage()]
    assert "has 5000 entries" in line and "..." in line and len(line) < 400


def test_clients_that_send_no_labels_stop_the_run_naming_the_helper():
    with pytest.raises(ClientContractError, match=r"round 1 lack the metric 'label-mask'.*"
                                                  r"strategies.client.width.LabelSplit"):
        run(HeteroFL(**kwargs()), client_app([], masks={}))


def test_what_the_label_split_cannot_honour_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"HeteroFL: robust=Median\(\) with label_split=True"
                                         r".*label_split=False \(run config: label-split = "
                                         r"false\) or robust=None"):
        HeteroFL(**kwargs(robust=Median()))
    assert FedRolex(**kwargs(robust=Median(), label_split=False)).robust == Median()
    with pytest.raises(ValueError, match=r"label_split='yes' must be True"):
        SubModels(label_split="yes")
    no_output = {"w1": SPEC["w1"], "b1": SPEC["b1"], "w2": (("h", 1), None)}
    shapes = {"w1": (4, 3), "b1": (4,), "w2": (4, 2)}
    with pytest.raises(ValueError, match=r"no parameter of the width spec has an unscaled "
                                         r"first axis.*label_split=False"):
        sm.output_layer(width_spec_of(no_output), shapes)
    two = sm.WidthSpec({"a": (None, "h"), "b": (None,)})
    with pytest.raises(ValueError, match=r"first axes differ: \{'a': 3, 'b': 2\}"):
        sm.output_layer(two, {"a": (3, 4), "b": (2,)})


def test_a_spec_without_an_output_layer_stops_at_round_one_before_any_client_trains():
    replies = []
    hidden_only = {"w1": SPEC["w1"], "b1": SPEC["b1"]}  # the output layer is not listed
    with pytest.raises(ValueError, match=r"unscaled first axis.*\(label_split=False\)"):
        run(HeteroFL(**kwargs(width_spec=hidden_only)), client_app(replies))
    assert replies == []


# ----------------------------------------------------------------- the pure math
def test_output_layer_is_the_unscaled_first_axis():
    keys, classes = sm.output_layer(width_spec_of(SPEC), {k: v.shape for k, v in
                                                         global_model().items()})
    assert keys == ("w2", "b2") and classes == 3


def test_label_rows_then_overlap_aggregate_is_the_authors_combine():
    """Three clients at widths 1, 1/2 and 1/4, static and rolling: the kernel the strategy
    calls equals the transcription."""
    w = global_model(1)
    rng = np.random.default_rng(5)
    spec, shapes = width_spec_of(SPEC), {k: v.shape for k, v in w.items()}
    for scheme, rnd in (("static", 1), ("rolling", 3)):
        clients, updates = [], []
        for width, mask in ((1.0, [0, 1, 0]), (0.5, [1, 1, 1]), (0.25, [1, 0, 1])):
            indices = sm.submodel_indices(spec, shapes, scheme, width, rnd - 1)
            arrays = {k: rng.normal(size=v.shape).astype(np.float32)
                      for k, v in sm.extract(w, indices).items()}
            updates.append((*sm.label_rows(indices, arrays, ("w2", "b2"), labels_of(mask)),
                            None))
            clients.append((kept_units(width, scheme, rnd), labels_of(mask), arrays, 1.0))
        new = sm.overlap_aggregate(w, updates)
        want = authors_combine(w, clients, label_split=True)
        for key in want:
            np.testing.assert_allclose(new[key], want[key], rtol=1e-6, err_msg=key)


def test_label_rows_composes_with_an_index_array_and_refuses_bad_labels():
    indices = {"out": (np.array([4, 2, 0]), slice(None))}
    arrays = {"out": np.arange(6, dtype=np.float32).reshape(3, 2)}
    held, sub = sm.label_rows(indices, arrays, ("out",), np.array([0, 2]))
    np.testing.assert_array_equal(held["out"][0], [4, 0])  # HeteroFL: param_idx[..][label]
    np.testing.assert_array_equal(sub["out"], [[0, 1], [4, 5]])
    for bad in ([3], [1, 1], [-1], [0.5]):
        with pytest.raises(ValueError, match=r"must be distinct ints in \[0, 3\)"):
            sm.label_rows(indices, arrays, ("out",), np.array(bad))
    with pytest.raises(ValueError, match="'gone' is not in the client's update"):
        sm.label_rows(indices, arrays, ("gone",), np.array([0]))


# ----------------------------------------------------------------- the client
def label_split_message(**config) -> Message:
    return Message(RecordDict({C.ARRAYS: ArrayRecord(), C.CONFIG: ConfigRecord(
        {C.MODEL_WIDTH: 1.0, C.LABEL_SPLIT: True, **config})}), dst_node_id=1,
        message_type="train")


def test_label_mask_marks_the_labels_of_the_data():
    assert label_mask(torch.tensor([3, 0, 3, 3]), 5) == [1, 0, 0, 1, 0]
    assert label_mask(np.array([], dtype=np.int64), 2) == [0, 0]
    with pytest.raises(ValueError, match=r"labels run from 0 to 5, outside \[0, 5\)"):
        label_mask(torch.tensor([0, 5]), 5)
    with pytest.raises(ValueError, match="num_classes=0 must be an int >= 1"):
        label_mask(torch.tensor([0]), 0)


def test_masked_cross_entropy_is_the_authors_masked_fill_then_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(6, 4, dtype=torch.float64)
    y = torch.tensor([0, 2, 2, 0, 2, 0])
    mask = [1, 0, 1, 0]
    z = logits.numpy()
    masked = np.where(np.array(mask, bool), z, 0.0)  # absent labels' logits are 0
    by_hand = np.mean(np.log(np.exp(masked).sum(axis=1)) - masked[np.arange(6), y.numpy()])
    assert masked_cross_entropy(logits, y, mask).item() == pytest.approx(by_hand, rel=1e-12)
    layer = torch.nn.Linear(5, 4)
    masked_cross_entropy(layer(torch.randn(6, 5)), y, mask).backward()
    assert torch.all(layer.weight.grad[[1, 3]] == 0) and torch.all(layer.bias.grad[[1, 3]] == 0)
    assert torch.all(layer.weight.grad[[0, 2]].abs().sum(dim=1) > 0)
    with pytest.raises(ValueError, match=r"mask has 3 entries but the logits have 4 classes"):
        masked_cross_entropy(logits, y, [1, 0, 1])


def test_label_split_on_the_loop_trains_only_the_rows_of_its_labels_and_replies_them():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    twin.load_state_dict(model.state_dict())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(12, 5), torch.tensor([0, 2] * 6)
    hook = LabelSplit(label_split_message(), y)
    result = local_sgd(model, x, y, batch_size=4, steps=3, seed=2, lr=0.1, loss_fn=hook.loss_fn)
    keep = torch.tensor([True, False, True, False])

    def by_hand(logits, labels):  # the authors' masked loss, written out
        return torch.nn.functional.cross_entropy(torch.where(keep, logits, 0.0), labels)

    want = local_sgd(twin, x, y, batch_size=4, steps=3, seed=2, lr=0.1, loss_fn=by_hand)
    assert result == want
    for key, value in model.state_dict().items():
        assert torch.equal(value, twin.state_dict()[key]), key
    after = model.state_dict()
    assert torch.equal(after["2.weight"][[1, 3]], before["2.weight"][[1, 3]])
    assert not torch.equal(after["2.weight"][[0, 2]], before["2.weight"][[0, 2]])
    reply = hook.finish(model, {C.NUM_EXAMPLES: 12})
    assert reply[C.METRICS][C.LABEL_MASK] == [1, 0, 1, 0]
    assert reply[C.METRICS][C.NUM_EXAMPLES] == 12 and set(reply[C.ARRAYS]) == set(after)


def test_the_client_side_refuses_what_it_cannot_honour():
    with pytest.raises(ValueError, match="no local step ran"):
        LabelSplit(label_split_message(), torch.tensor([0])).finish(torch.nn.Linear(1, 1), {})
    with pytest.raises(ValueError, match="not a label-split train message"):
        LabelSplit(label_split_message(**{C.LABEL_SPLIT: False}), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"config label-split='yes' must be True or False"):
        sent_label_split({C.LABEL_SPLIT: "yes"})
    assert is_label_split_message(label_split_message())
    assert not is_label_split_message(label_split_message(**{C.LABEL_SPLIT: False}))


# ----------------------------------------------------------------- the app's keys
def test_the_run_config_key_sets_the_argument_of_heterofl_and_fedrolex_only():
    key = BY_NAME["label-split"]
    assert key.default is True and key.used_by == ("heterofl", "fedrolex")
    on = RunConfig.from_user_config({"strategy": "heterofl"})
    off = RunConfig.from_user_config({"strategy": "fedrolex", "label-split": False})
    assert constructor_arguments(on, REGISTRATIONS["heterofl"])["label_split"] is True
    assert constructor_arguments(off, REGISTRATIONS["fedrolex"])["label_split"] is False
    assert "label_split" not in constructor_arguments(on, REGISTRATIONS["fjord"])
    assert REGISTRATIONS["heterofl"].client_side == "strategies.client.width"
    with pytest.raises(ConfigError, match="robust-aggregation = 'none' or label-split = false"):
        RunConfig.from_user_config({"strategy": "heterofl", "robust-aggregation": "median",
                                    "weighting": "uniform"})
    RunConfig.from_user_config({"strategy": "heterofl", "robust-aggregation": "median",
                                "weighting": "uniform", "label-split": False})
    assert FjORD(**kwargs()).submodels.label_split is False

"""The client side of HeteroFL, FjORD and FedRolex (strategies/client/width.py): the sent
width and levels, the strict load of a server-extracted sub-model, FjORD's ordered-dropout
steps against local_sgd and against a width-p model stepped by hand, and the ClientApp's
train / evaluate handlers on width messages."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

import fedapp.client_app as client_app
from strategies import contract as C
from strategies.client import (
    LocalResult,
    client_seed,
    is_width_message,
    local_sgd,
    ordered_dropout_sgd,
    sent_levels,
    sent_scaler,
    sent_width,
    width_model,
)
from strategies.client.width import label_mask, masked_cross_entropy
from strategies.engine.submodel_math import HiddenUnits, WidthSpec, extract, submodel_indices
from task.models import build_model, width_spec
from tests.test_data import write_tiny_fashion_mnist

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)


def cnn(width: float = 1.0, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("cnn-small", MNIST, 10, width=width)


def as_spec(name: str, shape: tuple) -> WidthSpec:
    return WidthSpec({key: tuple(None if e is None else HiddenUnits(*e) for e in entries)
                      for key, entries in width_spec(name, shape, 10).items()})


def numpy_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def sub_model(width: float, scheme: str = "static", rnd: int = 0) -> dict[str, np.ndarray]:
    """The server's sub-model of a seed-0 full-width cnn-small at ``width``."""
    params = numpy_state(cnn())
    indices = submodel_indices(as_spec("cnn-small", MNIST), {k: v.shape for k, v in
                                                             params.items()}, scheme, width, rnd)
    return extract(params, indices)


def width_message(arrays: dict, **config) -> Message:
    record = ArrayRecord({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()})
    return Message(RecordDict({C.ARRAYS: record, C.CONFIG: ConfigRecord(config)}),
                   dst_node_id=5, message_type=MessageType.TRAIN)


def same_bits(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(
        a[k].shape == b[k].shape and a[k].dtype == b[k].dtype
        and a[k].tobytes() == b[k].tobytes() for k in a)


def data(n: int, shape: tuple = MNIST, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g)


@pytest.fixture(autouse=True)
def task_identity():
    """Messages are built outside a running task (as the in-process Grids do)."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


# ----------------------------------------------------------------- sent width / levels
@pytest.mark.parametrize("config, width", [({}, 1.0), ({C.MODEL_WIDTH: 0.5}, 0.5),
                                           ({C.MODEL_WIDTH: 1}, 1.0),
                                           ({C.MODEL_WIDTH: 0.0625}, 0.0625)])
def test_sent_width(config, width):
    assert sent_width(config) == width and isinstance(sent_width(config), float)


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, True, "0.5", None, float("nan"), [0.5]])
def test_a_bad_width_names_the_key_the_value_and_the_fix(bad):
    with pytest.raises(ValueError) as err:
        sent_width({C.MODEL_WIDTH: bad})
    text = str(err.value)
    assert f"model-width={bad!r}" in text and "(0, 1]" in text and "send the client's" in text


def test_sent_scaler():
    assert sent_scaler({}) is False and sent_scaler({C.WIDTH_SCALER: True}) is True
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match=rf"width-scaler={bad!r} must be True or False"):
            sent_scaler({C.WIDTH_SCALER: bad})


@pytest.mark.parametrize("width, levels, expected", [
    (0.5, [0.5, 0.25, 0.125, 0.25], (0.125, 0.25, 0.5)),  # sorted, deduplicated
    (1.0, [1.0], (1.0,)),
    (1.0, [1, 0.5], (0.5, 1.0)),
    (0.3, [0.1, 0.1 + 0.2], (0.1, 0.3)),  # 0.30000000000000004 is r
    (0.3, [0.29999999999999993, 0.2], (0.2, 0.3)),
])
def test_sent_levels(width, levels, expected):
    config = {C.MODEL_WIDTH: width, C.WIDTH_LEVELS: levels}
    assert sent_levels(config) == expected
    assert sent_levels({C.MODEL_WIDTH: width}) is None


@pytest.mark.parametrize("width, levels, why", [
    (0.5, [], "not allowed"), (0.5, 0.5, "not allowed"), (0.5, "0.5", "not allowed"),
    (0.5, [0.75, 0.5], "not allowed"), (0.5, [0.0, 0.5], "not allowed"),
    (0.5, [True, 0.5], "not allowed"), (0.5, ["0.25", 0.5], "not allowed"),
    (0.5, [0.25], "lacks the client's width model-width=0.5"),
    (1.0, [0.5, 0.25], "lacks the client's width model-width=1.0"),
])
def test_bad_levels_name_the_key_the_value_and_the_fix(width, levels, why):
    with pytest.raises(ValueError) as err:
        sent_levels({C.MODEL_WIDTH: width, C.WIDTH_LEVELS: levels})
    text = str(err.value)
    assert f"width-levels={levels!r}" in text and why in text
    assert f"send a non-empty list of widths in (0, model-width={width!r}]" in text


def test_levels_are_checked_against_a_valid_width():
    with pytest.raises(ValueError, match="model-width=2.0"):
        sent_levels({C.MODEL_WIDTH: 2.0, C.WIDTH_LEVELS: [1.0, 2.0]})


def test_is_width_message():
    assert is_width_message(width_message({}, **{C.MODEL_WIDTH: 0.5}))
    assert not is_width_message(width_message({}, **{C.SERVER_ROUND: 1}))
    assert not is_width_message(Message(RecordDict({}), dst_node_id=5,
                                        message_type=MessageType.TRAIN))


# ----------------------------------------------------------------- width_model
@pytest.mark.parametrize("width, scheme, rnd", [(0.5, "static", 0), (0.25, "static", 0),
                                                (0.5, "rolling", 3), (1.0, "static", 0)])
def test_width_model_loads_the_server_extracted_sub_model(width, scheme, rnd):
    sent = sub_model(width, scheme, rnd)
    built = []

    def build(r):
        built.append(r)
        return cnn(r, seed=9)

    model = width_model(build, width_message(sent, **{C.MODEL_WIDTH: width}))
    assert built == [width]
    assert same_bits(numpy_state(model), sent)
    if width == 0.5:
        assert model.state_dict()["features.0.0.weight"].shape == (3, 1, 5, 5)  # ceil(6 / 2)
        assert model.state_dict()["classifier.1.weight"].shape == (60, 8 * 16)  # flatten


def test_width_model_refuses_a_wrong_width_naming_the_key():
    msg = width_message(sub_model(0.25), **{C.MODEL_WIDTH: 0.5})
    with pytest.raises(ValueError) as err:
        width_model(lambda r: cnn(r), msg)
    assert str(err.value) == (
        "received array 'features.0.0.weight' has shape (2, 1, 5, 5) but the model built "
        "at width r=0.5 has (3, 1, 5, 5); build your model at the sent width: build(r)")


def test_width_model_refuses_a_model_not_built_at_the_sent_width():
    msg = width_message(sub_model(0.5), **{C.MODEL_WIDTH: 0.5})
    with pytest.raises(ValueError, match=r"'features.0.0.weight' has shape \(3, 1, 5, 5\) but "
                                         r"the model built at width r=0.5 has \(6, 1, 5, 5\)"):
        width_model(lambda r: cnn(1.0), msg)


def test_width_model_refuses_missing_and_extra_keys():
    sent = sub_model(0.5)
    sent["extra"] = sent.pop("classifier.5.bias")
    with pytest.raises(ValueError, match=r"keys missing \['classifier.5.bias'\], unexpected "
                                         r"\['extra'\]; build your model at the sent width"):
        width_model(lambda r: cnn(r), width_message(sent, **{C.MODEL_WIDTH: 0.5}))


# ----------------------------------------------------------------- ordered dropout
@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 1e-3)])
def test_one_level_equals_local_sgd_bit_for_bit(momentum, weight_decay):
    """levels = (r,): every step is the width-r model's own, with one plain SGD."""
    x, y = data(50)
    ours, theirs = cnn(0.5), cnn(0.5)

    def no_build(p):
        raise AssertionError(f"built width {p}: the width-r model steps itself")

    kwargs = dict(batch_size=8, epochs=2, seed=11, lr=0.05, momentum=momentum,
                  weight_decay=weight_decay)
    got = ordered_dropout_sgd(ours, no_build, x, y, (0.5,), **kwargs)
    want = local_sgd(theirs, x, y, **kwargs)
    assert got == want and got.local_steps == 12  # floor(2 * 50 / 8)
    assert same_bits(numpy_state(ours), numpy_state(theirs))


def prefix_mask(big: tuple, small: tuple) -> np.ndarray:
    mask = np.zeros(big, bool)
    mask[tuple(slice(0, s) for s in small)] = True
    return mask


@pytest.mark.parametrize("name, shape, width, level", [
    ("cnn-small", MNIST, 0.5, 0.25), ("cnn-small", MNIST, 1.0, 0.5),
    ("resnet18-gn", CIFAR, 0.25, 0.125)])
def test_a_step_at_width_p_trains_the_prefix_as_the_width_p_model(name, shape, width, level):
    """One step drawn at p < r (levels = (p,), the model at r): the width-p prefix of every
    array equals a width-p model loaded with that prefix and stepped by local_sgd on the same
    batch; every entry outside the prefix is unchanged."""
    x, y = data(12, shape)
    torch.manual_seed(0)
    model = build_model(name, shape, 10, width=width)
    before = numpy_state(model)
    built = []

    def build(p):
        built.append(p)
        return build_model(name, shape, 10, width=p)

    result = ordered_dropout_sgd(model, build, x, y, (level,), width=width, batch_size=4,
                                 steps=1, seed=5, lr=0.1)
    assert built == [level] and result.local_steps == 1 and result.num_examples == 12
    reference = build_model(name, shape, 10, width=level)
    reference.load_state_dict({k: torch.from_numpy(before[k][tuple(slice(0, s) for s in v.shape)]
                                                   .copy())
                               for k, v in reference.state_dict().items()})
    want = local_sgd(reference, x, y, batch_size=4, steps=1, seed=5, lr=0.1)
    assert result.train_loss == want.train_loss
    after, small = numpy_state(model), numpy_state(reference)
    shrunk = 0
    for key, value in after.items():
        mask = prefix_mask(value.shape, small[key].shape)
        assert value[mask].tobytes() == small[key].tobytes(), key
        assert value[~mask].tobytes() == before[key][~mask].tobytes(), key
        shrunk += int((~mask).any())
    assert shrunk >= 5  # the hidden layers really were cut
    assert any(not np.array_equal(after[k], before[k]) for k in after)


def test_several_levels_are_deterministic_and_seeded():
    x, y = data(40)

    def run(seed):
        model = cnn(0.5)
        result = ordered_dropout_sgd(model, lambda p: cnn(p, seed=3), x, y, (0.125, 0.25, 0.5),
                                     batch_size=5, steps=9, seed=seed, lr=0.05, momentum=0.5)
        return result, numpy_state(model)

    (first, a), (again, b), (_, c) = run(7), run(7), run(8)
    assert first == again and same_bits(a, b)
    assert first.local_steps == 9 and math.isfinite(first.train_loss)
    assert not same_bits(a, c)


def test_the_draws_follow_the_documented_stream_and_are_uniform():
    """Step t trains levels[i_t], i = default_rng([seed, 0x0D]).integers(3, size=steps):
    the forward of the model at each width records the widths the steps used."""
    x, y = data(20)
    seen = []

    def recorded(model, p):
        model.register_forward_hook(lambda *_: seen.append(p))
        return model

    levels, steps, seed = (0.25, 0.5, 1.0), 150, 123
    model = recorded(cnn(1.0), 1.0)
    ordered_dropout_sgd(model, lambda p: recorded(cnn(p), p), x, y, [1.0, 0.5, 0.25, 0.5],
                        batch_size=1, steps=steps, seed=seed, lr=0.01)
    draws = np.random.default_rng([seed, 0x0D]).integers(3, size=steps)
    assert seen == [levels[i] for i in draws]
    counts = [seen.count(p) for p in levels]
    assert sum(counts) == steps and all(30 <= c <= 70 for c in counts), counts  # 50 +- 3.5 sd


def test_ordered_dropout_edge_cases():
    x, y = data(10)
    empty = ordered_dropout_sgd(cnn(0.5), cnn, x[:0], y[:0], (0.25, 0.5), batch_size=4, lr=0.1)
    assert empty.num_examples == 0 and empty.local_steps == 0 and math.isnan(empty.train_loss)
    assert isinstance(empty, LocalResult)
    with pytest.raises(ValueError, match=r"levels=\(0.25, 0.75\) must be a non-empty set of "
                                         r"widths in \(0, r\] with r=0.5"):
        ordered_dropout_sgd(cnn(0.5), cnn, x, y, (0.25, 0.75), width=0.5, batch_size=4, lr=0.1)
    with pytest.raises(ValueError, match="non-empty"):
        ordered_dropout_sgd(cnn(0.5), cnn, x, y, (), batch_size=4, lr=0.1)
    with pytest.raises(ValueError, match=r"build\(0.25\)'s 'features.0.0.weight' has shape "
                                         r"\(6, 1, 5, 5\), not a prefix of the width-0.5 "
                                         r"model's \(3, 1, 5, 5\)"):
        ordered_dropout_sgd(cnn(0.5), lambda p: cnn(1.0), x, y, (0.25, 0.5), batch_size=4,
                            lr=0.1)


# ----------------------------------------------------------------- the ClientApp
@pytest.fixture
def node(tmp_path):
    write_tiny_fashion_mnist(tmp_path / "data", n_train=40)
    client_app.clear_caches()
    context = Context(run_id=1, node_id=5, state=RecordDict(),
                      node_config={"partition-id": 0, "num-partitions": 2,
                                   "data-dir": str(tmp_path / "data"),
                                   "data-cache-dir": str(tmp_path / "cache")},
                      run_config={"model": "cnn-small", "partition": "iid",
                                  "allow-download": False, "device": "cpu"})
    yield context
    client_app.clear_caches()


@pytest.mark.parametrize("levels", [None, [0.25, 0.5]])
@pytest.mark.usefixtures("apps")
def test_the_app_trains_the_sent_sub_model(node, levels):
    """HeteroFL (no levels: the normal local-SGD path) and FjORD (ordered dropout): the reply
    has the sent keys and shapes, and equals the helpers run on the node's data."""
    sent = sub_model(0.5)
    config = {C.SERVER_ROUND: 2, C.LOCAL_STEPS: 3, C.BATCH_SIZE: 4, C.LR: 0.05, C.SEED: 4,
              C.MODEL_WIDTH: 0.5}
    if levels is not None:
        config[C.WIDTH_LEVELS] = levels
    reply = client_app.train(width_message(sent, **config), node)
    metrics = reply.content[C.METRICS]
    assert metrics[C.LOCAL_STEPS_TAKEN] == 3 and metrics[C.NUM_EXAMPLES] == 20
    assert metrics[C.PARTITION_ID] == 0 and math.isfinite(metrics[C.TRAIN_LOSS])
    got = {k: a.numpy() for k, a in reply.content[C.ARRAYS].items()}
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in sent.items()}
    x, y, _, _ = client_app.local_data(node)
    model = cnn(0.5)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in sent.items()})
    kwargs = dict(batch_size=4, steps=3, seed=client_seed(4, 2, 0), lr=0.05)
    if levels is None:
        want = local_sgd(model, x, y, **kwargs)
    else:
        want = ordered_dropout_sgd(model, lambda p: build_model("cnn-small", MNIST, 10, width=p),
                                   x, y, (0.25, 0.5), **kwargs)
    assert metrics[C.TRAIN_LOSS] == pytest.approx(want.train_loss, rel=1e-5)
    for key, value in numpy_state(model).items():  # the app's CPU models are channels-last
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert any(not np.array_equal(got[k], sent[k]) for k in sent)


@pytest.mark.usefixtures("apps")
def test_the_app_trains_with_the_label_split_and_replies_the_labels(node):
    """HeteroFL / FedRolex with ``label-split``: the loop's loss is the masked cross-entropy
    of the node's labels (strategies.client.width.LabelSplit), the reply carries them, and
    the output rows of the labels the node lacks come back as sent."""
    sent = sub_model(0.5)
    config = {C.SERVER_ROUND: 2, C.LOCAL_STEPS: 3, C.BATCH_SIZE: 4, C.LR: 0.05, C.SEED: 4,
              C.MODEL_WIDTH: 0.5, C.LABEL_SPLIT: True}
    reply = client_app.train(width_message(sent, **config), node)
    x, y, _, _ = client_app.local_data(node)
    mask = label_mask(y, 10)
    assert reply.content[C.METRICS][C.LABEL_MASK] == mask and 0 < sum(mask) < 10
    model = cnn(0.5)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in sent.items()})
    want = local_sgd(model, x, y, batch_size=4, steps=3, seed=client_seed(4, 2, 0), lr=0.05,
                     loss_fn=lambda logits, labels: masked_cross_entropy(logits, labels, mask))
    assert reply.content[C.METRICS][C.TRAIN_LOSS] == pytest.approx(want.train_loss, rel=1e-5)
    got = {k: a.numpy() for k, a in reply.content[C.ARRAYS].items()}
    for key, value in numpy_state(model).items():
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    absent = [c for c, bit in enumerate(mask) if bit == 0]
    for key in ("classifier.5.weight", "classifier.5.bias"):
        np.testing.assert_array_equal(got[key][absent], sent[key][absent], err_msg=key)


@pytest.mark.usefixtures("apps")
def test_the_app_refuses_a_sub_model_of_another_width(node):
    msg = width_message(sub_model(0.25), **{C.SERVER_ROUND: 1, C.MODEL_WIDTH: 0.5})
    with pytest.raises(ValueError, match=r"'features.0.0.weight' has shape \(2, 1, 5, 5\) but "
                                         r"the model built at width r=0.5 has \(3, 1, 5, 5\)"):
        client_app.train(msg, node)


@pytest.mark.usefixtures("apps")
def test_the_app_evaluates_a_sub_model_at_its_width(node):
    msg = width_message(sub_model(0.25), **{C.SERVER_ROUND: 1, C.MODEL_WIDTH: 0.25})
    reply = client_app.evaluate_local(msg, node)
    metrics = reply.content[C.METRICS]
    assert metrics[C.NUM_EXAMPLES] == 20 and 0.0 <= metrics[C.EVAL_ACCURACY] <= 1.0


def test_the_app_keeps_one_model_per_width():
    client_app.task_model.cache_clear()
    full = client_app.task_model("cnn-small", MNIST, 10, "cpu", 1.0, False)
    half = client_app.task_model("cnn-small", MNIST, 10, "cpu", 0.5, False)
    assert half is not full and half is client_app.task_model("cnn-small", MNIST, 10, "cpu", 0.5,
                                                          False)
    assert half.state_dict()["features.0.0.weight"].shape == (3, 1, 5, 5)
    scaled = copy.deepcopy(client_app.task_model("cnn-small", MNIST, 10, "cpu", 0.5, True))
    assert any(type(m).__name__ == "Scaler" for m in scaled.modules())

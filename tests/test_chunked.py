"""DynamicFL's chunked local solver (strategies/client/dynamicfl.py): chunks equal one
uninterrupted run (SGD with momentum, and the caller's own Adam); the message-level helper
``train_chunk``, its optimiser defaults and the optimiser state it carries."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies import contract as C
from strategies.client import as_tensors, batch_stream, client_seed, label_counts, train_chunk
from strategies.client.dynamicfl import (
    OPTIMIZER_META,
    OPTIMIZER_STATE,
    PAPER_DEFAULTS,
    chunk_steps,
    is_dynamicfl_chunk,
    load_chunk_state,
    run_chunk,
    save_chunk_state,
)
from task.models import build_model


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _data(n=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def _model(name="cnn-small"):
    torch.manual_seed(0)
    return build_model(name, (1, 28, 28), 10)


def test_batch_stream_is_concatenated_reshuffled_passes_and_prefix_stable():
    s = batch_stream(10, 4, 7, 5)  # 28 indices = 2 full passes + 8
    flat = s.reshape(-1)
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert len(set(flat[20:])) == 8
    np.testing.assert_array_equal(batch_stream(10, 4, 3, 5), s[:3])  # a shorter stream is a prefix
    assert not np.array_equal(batch_stream(10, 4, 7, 6), s)  # another seed, another stream
    full = batch_stream(10, 0, 3, 5)  # full batch: every step one whole pass
    assert full.shape == (3, 10) and all(sorted(r) == list(range(10)) for r in full)
    with pytest.raises(ValueError):
        batch_stream(0, 4, 3, 5)


@pytest.mark.parametrize("chunks, rho, wd, name", [
    ([1, 4, 3, 9, 1], 0.9, 5e-4, "cnn-small"),
    ([1] * 6 + [28], 0.9, 0.0, "cnn-small"),
    ([16, 2, 16], 0.0, 0.0, "cnn-small"),
    ([1, 4, 3], 0.9, 5e-4, "lenet-gn"),  # GroupNorm, as in the paper
])
def test_chunks_equal_one_uninterrupted_run_bit_for_bit(chunks, rho, wd, name):
    """1 + 4 + ... steps, momentum and weights through ArrayRecords as between messages,
    equal all L steps at once, on CPU, bit for bit."""
    x, y = _data()
    L = sum(chunks)
    whole = _model(name)
    ref = chunk_steps(whole, x, y, lr=0.05, batch_size=8, start_step=0, num_steps=L, round_steps=L, seed=11,
                      momentum=rho, weight_decay=wd)
    model = _model(name)
    state, start, losses = RecordDict(), 0, []
    for k in chunks:
        weights = ArrayRecord(model.state_dict())  # the server's message
        model = _model(name)
        model.load_state_dict(weights.to_torch_state_dict())
        carried = load_chunk_state(state, 1, start, "SGD")
        r = chunk_steps(model, x, y, lr=0.05, batch_size=8, start_step=start, num_steps=k, round_steps=L,
                        seed=11, momentum=rho, weight_decay=wd, optimizer_state=carried)
        save_chunk_state(state, r.optimizer_state, 1, start + k, "SGD")
        losses.append((r.train_loss, k))
        start += k
    for (name, a), b in zip(whole.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    assert sum(l * k for l, k in losses) / L == pytest.approx(ref.train_loss, rel=1e-12)


def _same(a, b):
    """Bit-identical weights."""
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _cfg(server_round, start, steps, L, **extra):
    return ConfigRecord({C.SERVER_ROUND: server_round, C.START_STEP: start, C.NUM_STEPS: steps,
                         C.ROUND_STEPS: L, C.LR: 0.05, C.BATCH_SIZE: 8, C.MOMENTUM: 0.9, C.SEED: 3, **extra})


def test_helper_keeps_momentum_in_context_state_and_resets_each_round():
    x, y = _data()
    model, state = _model(), RecordDict()
    reply = train_chunk(model, (x, y), _cfg(1, 0, 2, 5), state, partition_id=4)
    assert state[OPTIMIZER_META]["next-step"] == 2 and state[OPTIMIZER_META]["round"] == 1
    metrics = reply[C.METRICS]
    assert metrics[C.NUM_EXAMPLES] == len(y) and metrics[C.LOCAL_STEPS_TAKEN] == 2
    assert metrics[C.PARTITION_ID] == 4 and set(reply[C.ARRAYS]) == set(model.state_dict())
    train_chunk(model, (x, y), _cfg(1, 2, 3, 5), state, partition_id=4)
    # equals 5 steps at once with the same (seed, round, partition) stream
    ref = _model()
    chunk_steps(ref, x, y, lr=0.05, batch_size=8, start_step=0, num_steps=5,
                seed=client_seed(3, 1, 4), momentum=0.9,
                weight_decay=PAPER_DEFAULTS[C.WEIGHT_DECAY])  # not in the config: the paper's
    assert _same(ref, model)
    # new round, step 0: momentum is reset (None), unless kept across rounds
    assert load_chunk_state(state, 2, 0, "SGD") is None
    kept = load_chunk_state(state, 2, 0, "SGD", keep_across_rounds=True)
    assert set(kept) == {f"{n}/momentum_buffer" for n, _ in model.named_parameters()}
    # a mid-round chunk that does not continue the stored buffers starts from zero
    assert load_chunk_state(state, 1, 3, "SGD") is None
    # state of another kind of optimiser is not loaded into this one
    assert load_chunk_state(state, 1, 5, "Adam") is None


class _Pairs(torch.utils.data.Dataset):
    """A template-style dataset: dict batches {"img", "label"}."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"img": self.x[i], "label": self.y[i]}


def test_optimiser_follows_the_config_then_the_loader_then_the_paper(caplog):
    """lr / momentum / weight decay / B: the config, then keywords, the loader's B, the paper's."""
    x, y = _data()
    loader = torch.utils.data.DataLoader(_Pairs(x, y), batch_size=6, shuffle=True)
    cfg = ConfigRecord({C.SERVER_ROUND: 1, C.START_STEP: 0, C.NUM_STEPS: 3, C.ROUND_STEPS: 3,
                        C.LR: 0.05})
    model = _model()
    with caplog.at_level("INFO", logger="strategies.client.dynamicfl"):
        train_chunk(model, loader, cfg, RecordDict(), partition_id=2)
    ref = _model()  # B = the loader's 6; momentum 0.9 and weight decay 5e-4 (the paper's); seed 0
    chunk_steps(ref, x, y, lr=0.05, batch_size=6, start_step=0, num_steps=3,
                seed=client_seed(0, 1, 2), momentum=PAPER_DEFAULTS[C.MOMENTUM],
                weight_decay=PAPER_DEFAULTS[C.WEIGHT_DECAY])
    assert _same(ref, model)
    # what the config says wins over the keyword arguments
    cfg2 = ConfigRecord({**cfg, C.BATCH_SIZE: 4, C.MOMENTUM: 0.0, C.WEIGHT_DECAY: 0.0, C.SEED: 9})
    model = _model()
    train_chunk(model, loader, cfg2, RecordDict(), partition_id=2, batch_size=7, momentum=0.5,
                seed=1)
    ref = _model()
    chunk_steps(ref, x, y, lr=0.05, batch_size=4, start_step=0, num_steps=3,
                seed=client_seed(9, 1, 2))
    assert _same(ref, model)


def test_a_dataloader_is_read_in_dataset_order():
    x, y = _data()
    loader = torch.utils.data.DataLoader(_Pairs(x, y), batch_size=5, shuffle=True)
    x2, y2 = as_tensors(loader)
    assert torch.equal(x2, x) and torch.equal(y2, y)
    tensors = torch.utils.data.TensorDataset(x, y)
    x3, y3 = as_tensors(torch.utils.data.DataLoader(tensors, batch_size=4, shuffle=True))
    assert torch.equal(x3, x) and torch.equal(y3, y)


def test_not_a_chunk_is_a_clear_error():
    x, y = _data()
    assert not is_dynamicfl_chunk(ConfigRecord({C.LR: 0.1}))
    with pytest.raises(ValueError, match="start-step"):
        train_chunk(_model(), (x, y), ConfigRecord({C.LR: 0.1}), RecordDict(), partition_id=0)


def test_label_counts():
    assert label_counts(torch.tensor([0, 2, 2, 1]), 4) == [1, 1, 2, 0]
    assert label_counts([0, 0, 3], 4) == [2, 0, 0, 1]
    with pytest.raises(ValueError):
        label_counts([0, 5], 4)


def test_the_callers_adam_runs_the_chunks_and_its_state_is_carried_bit_for_bit(caplog):
    """A fresh Adam per message (as a ClientApp builds it), its moments and step counts
    carried in Context.state, equals one Adam running all L steps at once."""
    x, y = _data()
    chunks, L = [2, 1, 4], 7
    whole = _model()
    adam = torch.optim.Adam(whole.parameters(), lr=1e-3, weight_decay=1e-4)
    run_chunk(whole, adam, x, y, batch_size=8, start_step=0, num_steps=L, round_steps=L,
              seed=client_seed(3, 1, 4))
    model, state, start = _model(), RecordDict(), 0
    with caplog.at_level("WARNING", logger="strategies.client.dynamicfl"):
        for k in chunks:
            weights = ArrayRecord(model.state_dict())  # the server's message
            model = _model()
            model.load_state_dict(weights.to_torch_state_dict())
            mine = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
            reply = train_chunk(model, (x, y), _cfg(1, start, k, L), state, partition_id=4,
                                optimizer=mine, metrics={"train_loss": 0.25})
            assert reply[C.METRICS]["train_loss"] == 0.25  # the caller's metric, kept
            assert reply[C.METRICS][C.LOCAL_STEPS_TAKEN] == k
            start += k
    assert not caplog.records
    assert _same(whole, model)
    assert state[OPTIMIZER_META]["optimizer"] == "Adam"
    assert float(mine.state_dict()["state"][0]["step"]) == L


def test_plain_sgd_keeps_no_arrays_and_a_later_chunk_does_not_warn(caplog):
    x, y = _data()
    model, state = _model(), RecordDict()
    with caplog.at_level("WARNING", logger="strategies.client.dynamicfl"):
        train_chunk(model, (x, y), _cfg(1, 0, 2, 4, **{C.MOMENTUM: 0.0, C.WEIGHT_DECAY: 0.0}),
                    state, partition_id=1)
        assert len(state[OPTIMIZER_STATE]) == 0 and state[OPTIMIZER_META]["next-step"] == 2
        train_chunk(model, (x, y), _cfg(1, 2, 2, 4, **{C.MOMENTUM: 0.0, C.WEIGHT_DECAY: 0.0}),
                    state, partition_id=1)
    assert not caplog.records
    ref = _model()
    chunk_steps(ref, x, y, lr=0.05, batch_size=8, start_step=0, num_steps=4,
                seed=client_seed(3, 1, 1))
    assert _same(ref, model)


def test_a_restarted_node_mid_round_starts_afresh_with_a_warning(caplog):
    x, y = _data()
    with caplog.at_level("WARNING", logger="strategies.client.dynamicfl"):
        train_chunk(_model(), (x, y), _cfg(1, 3, 2, 5), RecordDict(), partition_id=1)
    assert "step 3 of round 1 found no optimizer state" in caplog.text

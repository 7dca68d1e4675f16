"""DynamicFL's chunked local solver (task/chunked.py): chunks equal one uninterrupted run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies import contract as C
from task.chunked import (
    MOMENTUM_META,
    MOMENTUM_STATE,
    batch_stream,
    dynamicfl_train,
    label_counts,
    load_momentum,
    train_chunk,
)
from task.models import build_model
from task.train import client_seed


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
    ref = train_chunk(whole, x, y, lr=0.05, batch_size=8, start_step=0, num_steps=L, round_steps=L, seed=11,
                      momentum=rho, weight_decay=wd)
    model = _model(name)
    state, start, losses = RecordDict(), 0, []
    for k in chunks:
        weights = ArrayRecord(model.state_dict())  # the server's message
        model = _model(name)
        model.load_state_dict(weights.to_torch_state_dict())
        buffers = load_momentum(state, 1, start)
        r = train_chunk(model, x, y, lr=0.05, batch_size=8, start_step=start, num_steps=k, round_steps=L,
                        seed=11, momentum=rho, weight_decay=wd, momentum_state=buffers)
        if r.momentum:
            state[MOMENTUM_STATE] = ArrayRecord(r.momentum)
            state[MOMENTUM_META] = ConfigRecord({"round": 1, "next-step": start + k})
        losses.append((r.train_loss, k))
        start += k
    for (name, a), b in zip(whole.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    assert sum(l * k for l, k in losses) / L == pytest.approx(ref.train_loss, rel=1e-12)


def _cfg(server_round, start, steps, L, **extra):
    return ConfigRecord({C.SERVER_ROUND: server_round, C.START_STEP: start, C.NUM_STEPS: steps,
                         C.ROUND_STEPS: L, C.LR: 0.05, C.BATCH_SIZE: 8, C.MOMENTUM: 0.9, C.SEED: 3, **extra})


def test_helper_keeps_momentum_in_context_state_and_resets_each_round():
    x, y = _data()
    model, state = _model(), RecordDict()
    dynamicfl_train(model, x, y, _cfg(1, 0, 2, 5), state, partition_id=4)
    assert state[MOMENTUM_META]["next-step"] == 2 and state[MOMENTUM_META]["round"] == 1
    dynamicfl_train(model, x, y, _cfg(1, 2, 3, 5), state, partition_id=4)
    # equals 5 steps at once with the same (seed, round, partition) stream
    ref = _model()
    train_chunk(ref, x, y, lr=0.05, batch_size=8, start_step=0, num_steps=5, seed=client_seed(3, 1, 4), momentum=0.9)
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), model.state_dict().values()))
    # new round, step 0: momentum is reset (None), unless kept across rounds
    assert load_momentum(state, 2, 0) is None
    kept = load_momentum(state, 2, 0, keep_across_rounds=True)
    assert kept is not None and set(kept) == {n for n, _ in model.named_parameters()}
    # a mid-round chunk that does not continue the stored buffers starts from zero
    assert load_momentum(state, 1, 3) is None


def test_label_counts():
    assert label_counts(torch.tensor([0, 2, 2, 1]), 4) == [1, 1, 2, 0]

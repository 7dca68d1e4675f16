"""The server's data: the test split alone (``with_train=False``), normalised exactly as
with the training split, and the per-channel statistics from the pixel histogram."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from task.data import channel_stats, load_dataset
from tests.test_data import N_TEST, write_tiny_fashion_mnist


@pytest.fixture(autouse=True)
def fresh_cache():
    load_dataset.cache_clear()
    yield
    load_dataset.cache_clear()


@pytest.mark.parametrize("normalize", [True, False])
def test_test_split_alone_equals_the_full_loads_test_split(tmp_path, normalize):
    folder = tmp_path / "data"
    write_tiny_fashion_mnist(folder)
    full = load_dataset("fashion-mnist", str(folder), False, normalize=normalize)
    test = load_dataset("fashion-mnist", str(folder), False, normalize=normalize,
                        with_train=False)
    assert test is not full
    assert torch.equal(test.x_test, full.x_test) and torch.equal(test.y_test, full.y_test)
    assert test.x_train.shape == (0, 1, 28, 28) and len(test.y_train) == 0
    assert test.input_shape == full.input_shape == (1, 28, 28)
    assert test.num_classes == 10 and test.source == full.source
    assert test.x_test.shape == (N_TEST, 1, 28, 28)


def test_synthetic_test_split_alone():
    full = load_dataset("synthetic")
    test = load_dataset("synthetic", with_train=False)
    assert torch.equal(test.x_test, full.x_test) and len(test.y_train) == 0
    assert test.input_shape == full.input_shape and test.natural_ids is None


def test_channel_stats_hand_computed():
    # one channel, pixels 0 and 255 (x = 0 and 1) four times each: mean 1/2,
    # unbiased variance (8 * 1/4) / 7 = 2/7
    images = np.array([[[0, 255], [0, 255]], [[255, 0], [255, 0]]], dtype=np.uint8)
    mean, std = channel_stats(images)
    assert mean.shape == std.shape == (1, 1, 1, 1)
    assert mean.item() == 0.5
    assert std.item() == np.float32(math.sqrt(2 / 7))


def test_channel_stats_are_exact_for_every_block_size_and_channel():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (37, 5, 4, 3), dtype=np.uint8)  # (N, H, W, C)
    x = torch.from_numpy(images.astype(np.float32) / np.float32(255)).double()
    exact_mean = x.mean(dim=(0, 1, 2)).numpy().astype(np.float32)
    exact_std = x.std(dim=(0, 1, 2)).numpy().astype(np.float32)
    for block in (1, 5, 4096):
        mean, std = channel_stats(images, block=block)
        np.testing.assert_array_equal(mean.flatten().numpy(), exact_mean)
        np.testing.assert_array_equal(std.flatten().numpy(), exact_std)

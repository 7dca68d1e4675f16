"""``vectorised-clients = "auto"``'s decision (fedapp.vectorised_share.batched_is_faster): a
small probe first, a larger one only where batching wins clearly, the larger one deciding.
The timings are given; the timing itself runs in tests/test_vectorised.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fedapp import vectorised_share as V


def group(size: int, key: str) -> list:
    model = torch.nn.Linear(2, 2)
    return [SimpleNamespace(decision=(key,), model_name="m", batch=32,
                            task=SimpleNamespace(model=model)) for _ in range(size)]


@pytest.fixture
def timed(monkeypatch):
    """Each probe's size, answered by ``answers[size]`` = (loop, batched) seconds a client."""
    def install(answers: dict[int, tuple[float, float]]) -> list[int]:
        sizes: list[int] = []

        def per_client_seconds(probe):
            sizes.append(len(probe))
            loop, batched = answers[len(probe)]
            return {"loop": loop, "batched": batched}

        monkeypatch.setattr(V, "per_client_seconds", per_client_seconds)
        monkeypatch.setattr(V, "_FASTER", {})
        return sizes

    return install


def test_batching_close_to_the_loop_on_the_small_probe_is_one_by_one_without_more_timing(timed):
    sizes = timed({32: (1.0, 0.9)})  # faster, but not by the margin
    assert V.batched_is_faster(group(500, "a")) is False
    assert sizes == [32]


def test_a_clear_win_on_the_small_probe_is_timed_again_larger_and_that_decides(timed):
    sizes = timed({32: (1.0, 0.5), 256: (1.0, 2.2)})  # cnn-small's shape: worse when larger
    assert V.batched_is_faster(group(500, "b")) is False
    assert sizes == [32, 256]
    sizes = timed({32: (1.0, 0.5), 100: (1.0, 0.6)})
    assert V.batched_is_faster(group(100, "c")) is True
    assert sizes == [32, 100]  # the whole group, under the cap


def test_a_group_no_larger_than_the_probe_is_decided_by_it_and_the_answer_is_kept(timed):
    sizes = timed({20: (1.0, 0.5)})
    assert V.batched_is_faster(group(20, "d")) is True
    assert V.batched_is_faster(group(20, "d")) is True  # kept: timed once per key
    assert sizes == [20]

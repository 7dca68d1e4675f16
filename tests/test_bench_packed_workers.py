"""What ``python -m simulation bench packed-workers`` prints per run, and which runs it makes
with and without CUDA (the runs themselves are real ``flwr run``: not started here)."""

from __future__ import annotations

import argparse

import pytest

from simulation.bench import machine_sampler as M
from simulation.bench.packed_workers import add_arguments, placements, run_line


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_run_line_gives_the_warm_round_and_the_time_per_client_per_worker():
    sampler = M.MachineSampler()
    sampler.peak_rss_mb, sampler.gpu = 28677.0, [(10.0, 900.0), (12.0, 950.0)]
    line = run_line(1000, 16, True, [26.04, 3.26, 3.32, 3.52], 72.4, sampler)
    assert line == ("1000 clients, W=16 gpu: warm 3.290 s/round (52.6 ms per client per worker); "
                    "rounds 26.04, 3.26, 3.32, 3.52; run 72 s; GPU utilisation 11%; "
                    "peak RSS 28677 MB")
    assert "GPU utilisation -;" in run_line(1000, 1, False, [9.0, 6.0, 7.0, 6.5], 80.0,
                                             M.MachineSampler())


def test_without_cuda_only_the_cpu_runs_and_gpu_is_refused():
    assert placements(parsed(), cuda=False) == [False]
    assert placements(parsed("--cpu"), cuda=False) == [False]
    with pytest.raises(SystemExit, match="--gpu needs CUDA"):
        placements(parsed("--gpu"), cuda=False)


def test_with_cuda_both_placements_cpu_first_unless_one_is_picked():
    assert placements(parsed(), cuda=True) == [False, True]
    assert placements(parsed("--gpu"), cuda=True) == [True]
    assert placements(parsed("--cpu"), cuda=True) == [False]


def test_defaults_are_one_four_and_sixteen_workers_for_a_thousand_clients():
    args = parsed()
    assert (args.clients, args.workers, args.rounds) == (1000, [1, 4, 16], 4)
    with pytest.raises(SystemExit):
        parsed("--cpu", "--gpu")

"""What ``python -m simulation bench scale`` prints besides the runs themselves: its table
and last lines, the machine sampler's peak memory of the processes it starts, and packed
mode's bare-torch limit. The pure parts are ``unit``; those that start processes ``app``."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from simulation.bench import machine_sampler as M
from simulation.bench.scale import (
    SizeResult,
    gpu_line,
    huge_lines,
    progress,
    ratio_lines,
    table_row,
)

RESULT = SizeResult(clients=1000, ours=24.0, bare_flower=22.0, packed=3.3, bare_torch=2.2,
                    vectorised=2.97, batched_bound=2.7, forced=4.05)


def test_the_last_lines_are_the_ratios_at_the_largest_size():
    assert ratio_lines([RESULT]) == [
        "scale ratio at 1000 clients = 1.09   (target <= 1.1)",
        "packed/bare-Flower ratio at 1000 clients = 0.15   (target <= 0.25, stretch 0.15)",
        "packed/bare-torch ratio at 1000 clients = 1.50   (target <= 2)",
        "vectorised/bare-torch ratio at 1000 clients = 1.35   (the per-client loop)",
        "vectorised/batched-bound ratio at 1000 clients = 1.10   (target <= 1.5)",
        "vectorised/packed ratio at 1000 clients = 0.90   (target <= 1: never slower)",
        "forced (vectorised-clients on)/batched-bound ratio at 1000 clients = 1.50",
        "forced/packed ratio at 1000 clients = 1.23",
    ]


def test_over_repeats_each_ratio_is_the_median_of_the_repeats_ratios_with_its_range():
    slower = replace(RESULT, packed=4.4)  # packed/bare-Flower 0.20, packed/bare-torch 2.00
    faster = replace(RESULT, packed=2.2, bare_torch=2.0)  # 0.10 and 1.10
    lines = ratio_lines([slower, RESULT, faster])
    assert lines[1] == ("packed/bare-Flower ratio at 1000 clients = 0.15   (target <= 0.25, "
                        "stretch 0.15); median of 3 repeats, range 0.10-0.20")
    assert lines[2] == ("packed/bare-torch ratio at 1000 clients = 1.50   (target <= 2); "
                        "median of 3 repeats, range 1.10-2.00")
    # the median of the repeats' ratios (3, 0.5, 3), not the ratio of the medians (3 / 2)
    runs = [replace(RESULT, packed=p, bare_torch=t) for p, t in ((6.0, 2.0), (2.0, 4.0), (3.0, 1.0))]
    assert ratio_lines(runs)[2].startswith("packed/bare-torch ratio at 1000 clients = 3.00")
    assert lines[7] == "forced/packed ratio at 1000 clients = 1.23; median of 3 repeats, range 0.92-1.84"


def test_a_table_row_has_the_seven_times_and_the_five_ratios():
    cells = [cell.strip() for cell in table_row(RESULT).split("|")]
    assert cells == ["1000", "24.000", "22.000", "1.09", "3.300", "2.200", "0.15", "1.50",
                     "2.970", "2.700", "1.35", "1.10", "4.050"]


def test_ways_left_out_are_dashes_in_the_row_and_their_ratios_are_not_printed():
    packed_only = SizeResult(clients=1000, ours=None, bare_flower=None, packed=3.3,
                             bare_torch=2.2, vectorised=1.1, batched_bound=None, forced=None)
    cells = [cell.strip() for cell in table_row(packed_only).split("|")]
    assert cells == ["1000", "-", "-", "-", "3.300", "2.200", "-", "1.50", "1.100", "-", "0.50",
                     "-", "-"]
    assert ratio_lines([packed_only]) == [
        "packed/bare-torch ratio at 1000 clients = 1.50   (target <= 2)",
        "vectorised/bare-torch ratio at 1000 clients = 0.50   (the per-client loop)",
        "vectorised/packed ratio at 1000 clients = 0.33   (target <= 1: never slower)",
    ]


def test_the_large_run_prints_its_warm_round_and_both_peaks():
    sampler = M.MachineSampler()
    sampler.peak_rss_mb, sampler.peak_anon_mb = 5120.4, 2048.0
    records = [{"round": 0, "wall-seconds": 1.0, "server-max-rss-mb": 300.0},
               {"round": 1, "wall-seconds": 40.0, "server-max-rss-mb": 650.0},
               {"round": 2, "wall-seconds": 12.345, "server-max-rss-mb": 700.2},
               {"round": 3, "wall-seconds": 13.0}]
    lines = huge_lines(10_000, 2, records, sampler)
    assert lines[0] == ("vectorised packed, 10000 virtual clients on 2 SuperNodes, 3 rounds: "
                        "warm round (round 2) 12.35 s")
    assert "5120 MB (2048 MB anonymous); the ServerApp's own peak 700 MB" in lines[1]


def test_the_gpu_line_says_no_gpu_or_each_packed_runs_mean_utilisation():
    without, first, second = M.MachineSampler(), M.MachineSampler(), M.MachineSampler()
    assert gpu_line({"10 clients": without}).startswith(
        "GPU utilisation during the packed runs: no GPU")
    first.gpu, second.gpu = [(40.0, 1000.0), (60.0, 1500.0)], [(80.0, 900.0)]
    assert gpu_line({"10 clients": first, "100 clients": second, "x": without}) == (
        "GPU utilisation during the packed runs: mean 60% (10 clients: 50%, 100 clients: 80%); "
        "peak GPU memory used 1500 MiB")


def test_each_way_of_a_size_says_its_warm_round_as_it_ends_and_a_packed_gpu_run_its_use(capsys):
    sampler = M.MachineSampler()
    sampler.gpu = [(30.0, 800.0), (50.0, 900.0)]
    progress(1000, "packed", [9.0, 3.0, 3.5, 8.0], started=0.0, sampler=sampler)
    progress(1000, "bare torch", [1.0, 0.5, 0.7, 0.6], started=0.0)
    first, second = capsys.readouterr().err.splitlines()
    assert first.startswith("[bench scale] 1000 clients, packed: 3.250 s per warm round (run ")
    assert first.endswith(" s, GPU utilisation mean 40%)")
    assert second.startswith("[bench scale] 1000 clients, bare torch: 0.600 s per warm round")
    assert "GPU" not in second


def test_descendants_follow_the_parent_chain_and_leave_out_the_root_and_strangers():
    parents = {10: 1, 11: 10, 12: 11, 13: 12, 20: 1, 21: 20, 14: 10}
    assert sorted(M.descendants_of(10, parents)) == [11, 12, 13, 14]
    assert M.descendants_of(13, parents) == []


@pytest.mark.usefixtures("processes")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
@pytest.mark.usefixtures("processes")
def test_the_sampler_sees_a_grandchild_holding_200_mb():
    grandchild = ("import time\nheld = b'\\x01' * (200 << 20)\ntime.sleep(2)")
    launcher = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\nsubprocess.run("
                                 f"[sys.executable, '-c', {grandchild!r}], check=True)"])
    with M.MachineSampler(root=launcher.pid, interval=0.1) as sampler:
        assert launcher.wait(timeout=120) == 0
    # the grandchild alone (the root is left out): its 200 MB and a bare interpreter
    assert 200 <= sampler.peak_rss_mb <= 200 + 80
    assert 195 <= sampler.peak_anon_mb <= sampler.peak_rss_mb


@pytest.mark.usefixtures("processes")
@pytest.mark.usefixtures("processes")
def test_the_bare_torch_limit_times_every_round_over_the_workers():
    from simulation.bench.common import bare_packed_round_seconds

    workload = {"model": "mlp-2nn", "dataset": "synthetic", "batch-size": 8, "local-steps": 1}
    for batched in (False, True):  # the per-client loop, and the batched bound
        per_round = bare_packed_round_seconds(workload, 2, 2, threads=1, workers=1,
                                              batched=batched)
        assert len(per_round) == 2 and all(seconds > 0 for seconds in per_round)


@pytest.mark.usefixtures("processes")
@pytest.mark.skipif(sys.platform.startswith("win"), reason="a shell script stands in for nvidia-smi")
@pytest.mark.usefixtures("processes")
def test_a_gpu_reading_averages_the_utilisation_and_sums_the_memory_skipping_n_a(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '[N/A], 1234\\n50, 100\\n70, [N/A]\\n'\n")
    fake.chmod(0o755)
    assert M.gpu_reading(str(fake)) == (60.0, 1334.0)
    fake.write_text("#!/bin/sh\nexit 9\n")
    assert M.gpu_reading(str(fake)) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_a_process_once_seen_counts_while_it_runs_and_a_gone_one_is_dropped():
    import os

    gone = max(M.parent_pids()) + 100_000  # no such process
    known = {os.getpid(), gone}
    rss, anon = M.tree_resident_mb(-1, known)  # no process has -1 as its parent
    assert known == {os.getpid()}
    assert rss >= anon > 0  # this interpreter (torch imported by the scale module)


def test_with_a_gpu_w_workers_get_shares_that_fit_one_gpu():
    from simulation.bench.scale import federation, gpu_share

    assert gpu_share(4) == 0.25 and gpu_share(16) == 0.0625
    assert 7 * gpu_share(7) <= 1 and gpu_share(7) == 0.1428  # Ray counts in 1e-4 units
    assert federation(1, 4, gpu=True) == {"client-resources-num-cpus": 1,
                                          "client-resources-num-gpus": 0.25}
    assert federation(2, 4, gpu=False) == {"client-resources-num-cpus": 2}

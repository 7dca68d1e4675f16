"""task.heap: fixed glibc malloc thresholds keep one SGD step's memory for the next."""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from task import heap

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# SGD steps of the McMahan CNN in a fresh process; prints minor page faults per step
STEPS = textwrap.dedent("""
    import sys, torch
    from simulation.bench.heap import minor_faults
    from task.heap import keep_step_memory
    from task.layout import training_layout
    from task.models import build_model
    from strategies.client import local_sgd
    print("kept", keep_step_memory())
    torch.set_num_threads(1)
    model = training_layout(build_model("cnn-mcmahan", (1, 28, 28), 10), (1, 28, 28))
    x, y = torch.randn(640, 1, 28, 28), torch.randint(0, 10, (640,))
    local_sgd(model, x, y, lr=0.01, batch_size=32, steps=3)
    before = minor_faults()
    local_sgd(model, x, y, lr=0.01, batch_size=32, steps=20)
    print("faults/step", (minor_faults() - before) / 20)
""")


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
@pytest.mark.usefixtures("processes")
def test_a_training_process_with_fixed_thresholds_does_not_fault_its_steps_memory_in_again():
    out = subprocess.run([sys.executable, "-c", STEPS], capture_output=True, text=True,
                         check=True, timeout=300).stdout.split()
    assert out[:2] == ["kept", "True"]
    # an SGD step's ~30 MB would be 7,000+ pages faulted in per step if the heap were
    # trimmed after it (glibc's own thresholds in a fresh process: ~3,400 per step)
    assert float(out[out.index("faults/step") + 1]) < 200


def test_the_thresholds_are_set_once_per_process_and_not_off_glibc(monkeypatch):
    heap.keep_step_memory.cache_clear()
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert heap.keep_step_memory() is False  # musl, macOS, Windows: nothing to set
    heap.keep_step_memory.cache_clear()
    monkeypatch.undo()
    assert heap.keep_step_memory() is GLIBC
    assert heap.keep_step_memory() is GLIBC and heap.keep_step_memory.cache_info().hits >= 1
    assert heap.MMAP_THRESHOLD_BYTES <= 4 * 1024 * 1024 * 8  # glibc's largest on 64-bit


def test_the_clientapp_sets_the_thresholds_when_it_builds_its_training_model():
    pytest.importorskip("torch")
    from fedapp import client_app

    heap.keep_step_memory.cache_clear()
    client_app.task_model.cache_clear()
    client_app.task_model("mlp-2nn", (1, 28, 28), 10, "cpu")
    assert heap.keep_step_memory.cache_info().currsize == 1


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
@pytest.mark.usefixtures("processes")
def test_the_heap_bench_compares_both_settings_in_fresh_processes(capsys):
    from simulation.bench import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    run(parser.parse_args(["heap", "--model", "cnn-small", "--steps", "3", "--repeats", "1"]))
    provenance, *lines = capsys.readouterr().out.splitlines()
    assert provenance.startswith("fedhetero bench at commit ")
    assert lines[0].startswith("cnn-small, B = 32, 3 SGD steps, CPU, 1 thread, 1 fresh")
    assert "glibc's thresholds" in lines[1] and "keep_step_memory" in lines[2]
    assert lines[-1].startswith("median speed-up with fixed thresholds = ")
    with pytest.raises(SystemExit, match="--model nope: unknown; choose from mlp-2nn"):
        run(parser.parse_args(["heap", "--model", "nope"]))
    with pytest.raises(SystemExit, match="--steps 0 .*give integers >= 1"):
        run(parser.parse_args(["heap", "--steps", "0"]))


# a ServerApp's pattern: model-sized buffers allocated and freed, from several threads
RELAY = textwrap.dedent("""
    import sys, threading, numpy as np
    from task.heap import unmap_large_blocks
    def rss_mb():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
    if sys.argv[1] == "set":
        assert unmap_large_blocks()
    kept = []
    def relay():
        for _ in range(4):
            block = np.ones(1_700_000, np.float32)  # 6.8 MB, a McMahan CNN
            kept.append(np.ones(10, np.float32))
            del block
    relay()
    before = rss_mb()
    threads = [threading.Thread(target=relay) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    relay()
    print(rss_mb() - before)
""")


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
@pytest.mark.usefixtures("processes")
def test_the_serverapps_freed_model_buffers_go_back_to_the_kernel():
    def grown(setting: str) -> float:
        return float(subprocess.run([sys.executable, "-c", RELAY, setting], capture_output=True,
                                    text=True, check=True, timeout=120).stdout)

    # in a fresh process: the pytest process keeps its own thresholds
    assert grown("set") < 2  # glibc's own thresholds kept 19-26 MB of it on this machine


def test_the_serverapp_unmaps_large_blocks_before_anything_else(monkeypatch):
    from fedapp import server_app

    calls = []
    monkeypatch.setattr(server_app, "unmap_large_blocks", lambda: calls.append("unmap"))
    monkeypatch.setattr(server_app.RunConfig, "from_user_config",
                        lambda config: (calls.append("config"), 1 / 0))
    with pytest.raises(ZeroDivisionError):  # stopped at the config: nothing else ran
        server_app.main(None, SimpleNamespace(run_config={}))
    assert calls == ["unmap", "config"]

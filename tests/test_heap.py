"""task.heap: fixed glibc malloc thresholds keep one SGD step's memory for the next."""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import textwrap

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
    from task.train import local_sgd
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
    client_app._model.cache_clear()
    client_app._model("mlp-2nn", (1, 28, 28), 10, "cpu")
    assert heap.keep_step_memory.cache_info().currsize == 1


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_the_heap_bench_compares_both_settings_in_fresh_processes(capsys):
    from simulation.bench import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    run(parser.parse_args(["heap", "--model", "cnn-small", "--steps", "3", "--repeats", "1"]))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("cnn-small, B = 32, 3 SGD steps, CPU, 1 thread, 1 fresh")
    assert "glibc's thresholds" in lines[1] and "keep_step_memory" in lines[2]
    assert lines[-1].startswith("median speed-up with fixed thresholds = ")
    with pytest.raises(SystemExit, match="--model nope: unknown; choose from mlp-2nn"):
        run(parser.parse_args(["heap", "--model", "nope"]))
    with pytest.raises(SystemExit, match="--steps 0 .*give integers >= 1"):
        run(parser.parse_args(["heap", "--steps", "0"]))

"""The on-disk data cache (task.cache) and a node's partition through it (task.node_data)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from task import node_data
from task.cache import ArrayCache, entry_name, file_stat
from task.data import DataSource, PartitionSpec, client_data, load_dataset, partition_for
from task.node_data import load_partition
from tests.test_data import write_tiny_fashion_mnist


@pytest.fixture(autouse=True)
def fresh_caches():
    """Empty per-process caches: every load below goes to the disk cache."""
    for cached in (load_dataset, partition_for, client_data, load_partition):
        cached.cache_clear()
    yield
    for cached in (load_dataset, partition_for, client_data, load_partition):
        cached.cache_clear()


@pytest.fixture
def tiny(tmp_path):
    folder = tmp_path / "data"
    write_tiny_fashion_mnist(folder, n_train=60)
    return DataSource("fashion-mnist", str(folder), allow_download=False), tmp_path / "cache"


def entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def forbid_decoding(monkeypatch):
    def fail(self):
        raise AssertionError("decoded although the cache holds the data")
    monkeypatch.setattr(DataSource, "load", fail)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_a_cached_partition_has_the_bytes_of_the_in_memory_one(tiny, scheme):
    source, cache = tiny
    spec = PartitionSpec(scheme, seed=3, min_size=1)
    for pid in range(3):
        part = load_partition(source, spec, pid, 3, str(cache))
        x, y = client_data(source.load(), spec, pid, 3)
        assert part.x.tobytes() == x.numpy().tobytes() and part.x.dtype == np.float32
        assert part.y.tobytes() == y.numpy().tobytes() and part.y.dtype == np.int64
        assert part.input_shape == (1, 28, 28) and part.num_classes == 10
    assert len(entries(cache)) == 2  # the decoded dataset once, the partition table once


def test_natural_groups_are_cached_with_the_dataset(tmp_path):
    source, spec = DataSource("synthetic"), PartitionSpec("natural")
    part = load_partition(source, spec, 4, 30, str(tmp_path))
    x, y = client_data(source.load(), spec, 4, 30)
    assert part.x.tobytes() == x.numpy().tobytes() and part.y.tobytes() == y.numpy().tobytes()


def test_a_new_process_maps_the_cache_without_decoding(tiny, monkeypatch):
    source, cache = tiny
    spec = PartitionSpec("dirichlet", min_size=1)
    first = load_partition(source, spec, 1, 2, str(cache))
    load_partition.cache_clear()  # as in a new process
    forbid_decoding(monkeypatch)
    second = load_partition(source, spec, 1, 2, str(cache))
    assert second is not first and second.x.tobytes() == first.x.tobytes()
    # another partition of the same split: no decoding, no partitioning either
    monkeypatch.setattr(node_data, "split_labels", lambda *a: pytest.fail("re-partitioned"))
    assert len(load_partition(source, spec, 0, 2, str(cache)).y) + len(second.y) == 60


def test_every_input_of_the_arrays_selects_its_own_entry(tiny):
    source, cache = tiny
    base = PartitionSpec("dirichlet", seed=0, min_size=1)
    load_partition(source, base, 0, 2, str(cache))
    seen = set(entries(cache))
    variants = [
        (source, PartitionSpec("dirichlet", seed=1, min_size=1), 2),
        (source, PartitionSpec("dirichlet", seed=0, alpha=0.1, min_size=1), 2),
        (source, PartitionSpec("iid", seed=0), 2),
        (source, base, 3),
        (DataSource(source.name, source.data_dir, False, normalize=False), base, 2),
    ]
    for variant_source, spec, n in variants:
        load_partition(variant_source, spec, 0, n, str(cache))
        new = set(entries(cache)) - seen
        assert len(new) == (2 if variant_source is not source else 1), (spec, n)
        seen |= new


def test_changed_source_files_make_the_entry_stale_and_it_is_rebuilt(tiny, caplog):
    source, cache = tiny
    spec = PartitionSpec("iid")
    old = load_partition(source, spec, 0, 2, str(cache))
    load_partition.cache_clear()
    load_dataset.cache_clear()
    time.sleep(0.01)
    write_tiny_fashion_mnist(Path(source.data_dir), n_train=60, seed=7)  # new contents
    with caplog.at_level(logging.WARNING, logger="flwr"):
        new = load_partition(source, spec, 0, 2, str(cache))
    stale = [m for m in warnings_of(caplog) if "stale" in m]
    assert len(stale) == 2  # one line per rebuilt entry (dataset, partition table)
    assert new.x.tobytes() != old.x.tobytes()
    x, _ = client_data(load_dataset(source.name, source.data_dir, False), spec, 0, 2)
    assert new.x.tobytes() == x.numpy().tobytes()
    assert len(entries(cache)) == 2  # rebuilt in place


@pytest.mark.parametrize("damage", ["truncate", "flip-a-byte", "delete", "manifest"])
def test_a_corrupt_entry_is_rebuilt_with_one_log_line(tiny, caplog, damage):
    source, cache = tiny
    spec = PartitionSpec("iid")
    good = load_partition(source, spec, 1, 2, str(cache)).x.tobytes()
    dataset_entry = max(entries(cache), key=lambda p: (p / "x_train.npy").exists())
    target = dataset_entry / "x_train.npy"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:-100])
    elif damage == "flip-a-byte":  # same size: only the checksum can tell
        data = bytearray(target.read_bytes())
        data[-1] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "delete":
        target.unlink()
    else:
        (dataset_entry / "manifest.json").write_text("{ not json")
    load_partition.cache_clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        again = load_partition(source, spec, 1, 2, str(cache))
    rebuilt = [m for m in warnings_of(caplog) if "rebuilding" in m]
    assert len(rebuilt) == 1 and str(dataset_entry) in rebuilt[0], warnings_of(caplog)
    assert again.x.tobytes() == good
    caplog.clear()
    load_partition.cache_clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        load_partition(source, spec, 1, 2, str(cache))
    assert warnings_of(caplog) == []  # verified and trusted from now on


def test_a_process_reads_a_verified_entry_once_then_checks_only_its_stats(tmp_path,
                                                                          monkeypatch):
    cache = ArrayCache(tmp_path)
    first = cache.load({"kind": "test"}, {"v": 1}, lambda: ({"x": np.arange(4.0)}, {}))
    assert not first.arrays["x"].flags.writeable  # shared by the later loads
    monkeypatch.setattr(ArrayCache, "_read", lambda *a, **k: pytest.fail("read again"))
    again = cache.load({"kind": "test"}, {"v": 1}, lambda: pytest.fail("built again"))
    assert again is first
    monkeypatch.undo()
    (first.path / "x.npy").write_bytes((first.path / "x.npy").read_bytes())  # same bytes
    monkeypatch.setattr(ArrayCache, "_read", lambda *a, **k: (None, "read again"))
    with pytest.raises(RuntimeError, match="read again"):  # a new ctime: verified anew
        cache.load({"kind": "test"}, {"v": 1}, lambda: ({"x": np.arange(4.0)}, {}))


def test_a_copied_cache_is_checked_in_full_once_then_trusted(tiny, tmp_path, caplog):
    source, cache = tiny
    spec = PartitionSpec("iid")
    good = load_partition(source, spec, 0, 2, str(cache)).x.tobytes()
    copy = tmp_path / "copy"
    shutil.copytree(cache, copy)  # new inodes and ctimes, same bytes
    load_partition.cache_clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert load_partition(source, spec, 0, 2, str(copy)).x.tobytes() == good
    assert warnings_of(caplog) == []
    entry = next(p for p in entries(copy) if (p / "x_train.npy").exists())
    info = json.loads((entry / "manifest.json").read_text())["arrays"]["x_train"]
    assert info["stat"] == file_stat(entry / "x_train.npy")  # the new stat is trusted now


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    cache = ArrayCache(tmp_path)

    def broken():
        raise ValueError("the source file is corrupt")

    with pytest.raises(ValueError, match="corrupt"):
        cache.load({"a": 1}, {}, broken)
    assert [p.name for p in tmp_path.iterdir()] == [f"{entry_name({'a': 1})}.lock"]


def test_an_unusable_cache_folder_falls_back_to_memory_with_one_warning(tiny, tmp_path, caplog):
    source, _ = tiny
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="flwr"):
        part = load_partition(source, PartitionSpec("iid"), 0, 2, str(blocker / "cache"))
    assert len(warnings_of(caplog)) == 1 and "decoding in memory" in warnings_of(caplog)[0]
    x, _ = client_data(source.load(), PartitionSpec("iid"), 0, 2)
    assert part.x.tobytes() == x.numpy().tobytes()


def _fill(args) -> str:
    root, log = args
    cache = ArrayCache(Path(root))

    def build():
        with open(log, "a") as handle:
            handle.write("built\n")
        time.sleep(0.5)  # long enough for the others to arrive while it builds
        return {"x": np.arange(1000, dtype=np.float32)}, {"who": "first"}

    entry = cache.load({"kind": "test"}, {"v": 1}, build)
    return entry.arrays["x"].tobytes().hex()[:64] + json.dumps(entry.meta)


@pytest.mark.usefixtures("processes")
def test_processes_filling_one_entry_at_once_build_it_once(tmp_path):
    log = tmp_path / "builds.txt"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_fill, [(str(tmp_path / "cache"), str(log))] * 4)
    assert log.read_text() == "built\n"
    assert len(set(results)) == 1
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]


def test_out_of_range_partition_id(tiny):
    source, cache = tiny
    with pytest.raises(ValueError, match="partition-id=2 is outside"):
        load_partition(source, PartitionSpec("iid"), 2, 2, str(cache))

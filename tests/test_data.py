"""Tests for task.data: IDX decoding, the Fashion-MNIST lookup order, caching,
client partitions, the Synthetic(alpha, beta) generator and dataset names.

No test uses the network: every load_dataset call passes allow_download=False.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import task.data as data
from task.data import (
    DATASET_NAMES,
    IDX_FILES,
    DataNotFoundError,
    PartitionSpec,
    check_dataset_name,
    client_data,
    load_dataset,
    partition_for,
    read_idx,
    synthetic_dataset,
)

N_TRAIN, N_TEST = 20, 10


# ----------------------------------------------------------------- helpers
def idx_bytes(array: np.ndarray) -> bytes:
    """IDX encoding of a uint8 array: magic (0, 0x08, ndim), big-endian dims, data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    raw = idx_bytes(array)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)
    return path


def tiny_arrays(n_train: int = N_TRAIN, n_test: int = N_TEST, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "y_train": (np.arange(n_train) % 10).astype(np.uint8),
        "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "y_test": (np.arange(n_test) % 10).astype(np.uint8),
    }


def write_tiny_fashion_mnist(folder: Path, gz: bool | dict = True, **kwargs) -> dict[str, np.ndarray]:
    """The four Fashion-MNIST IDX files with tiny contents; gz may be per key."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = tiny_arrays(**kwargs)
    for key, stem in IDX_FILES.items():
        use_gz = gz[key] if isinstance(gz, dict) else gz
        write_idx(folder / stem, arrays[key], gz=use_gz)
    return arrays


def clear_caches() -> None:
    load_dataset.cache_clear()
    partition_for.cache_clear()
    client_data.cache_clear()


@pytest.fixture(autouse=True)
def fresh_caches():
    """Every test starts (and leaves) with empty per-process data caches."""
    clear_caches()
    yield
    clear_caches()


@pytest.fixture
def tiny_dir(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    folder = tmp_path / "data"
    return folder, write_tiny_fashion_mnist(folder)


# ----------------------------------------------------------------- read_idx
@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize("shape", [(7,), (3, 4, 5), (2, 3, 4, 2)])
def test_read_idx_shape_and_values(tmp_path, gz, shape):
    array = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).astype(np.uint8)
    path = write_idx(tmp_path / "file-idx", array, gz=gz)
    out = read_idx(path)
    assert out.dtype == np.uint8
    assert out.shape == shape
    np.testing.assert_array_equal(out, array)


def test_read_idx_truncated_body_names_file_and_problem(tmp_path):
    path = tmp_path / "short-idx3-ubyte"
    path.write_bytes(idx_bytes(np.zeros((4, 5, 5), np.uint8))[:-7])
    with pytest.raises(ValueError) as err:
        read_idx(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "truncated" in msg
    assert "100" in msg and "93" in msg  # header's count vs. what the file has


def test_read_idx_too_long_body_is_rejected(tmp_path):
    path = tmp_path / "long-idx1-ubyte"
    path.write_bytes(idx_bytes(np.zeros(10, np.uint8)) + b"\x00\x01")
    with pytest.raises(ValueError, match="truncated or corrupt") as err:
        read_idx(path)
    assert str(path) in str(err.value)


def test_read_idx_tiny_file_names_file(tmp_path):
    path = tmp_path / "two-bytes"
    path.write_bytes(b"\x00\x00")
    with pytest.raises(ValueError) as err:
        read_idx(path)
    assert str(path) in str(err.value)
    assert "not an IDX file" in str(err.value)


@pytest.mark.parametrize("header", [b"\x01\x00\x08\x01", b"\x00\x00\x0d\x01", b"PK\x03\x04"],
                         ids=["nonzero-magic", "float-dtype", "zip"])
def test_read_idx_wrong_magic_names_file_and_problem(tmp_path, header):
    path = tmp_path / "bad-magic"
    path.write_bytes(header + struct.pack(">I", 3) + b"\x00\x01\x02")
    with pytest.raises(ValueError) as err:
        read_idx(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "not an unsigned-byte IDX file" in msg
    assert header.hex() in msg


def test_read_idx_wrong_magic_gz(tmp_path):
    path = tmp_path / "bad-magic.gz"
    path.write_bytes(gzip.compress(b"\x12\x34\x08\x01" + struct.pack(">I", 1) + b"\x00"))
    with pytest.raises(ValueError) as err:
        read_idx(path)
    assert str(path) in str(err.value)


def test_read_idx_truncated_header_names_file(tmp_path):
    path = tmp_path / "cut-in-header-idx3-ubyte"
    full = idx_bytes(np.zeros((4, 5, 5), np.uint8))
    path.write_bytes(full[:8])  # magic + first of three dimensions
    with pytest.raises(ValueError) as err:
        read_idx(path)
    assert str(path) in str(err.value)


def test_read_idx_truncated_gz_names_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    packed = gzip.compress(idx_bytes(np.arange(250, dtype=np.uint8).reshape(10, 5, 5)))
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ValueError) as err:
        read_idx(path)
    assert str(path) in str(err.value)


# ----------------------------------------------------------------- Fashion-MNIST lookup
def expected_standardised(arrays):
    x_train = torch.from_numpy(arrays["x_train"].astype(np.float32) / 255.0)
    x_test = torch.from_numpy(arrays["x_test"].astype(np.float32) / 255.0)
    mean, std = x_train.mean(), x_train.std()
    return ((x_train - mean) / std).unsqueeze(1), ((x_test - mean) / std).unsqueeze(1)


@pytest.mark.parametrize("gz", [True, False, {"x_train": True, "y_train": False, "x_test": False, "y_test": True}],
                         ids=["gz", "raw", "mixed"])
def test_load_from_configured_data_dir(tmp_path, gz):
    folder = tmp_path / "data"
    arrays = write_tiny_fashion_mnist(folder, gz=gz)
    ds = load_dataset("fashion-mnist", data_dir=str(folder), allow_download=False)
    # The configured folder wins over the system copy (which has 60000 images).
    assert ds.source == str(folder)
    assert ds.name == "fashion-mnist"
    assert ds.num_classes == 10
    assert ds.x_train.shape == (N_TRAIN, 1, 28, 28)
    assert ds.x_test.shape == (N_TEST, 1, 28, 28)
    assert ds.input_shape == (1, 28, 28)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert ds.y_test.dtype == torch.int64
    np.testing.assert_array_equal(ds.y_train.numpy(), arrays["y_train"])
    np.testing.assert_array_equal(ds.y_test.numpy(), arrays["y_test"])
    # Standardised with the *training* set's statistics, test set included.
    exp_train, exp_test = expected_standardised(arrays)
    torch.testing.assert_close(ds.x_train, exp_train)
    torch.testing.assert_close(ds.x_test, exp_test)
    assert abs(float(ds.x_train.mean())) < 1e-5
    assert abs(float(ds.x_train.std()) - 1.0) < 1e-5


def test_normalize_false_keeps_pixels_in_unit_interval(tmp_path):
    """NIID-Bench's preprocessing (ToTensor only): x = pixel / 255, train and test."""
    folder = tmp_path / "data"
    arrays = write_tiny_fashion_mnist(folder)
    ds = load_dataset("fashion-mnist", data_dir=str(folder), allow_download=False,
                      normalize=False)
    for key, x in (("x_train", ds.x_train), ("x_test", ds.x_test)):
        expected = torch.from_numpy(arrays[key].astype(np.float32) / 255.0).unsqueeze(1)
        torch.testing.assert_close(x, expected, rtol=0, atol=0)
    assert float(ds.x_train.min()) >= 0.0 and float(ds.x_train.max()) <= 1.0
    standardised = load_dataset("fashion-mnist", data_dir=str(folder), allow_download=False)
    assert standardised is not ds  # cached per normalize value


def test_load_from_fashion_mnist_subfolder_of_data_dir(tmp_path):
    folder = tmp_path / "data"
    write_tiny_fashion_mnist(folder / "fashion-mnist")
    ds = load_dataset("fashion-mnist", data_dir=str(folder), allow_download=False)
    assert ds.source == str(folder / "fashion-mnist")
    assert ds.x_train.shape == (N_TRAIN, 1, 28, 28)


def test_incomplete_data_dir_falls_back_to_system_copy(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    write_tiny_fashion_mnist(folder)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()  # incomplete: must be skipped
    system = tmp_path / "system"
    write_tiny_fashion_mnist(system, n_train=30, n_test=5, seed=1)
    monkeypatch.setattr(data, "SYSTEM_FASHION_MNIST", system)
    ds = load_dataset("fashion-mnist", data_dir=str(folder), allow_download=False)
    assert ds.source == str(system)
    assert ds.x_train.shape == (30, 1, 28, 28)
    assert ds.x_test.shape == (5, 1, 28, 28)


def test_nothing_found_raises_data_not_found_naming_everything(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    missing_system = tmp_path / "no-such-system-dir"
    monkeypatch.setattr(data, "SYSTEM_FASHION_MNIST", missing_system)
    with pytest.raises(DataNotFoundError) as err:
        load_dataset("fashion-mnist", data_dir=str(empty), allow_download=False)
    assert isinstance(err.value, FileNotFoundError)
    msg = str(err.value)
    assert str(empty) in msg
    assert str(missing_system) in msg
    assert "download" in msg and "disabled" in msg
    assert "dataset-fashion-mnist" in msg  # the apt package
    assert "data-dir" in msg  # how to point at a folder


def test_nothing_found_without_data_dir(tmp_path, monkeypatch):
    missing_system = tmp_path / "nope"
    monkeypatch.setattr(data, "SYSTEM_FASHION_MNIST", missing_system)
    with pytest.raises(DataNotFoundError) as err:
        load_dataset("fashion-mnist", data_dir="", allow_download=False)
    assert str(missing_system) in str(err.value)
    assert "dataset-fashion-mnist" in str(err.value)


def test_system_fashion_mnist():
    system = Path("/usr/share/datasets/fashion-mnist")
    if not all((system / f"{stem}.gz").is_file() or (system / stem).is_file() for stem in IDX_FILES.values()):
        pytest.skip("/usr/share/datasets/fashion-mnist (package dataset-fashion-mnist) is not installed")
    ds = load_dataset("fashion-mnist", data_dir="", allow_download=False)
    assert ds.source == str(data.SYSTEM_FASHION_MNIST)
    assert ds.num_classes == 10
    assert ds.x_train.shape == (60000, 1, 28, 28)
    assert ds.x_test.shape == (10000, 1, 28, 28)
    assert ds.y_train.shape == (60000,) and ds.y_test.shape == (10000,)
    # Fashion-MNIST is balanced: 6000 / 1000 images per class.
    assert torch.bincount(ds.y_train).tolist() == [6000] * 10
    assert torch.bincount(ds.y_test).tolist() == [1000] * 10
    assert abs(float(ds.x_train.mean())) < 1e-3
    assert abs(float(ds.x_train.std()) - 1.0) < 1e-3
    assert torch.isfinite(ds.x_test).all()
    # Loaded once per process.
    assert load_dataset("fashion-mnist", data_dir="", allow_download=False) is ds


# ----------------------------------------------------------------- caching and partitions
def test_load_dataset_cached_per_args(tiny_dir, tmp_path):
    folder, _ = tiny_dir
    first = load_dataset("fashion-mnist", data_dir=str(folder), allow_download=False)
    assert load_dataset("fashion-mnist", data_dir=str(folder), allow_download=False) is first
    assert load_dataset.cache_info().hits == 1 and load_dataset.cache_info().misses == 1
    other = tmp_path / "other"
    write_tiny_fashion_mnist(other)
    assert load_dataset("fashion-mnist", data_dir=str(other), allow_download=False) is not first


def test_client_data_cached(tiny_dir):
    folder, _ = tiny_dir
    ds = load_dataset("fashion-mnist", data_dir=str(folder), allow_download=False)
    spec = PartitionSpec("iid")
    first = client_data(ds, spec, 1, 4)
    second = client_data(ds, spec, 1, 4)
    assert second is first
    assert second[0] is first[0] and second[1] is first[1]
    # An equal (not identical) spec hits the same cache entry.
    assert client_data(ds, PartitionSpec("iid"), 1, 4) is first


@pytest.mark.parametrize("num_partitions", [1, 3, 4, 7])
def test_partitions_disjoint_and_cover_training_set(tiny_dir, num_partitions):
    folder, _ = tiny_dir
    ds = load_dataset("fashion-mnist", data_dir=str(folder), allow_download=False)
    spec = PartitionSpec("iid")
    parts = [client_data(ds, spec, pid, num_partitions) for pid in range(num_partitions)]
    indices = partition_for(ds, spec, num_partitions)
    assert len(indices) == num_partitions
    all_idx = np.concatenate([np.asarray(i) for i in indices])
    np.testing.assert_array_equal(np.sort(all_idx), np.arange(N_TRAIN))
    for (x, y), idx in zip(parts, indices):
        assert torch.equal(x, ds.x_train[torch.as_tensor(np.asarray(idx))])
        assert torch.equal(y, ds.y_train[torch.as_tensor(np.asarray(idx))])
    # Check on the tensors themselves: every training image lands in exactly one client.
    x_all = torch.cat([x for x, _ in parts]).flatten(1)
    assert len(x_all) == N_TRAIN
    matches = (x_all[:, None, :] == ds.x_train.flatten(1)[None, :, :]).all(dim=2)
    assert matches.sum(dim=0).tolist() == [1] * N_TRAIN
    assert matches.sum(dim=1).tolist() == [1] * N_TRAIN
    assert sorted(torch.cat([y for _, y in parts]).tolist()) == sorted(ds.y_train.tolist())


@pytest.mark.parametrize("partition_id", [-1, 4, 10])
def test_client_data_partition_id_out_of_range(tiny_dir, partition_id):
    folder, _ = tiny_dir
    ds = load_dataset("fashion-mnist", data_dir=str(folder), allow_download=False)
    with pytest.raises(ValueError) as err:
        client_data(ds, PartitionSpec("iid"), partition_id, 4)
    msg = str(err.value)
    assert f"partition-id={partition_id}" in msg
    assert "num-partitions=4" in msg


# ----------------------------------------------------------------- Synthetic(alpha, beta)
@pytest.fixture(scope="module")
def synthetic():
    return synthetic_dataset(1.0, 1.0)


def test_synthetic_deterministic(synthetic):
    again = synthetic_dataset(1.0, 1.0)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(again, name), getattr(synthetic, name)), name
    np.testing.assert_array_equal(again.natural_ids, synthetic.natural_ids)


def test_synthetic_seed_and_parameters_matter():
    a = synthetic_dataset(1.0, 1.0, num_devices=3, seed=0)
    b = synthetic_dataset(1.0, 1.0, num_devices=3, seed=1)
    c = synthetic_dataset(0.0, 0.0, num_devices=3, seed=0)
    assert a.x_train.shape != b.x_train.shape or not torch.equal(a.x_train, b.x_train)
    assert a.x_train.shape == c.x_train.shape  # sizes come first from the rng
    assert not torch.equal(a.x_train, c.x_train)


def test_synthetic_shapes_classes_and_natural_ids(synthetic):
    ds = synthetic
    assert ds.name == "synthetic"
    assert ds.num_classes == 10
    assert ds.input_shape == (1, 1, 60)
    assert ds.x_train.shape[1:] == (1, 1, 60) and ds.x_test.shape[1:] == (1, 1, 60)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert ds.y_test.dtype == torch.int64
    assert len(ds.y_train) == len(ds.x_train) and len(ds.y_test) == len(ds.x_test)
    assert set(ds.y_train.unique().tolist()) <= set(range(10))
    assert len(ds.y_train.unique()) == 10
    assert ds.natural_ids is not None
    assert ds.natural_ids.shape == (len(ds.y_train),)
    assert set(np.unique(ds.natural_ids).tolist()) == set(range(30))
    assert "alpha=1.0" in ds.source and "beta=1.0" in ds.source


def test_synthetic_train_test_split_per_device(synthetic):
    ds = synthetic
    # Device sizes are the generator's first draw: log-normal(4, 2) + 50.
    sizes = np.random.default_rng(0).lognormal(4, 2, 30).astype(int) + 50
    assert len(ds.y_train) + len(ds.y_test) == sizes.sum()
    train_per_device = np.bincount(ds.natural_ids, minlength=30)
    np.testing.assert_array_equal(train_per_device, sizes - np.maximum(1, sizes // 5))
    ratio = train_per_device / sizes
    assert np.all((ratio > 0.75) & (ratio <= 0.82))
    assert 0.18 < len(ds.y_test) / sizes.sum() < 0.21
    # Disjoint: no test sample is also a training sample (continuous features).
    train_rows = ds.x_train.flatten(1)
    test_rows = ds.x_test.flatten(1)
    assert torch.cdist(test_rows.double(), train_rows.double()).min() > 0


def test_synthetic_through_load_dataset():
    ds = load_dataset("synthetic", synthetic_alpha=0.5, synthetic_beta=0.5, allow_download=False)
    assert ds.name == "synthetic" and "alpha=0.5" in ds.source
    assert load_dataset("synthetic", synthetic_alpha=0.5, synthetic_beta=0.5, allow_download=False) is ds
    parts = partition_for(ds, PartitionSpec("natural"), 30)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(ds.y_train)))


# ----------------------------------------------------------------- dataset names
@pytest.mark.parametrize("name", ["fashion-mnist", "mnist", "cifar10", "cifar100", "synthetic",
                                  "hf:flwrlabs/femnist", "hf:x"])
def test_check_dataset_name_accepts(name):
    check_dataset_name(name)


@pytest.mark.parametrize("name", ["foo", "hf:", "", "Fashion-MNIST", "hf"])
def test_check_dataset_name_rejects(name):
    with pytest.raises(ValueError) as err:
        check_dataset_name(name)
    msg = str(err.value)
    assert repr(name) in msg
    for known in DATASET_NAMES:
        assert known in msg


def test_load_dataset_rejects_unknown_name():
    with pytest.raises(ValueError, match="'foo'"):
        load_dataset("foo", allow_download=False)

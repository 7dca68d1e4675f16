"""Data sources, decoded once per process and held as tensors.

Datasets (``DATASET_NAMES``):

* ``fashion-mnist`` (default): IDX files looked up in (1) the configured data
  directory, (2) ``/usr/share/datasets/fashion-mnist`` (Debian/Ubuntu package
  ``dataset-fashion-mnist``), (3) torchvision's download into the user cache when
  online. If none works, one error names all three.
* ``mnist``, ``cifar10``, ``cifar100``: torchvision, from the data directory (or the
  user cache), downloaded there when online.
* ``synthetic``: Synthetic(alpha, beta) of FedProx (Li et al. MLSys'20, Sec. 5.1),
  generated, always available, with one natural partition per device.
* ``hf:<hub-id>``: a Hugging Face Hub image dataset through flwr-datasets'
  ``FederatedDataset`` (needs the network on first use; e.g. ``hf:flwrlabs/femnist``).

Images become float32 tensors (N, C, H, W) standardised with the training set's
per-channel mean and std (``normalize=False``: pixels / 255 in [0, 1], as torchvision's
``ToTensor()`` gives them, NIID-Bench's preprocessing); labels int64. The statistics come
from the training images' pixel histogram (:func:`channel_stats`), so every process gets
the same ones whatever its thread count, and a server that evaluates on the test split
(``with_train=False``) never holds the training set as floats.

Validation split (``validation_fraction`` > 0, run-config ``evaluation-split =
"validation"``): a fixed, label-stratified share of the *training* examples
(:func:`validation_indices`) is held out before anything partitions the training set; it
becomes ``x_validation`` / ``y_validation``, and ``x_train`` / ``y_train`` (and the natural
groups) are the rest, so hyper-parameters are tuned on data that neither the clients train
on nor the test split holds. The held-out examples depend on the labels and the fraction
alone, never on a run's seed: every tuning run of every method and seed validates on the
same examples. Pixels are standardised with the statistics of the whole training split, as
without a carve-out (a preprocessing constant; no label or model sees those examples).
"""

from __future__ import annotations

import functools
import gzip
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .partition import partition_indices

if TYPE_CHECKING:  # torch is imported by the functions that build tensors, so that the
    import torch  # run-config check and a cached partition need no torch (task.cache)

DATASET_NAMES = ("fashion-mnist", "mnist", "cifar10", "cifar100", "synthetic", "hf:<hub-id>")
SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


class DataNotFoundError(FileNotFoundError):
    """A dataset could not be found or fetched; the message says where we looked."""


@dataclass(frozen=True, eq=False)
class TensorDataset:
    """A whole dataset in memory: train/test tensors plus metadata."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    natural_ids: np.ndarray | None = field(default=None)
    source: str = ""
    # the training examples held out for tuning (validation_fraction > 0), else None
    x_validation: torch.Tensor | None = field(default=None)
    y_validation: torch.Tensor | None = field(default=None)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])  # type: ignore[return-value]


@dataclass(frozen=True)
class PartitionSpec:
    """How the training set is split among clients (see task.partition)."""

    scheme: str = "iid"
    seed: int = 0
    alpha: float = 0.5
    min_size: int = 10
    classes_per_partition: int = 2
    shards_per_partition: int = 2
    sigma: float = 0.5


@dataclass(frozen=True)
class DataSource:
    """Which dataset, from where, decoded how: the arguments of :func:`load_dataset`."""

    name: str = "fashion-mnist"
    data_dir: str = ""
    allow_download: bool = True
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    normalize: bool = True
    validation_fraction: float = 0.0  # > 0: this share of the training set is held out

    def load(self) -> TensorDataset:
        """The whole dataset as tensors (once per process), the validation split held out of
        the training split when ``validation_fraction`` > 0."""
        return load_dataset(self.name, self.data_dir, self.allow_download,
                            self.synthetic_alpha, self.synthetic_beta, self.normalize,
                            validation_fraction=self.validation_fraction)


# torchvision's folder of each dataset's files below its root
TORCHVISION_FOLDERS = {"fashion-mnist": "FashionMNIST/raw", "mnist": "MNIST/raw",
                       "cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


def source_files(source: DataSource) -> list[Path] | None:
    """The files :func:`load_dataset` would decode for ``source``, found without decoding
    them ([] for ``synthetic``, which is generated); None when they are not on this
    machine (yet) or cannot be named (``hf:`` datasets live in the Hugging Face cache)."""
    if source.name == "synthetic":
        return []
    if source.name == "fashion-mnist" and (folder := fashion_mnist_folder(source.data_dir)):
        return [idx_path(folder, stem) for stem in IDX_FILES.values()]
    if source.name in TORCHVISION_FOLDERS and (source.name != "fashion-mnist"
                                               or source.allow_download):
        root = Path(source.data_dir) if source.data_dir else default_cache_dir()
        folder = root / TORCHVISION_FOLDERS[source.name]
        files = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        return files or None
    return None


def default_cache_dir() -> Path:
    """Per-user data cache: $XDG_CACHE_HOME/fedhetero/data or ~/.cache/fedhetero/data."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedhetero" / "data"


def train_labels(source: DataSource) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(the training labels as int64, in the order of the loaded ``y_train``; the natural
    groups or None) of ``source``, found without decoding an image: the label IDX file of
    the files :func:`load_dataset` would read (Fashion-MNIST, MNIST), Synthetic's numpy
    generator. None where the labels come only with the images (CIFAR's pickles, ``hf:``)
    or the files are not on this machine. What :func:`split_labels` needs to give every
    partition's size before anything loads the data. With ``validation_fraction`` > 0, those
    of the examples the clients train on (:func:`training_rows`), as ``y_train`` then is."""
    if source.name == "synthetic":
        arrays = synthetic_arrays(source.synthetic_alpha, source.synthetic_beta)
        labels, natural_ids = arrays["y_train"].astype(np.int64), arrays["natural_ids"]
    else:
        files = source_files(source) or []
        found = next((f for f in files if f.name.split(".")[0] == IDX_FILES["y_train"]), None)
        if found is None:
            return None
        labels, natural_ids = read_idx(found).astype(np.int64), None
    if not source.validation_fraction:
        return labels, natural_ids
    rows = training_rows(labels, source.validation_fraction, source.name)
    return labels[rows], None if natural_ids is None else natural_ids[rows]


def missing_idx_files(folder: Path) -> list[str]:
    """The Fashion-MNIST IDX files (their names without ``.gz``) that ``folder`` lacks."""
    return [stem for stem in IDX_FILES.values() if not idx_path(folder, stem).is_file()]


def download_hosts(name: str) -> list[tuple[str, int]]:
    """(host, port) of each place torchvision downloads dataset ``name`` from (its mirrors),
    or of the proxy urllib would use for them; [] for a dataset torchvision does not fetch."""
    import urllib.request  # noqa: PLC0415
    from urllib.parse import urlsplit  # noqa: PLC0415

    if name not in TORCHVISION_FOLDERS:
        return []
    import torchvision.datasets as tv  # noqa: PLC0415 - heavy: only when a download is needed

    kind = {"fashion-mnist": tv.FashionMNIST, "mnist": tv.MNIST, "cifar10": tv.CIFAR10,
            "cifar100": tv.CIFAR100}[name]
    urls = list(getattr(kind, "mirrors", None) or [kind.url])
    proxies = urllib.request.getproxies()
    hosts = []
    for url in urls:
        scheme = urlsplit(url).scheme
        parts = urlsplit(proxies[scheme]) if scheme in proxies else urlsplit(url)
        hosts.append((parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)))
    return hosts


def download_reachable(hosts: list[tuple[str, int]], timeout: float = 5.0) -> bool:
    """True when a TCP connection to one of ``hosts`` opens within ``timeout`` seconds (name
    lookup included): a download can start. Nothing is sent."""
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415

    reached: list[bool] = []

    def probe() -> None:
        for host, port in hosts:
            try:
                socket.create_connection((host, port), timeout=timeout).close()
            except OSError:
                continue
            reached.append(True)
            return

    worker = threading.Thread(target=probe, daemon=True)  # a hung name lookup is left behind
    worker.start()
    worker.join(timeout)
    return bool(reached)


def check_dataset_name(name: str) -> None:
    """Raise ValueError unless ``name`` is a known dataset."""
    if name.startswith("hf:") and len(name) > 3:
        return
    if name not in DATASET_NAMES[:-1]:
        raise ValueError(
            f"dataset={name!r} is not known; use one of {', '.join(DATASET_NAMES)}"
        )


@functools.lru_cache(maxsize=4)
def load_dataset(
    name: str,
    data_dir: str = "",
    allow_download: bool = True,
    synthetic_alpha: float = 1.0,
    synthetic_beta: float = 1.0,
    normalize: bool = True,
    with_train: bool = True,
    validation_fraction: float = 0.0,
) -> TensorDataset:
    """Load (once per process) a dataset as tensors.

    ``normalize``: standardise image pixels per channel (default), or keep them in [0, 1]
    (no effect on ``synthetic``, whose features are not pixels). ``with_train=False``:
    the test split only (what a server evaluating the global model needs), normalised
    exactly as with the training split; ``x_train`` / ``y_train`` are then empty tensors
    that still give ``input_shape``. ``validation_fraction`` > 0: that share of the
    training examples is held out as ``x_validation`` / ``y_validation`` and ``x_train`` /
    ``y_train`` are the rest (:func:`with_validation`; kept with ``with_train=False``).
    """
    check_dataset_name(name)
    decode_train = with_train or validation_fraction > 0
    if name == "fashion-mnist":
        data = _fashion_mnist(data_dir, allow_download, normalize, decode_train)
    elif name in ("mnist", "cifar10", "cifar100"):
        data = _torchvision(name, data_dir, allow_download, normalize, decode_train)
    elif name == "synthetic":
        data = synthetic_dataset(synthetic_alpha, synthetic_beta)
    else:
        data = _hub(name[3:], normalize, decode_train)
    if validation_fraction:
        data = with_validation(data, validation_fraction)
    return data if with_train or len(data.y_train) == 0 else without_train(data)


# ----------------------------------------------------------------- validation split
EVALUATION_SPLITS = ("test", "validation")  # what the server evaluates on (evaluation-split)
MAX_VALIDATION_FRACTION = 0.5  # at least half of the training set stays for the clients
MIN_VALIDATION_EXAMPLES = 100  # a held-out accuracy in steps of at most 1 %
# the held-out examples' own random stream: not the run's seed nor the partition's, so that
# every run (method, seed, partition) of one dataset and fraction holds out the same ones
VALIDATION_SEED = int.from_bytes(b"validation", "big")


def validation_indices(labels: np.ndarray, fraction: float, dataset: str = "") -> np.ndarray:
    """The sorted int64 rows of a training set with ``labels`` that are held out for
    validation: per label with n_c examples, round(fraction · n_c) of them (at most
    n_c − 1, so every label keeps a training example), drawn without replacement on
    :data:`VALIDATION_SEED`'s stream, labels in increasing order (stratified: the held-out
    label mix is the training set's). A pure function of ``labels`` and ``fraction``.

    ValueError, naming the run-config keys, the value and the fix, for a ``fraction``
    outside (0, :data:`MAX_VALIDATION_FRACTION`] or a training set too small to hold out
    :data:`MIN_VALIDATION_EXAMPLES` examples at this fraction (``dataset`` names it)."""
    labels = np.asarray(labels)
    fix = (f"Fix: set validation-fraction in (0, {MAX_VALIDATION_FRACTION:g}] so that at least "
           f"{MIN_VALIDATION_EXAMPLES} examples are held out, or evaluation-split='test'")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating)) \
            or not 0 < fraction <= MAX_VALIDATION_FRACTION:
        raise ValueError(f"evaluation-split='validation' with validation-fraction={fraction!r}: "
                         f"the fraction must be in (0, {MAX_VALIDATION_FRACTION:g}]. {fix}")
    rng = np.random.default_rng(VALIDATION_SEED)
    held = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        held.append(rng.choice(members, size=held_per_label(fraction, len(members)),
                               replace=False))
    rows = np.sort(np.concatenate(held)).astype(np.int64) if held else np.zeros(0, np.int64)
    if len(rows) < MIN_VALIDATION_EXAMPLES:
        counts = np.unique(labels, return_counts=True)[1]
        grid = [step / 100 for step in range(1, int(100 * MAX_VALIDATION_FRACTION) + 1)]
        enough = next((f for f in grid if sum(held_per_label(f, int(n)) for n in counts)
                       >= MIN_VALIDATION_EXAMPLES), None)
        fix = ("Fix: evaluation-split='test' (this training split is too small to hold out "
               f"{MIN_VALIDATION_EXAMPLES} examples)" if enough is None else
               f"Fix: validation-fraction={enough:g} (or more, at most "
               f"{MAX_VALIDATION_FRACTION:g}), or evaluation-split='test'")
        raise ValueError(
            f"evaluation-split='validation' with validation-fraction={fraction!r} holds out "
            f"{len(rows)} of the {len(labels)} training examples of "
            f"{f'dataset={dataset!r}' if dataset else 'the dataset'}: too few for a validation "
            f"accuracy (at least {MIN_VALIDATION_EXAMPLES}). {fix}")
    return rows


def held_per_label(fraction: float, examples: int) -> int:
    """How many of a label's ``examples`` are held out: round(fraction · n), at most n − 1."""
    return min(int(np.floor(fraction * examples + 0.5)), examples - 1)


def rows_without(n: int, rows: np.ndarray) -> np.ndarray:
    """The sorted int64 rows of ``range(n)`` that are not in ``rows``."""
    keep = np.ones(n, dtype=bool)
    keep[rows] = False
    return np.flatnonzero(keep).astype(np.int64)


def training_rows(labels: np.ndarray, fraction: float, dataset: str = "") -> np.ndarray:
    """The sorted int64 rows the clients train on: all but :func:`validation_indices`."""
    return rows_without(len(labels), validation_indices(labels, fraction, dataset))


def with_validation(data: TensorDataset, fraction: float) -> TensorDataset:
    """``data`` with :func:`validation_indices` of its training split moved into
    ``x_validation`` / ``y_validation`` (the natural groups of the rest kept)."""
    import torch  # noqa: PLC0415

    held = validation_indices(data.y_train.numpy(), fraction, data.name)
    kept = rows_without(len(data.y_train), held)
    ids = None if data.natural_ids is None else np.asarray(data.natural_ids)[kept]
    held_rows, kept_rows = torch.from_numpy(held), torch.from_numpy(kept)
    return TensorDataset(**{**data.__dict__, "x_train": data.x_train[kept_rows],
                            "y_train": data.y_train[kept_rows], "natural_ids": ids,
                            "x_validation": data.x_train[held_rows],
                            "y_validation": data.y_train[held_rows]})


def without_train(data: TensorDataset) -> TensorDataset:
    """``data`` with empty training tensors (same input shape, classes and test split)."""
    return TensorDataset(**{**data.__dict__, "x_train": data.x_train[:0].clone(),
                            "y_train": data.y_train[:0].clone(), "natural_ids": None})


def split_labels(labels: np.ndarray, spec: PartitionSpec, num_partitions: int,
                 natural_ids: np.ndarray | None = None) -> list[np.ndarray]:
    """The index arrays of all partitions of a training set with these labels (and natural
    groups, for ``natural``): :func:`task.partition.partition_indices` with ``spec``."""
    return partition_indices(
        np.asarray(labels), num_partitions, spec.scheme, seed=spec.seed,
        alpha=spec.alpha, min_size=spec.min_size,
        classes_per_partition=spec.classes_per_partition,
        shards_per_partition=spec.shards_per_partition, sigma=spec.sigma,
        natural_ids=natural_ids,
    )


@functools.lru_cache(maxsize=8)
def partition_for(dataset: TensorDataset, spec: PartitionSpec, num_partitions: int) -> tuple:
    """Index arrays of all partitions (computed once per process and spec)."""
    return tuple(split_labels(dataset.y_train.numpy(), spec, num_partitions, dataset.natural_ids))


@functools.lru_cache(maxsize=256)
def client_data(
    dataset: TensorDataset, spec: PartitionSpec, partition_id: int, num_partitions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of one client's partition, sliced once and kept."""
    import torch  # noqa: PLC0415

    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id={partition_id} is outside [0, {num_partitions - 1}] "
            f"for num-partitions={num_partitions}"
        )
    idx = torch.from_numpy(np.asarray(partition_for(dataset, spec, num_partitions)[partition_id]))
    return dataset.x_train[idx], dataset.y_train[idx]


# ----------------------------------------------------------------- Fashion-MNIST
def _fashion_mnist_candidates(data_dir: str) -> list[Path]:
    """Where Fashion-MNIST's IDX files are looked for, in order."""
    local = [Path(data_dir), Path(data_dir) / "fashion-mnist"] if data_dir else []
    return [*local, SYSTEM_FASHION_MNIST]


def fashion_mnist_folder(data_dir: str) -> Path | None:
    """The first folder holding all four Fashion-MNIST IDX files: ``data_dir``, then
    ``data_dir/fashion-mnist``, then the system copy; None when there is none."""
    return next((f for f in _fashion_mnist_candidates(data_dir) if _idx_folder_complete(f)),
                None)


def _fashion_mnist(data_dir: str, allow_download: bool, normalize: bool = True,
                   with_train: bool = True) -> TensorDataset:
    folder = fashion_mnist_folder(data_dir)
    if folder is not None:
        arrays = {key: read_idx(idx_path(folder, stem)) for key, stem in IDX_FILES.items()}
        return _from_uint8("fashion-mnist", arrays, 10, source=str(folder), normalize=normalize,
                           with_train=with_train)
    tried = [f"IDX files in {candidate}" for candidate in _fashion_mnist_candidates(data_dir)]
    if allow_download:
        try:
            return _torchvision("fashion-mnist", data_dir, True, normalize, with_train)
        except Exception as exc:  # noqa: BLE001 - report every way we tried
            tried.append(f"torchvision download ({type(exc).__name__}: {exc})")
    else:
        tried.append("torchvision download (disabled)")
    raise DataNotFoundError(
        "Fashion-MNIST not found. Tried: " + "; ".join(tried) + ". Fix: install the "
        "Debian package (sudo apt-get install dataset-fashion-mnist), or put the four "
        "IDX files (train-images-idx3-ubyte[.gz], ...) in a folder and set "
        "--run-config \"data-dir='/abs/folder'\", or run once with network access."
    )


def idx_path(folder: Path, stem: str) -> Path:
    """The IDX file ``stem`` in ``folder``: as is or gzipped (``<stem>.gz``), whichever exists."""
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return folder / stem


def _idx_folder_complete(folder: Path) -> bool:
    return all(idx_path(folder, stem).is_file() for stem in IDX_FILES.values())


def read_idx(path: Path) -> np.ndarray:
    """Decode one IDX file (optionally gzipped) into a numpy array."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (EOFError, OSError) as exc:
        raise ValueError(f"{path} cannot be read, it is corrupt or truncated ({exc}); "
                         "delete it and reinstall / re-download the dataset") from exc
    if len(data) < 4:
        raise ValueError(f"{path} is not an IDX file (only {len(data)} bytes)")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file (header {data[:4].hex()})")
    if len(data) < 4 + 4 * ndim:
        raise ValueError(f"{path} is truncated: its header announces {ndim} dimensions "
                         f"but the file has only {len(data)} bytes")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(
            f"{path} is truncated or corrupt: header says {shape} = {int(np.prod(shape))} "
            f"values, file has {body.size}"
        )
    return body.reshape(shape)


def pixel_values() -> np.ndarray:
    """The 256 float32 values a uint8 pixel becomes: float32(v) / 255 (torchvision's
    ``ToTensor()``)."""
    return np.arange(256, dtype=np.float32) / np.float32(255.0)


def channel_stats(images: np.ndarray, block: int = 1 << 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (unbiased) std of uint8 images (N, H, W) or (N, H, W, C) after
    ``pixel_values``, as float32 tensors of shape (1, C, 1, 1).

    From the exact pixel histogram, ``block`` images at a time, in float64: the correctly
    rounded values, the same in every process (a float32 reduction of the float images
    depends on the thread count, and needs the whole float copy).
    """
    import torch  # noqa: PLC0415

    pixels = images if images.ndim == 4 else images[..., None]
    channels = pixels.shape[-1]
    counts = np.zeros((channels, 256), dtype=np.int64)
    for start in range(0, len(pixels), block):
        chunk = pixels[start:start + block]
        for c in range(channels):
            counts[c] += np.bincount(chunk[..., c].reshape(-1), minlength=256)
    values = pixel_values().astype(np.float64)
    n = counts.sum(axis=1)
    mean = counts @ values / n
    var = (counts * (values[None, :] - mean[:, None]) ** 2).sum(axis=1) / (n - 1)
    shape = (1, channels, 1, 1)
    return (torch.from_numpy(mean.astype(np.float32).reshape(shape)),
            torch.from_numpy(np.sqrt(var).astype(np.float32).reshape(shape)))


def _from_uint8(name: str, arrays: dict[str, np.ndarray], num_classes: int, source: str,
                normalize: bool = True, with_train: bool = True) -> TensorDataset:
    """uint8 images (N, H, W) or (N, H, W, C) -> float32 (N, C, H, W) in [0, 1], then
    standardised with the training set's per-channel mean and std if ``normalize``
    (:func:`channel_stats`). ``with_train=False``: the training images only give the
    statistics; ``x_train`` / ``y_train`` are empty."""
    import torch  # noqa: PLC0415

    def to_nchw(images: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.asarray(images, dtype=np.float32)).div_(255.0)  # one float copy
        return x.unsqueeze(1) if x.dim() == 3 else x.permute(0, 3, 1, 2).contiguous()

    train_images = arrays["x_train"] if with_train else arrays["x_train"][:0]
    x_train, x_test = to_nchw(train_images), to_nchw(arrays["x_test"])
    if normalize:
        mean, std = channel_stats(np.asarray(arrays["x_train"]))
        for x in (x_train, x_test):  # in place: no second copy of the training set
            x.sub_(mean).div_(std)
    y_train = np.array(arrays["y_train"]) if with_train else np.zeros(0, dtype=np.int64)
    return TensorDataset(
        name=name,
        x_train=x_train,
        y_train=torch.as_tensor(y_train, dtype=torch.int64),
        x_test=x_test,
        y_test=torch.as_tensor(np.array(arrays["y_test"]), dtype=torch.int64),
        num_classes=num_classes,
        source=source,
    )


# ----------------------------------------------------------------- torchvision
def _torchvision(name: str, data_dir: str, allow_download: bool,
                 normalize: bool = True, with_train: bool = True) -> TensorDataset:
    import torchvision  # noqa: PLC0415 - heavy, only when used

    classes = {"fashion-mnist": torchvision.datasets.FashionMNIST, "mnist": torchvision.datasets.MNIST,
               "cifar10": torchvision.datasets.CIFAR10, "cifar100": torchvision.datasets.CIFAR100}
    root = Path(data_dir) if data_dir else default_cache_dir()
    try:
        train = classes[name](str(root), train=True, download=allow_download)
        test = classes[name](str(root), train=False, download=allow_download)
    except RuntimeError as exc:
        raise DataNotFoundError(
            f"{name} not found under {root} and not downloadable ({exc}). Fix: put the "
            f"torchvision files there, or set --run-config \"data-dir='/abs/folder'\", "
            "or run once with network access."
        ) from exc
    arrays = {
        "x_train": np.asarray(train.data), "y_train": np.asarray(train.targets),
        "x_test": np.asarray(test.data), "y_test": np.asarray(test.targets),
    }
    return _from_uint8(name, arrays, len(train.classes), source=str(root), normalize=normalize,
                       with_train=with_train)


# ----------------------------------------------------------------- Hugging Face Hub
def _hub(hub_id: str, normalize: bool = True, with_train: bool = True) -> TensorDataset:
    """A Hub image-classification dataset through flwr-datasets (network on first use)."""
    from flwr_datasets import FederatedDataset  # noqa: PLC0415

    try:
        fds = FederatedDataset(dataset=hub_id, partitioners={"train": 1})
        train = fds.load_split("train")
    except Exception as exc:  # noqa: BLE001
        raise DataNotFoundError(
            f"Hub dataset {hub_id!r} could not be loaded through flwr-datasets ({exc}). "
            "It needs network access on first use (then the Hugging Face cache)."
        ) from exc
    try:
        test = fds.load_split("test")
    except ValueError:  # no test split on the Hub (e.g. FEMNIST): hold out 20 %, seeded
        test = None
    if test is None:
        both = train.train_test_split(test_size=0.2, seed=0)
        train, test = both["train"], both["test"]
    image_col = next(c for c in ("image", "img", "pixel_values") if c in train.column_names)
    label_col = next(c for c in ("label", "fine_label", "character", "labels") if c in train.column_names)
    natural = next((c for c in ("writer_id", "client_id", "user_id") if c in train.column_names), None)

    def images(split) -> np.ndarray:
        return np.stack([np.asarray(img, dtype=np.uint8) for img in split[image_col]])

    arrays = {"x_train": images(train), "y_train": np.asarray(train[label_col]),
              "x_test": images(test), "y_test": np.asarray(test[label_col])}
    num_classes = int(max(arrays["y_train"].max(), arrays["y_test"].max()) + 1)
    data = _from_uint8(f"hf:{hub_id}", arrays, num_classes, source=hub_id, normalize=normalize,
                       with_train=with_train)
    if natural and with_train:
        _, ids = np.unique(np.asarray(train[natural]), return_inverse=True)
        data = TensorDataset(**{**data.__dict__, "natural_ids": ids})
    return data


# ----------------------------------------------------------------- Synthetic
def synthetic_dataset(
    alpha: float, beta: float, num_devices: int = 30, dim: int = 60, num_classes: int = 10, seed: int = 0
) -> TensorDataset:
    """Synthetic(alpha, beta) of FedProx (Li et al. MLSys'20, Sec. 5.1; Shamir et al.) as
    tensors of shape (N, 1, 1, dim), so every model's (C, H, W) contract holds: the arrays
    of :func:`synthetic_arrays`."""
    import torch  # noqa: PLC0415

    arrays = synthetic_arrays(alpha, beta, num_devices, dim, num_classes, seed)

    def tensor(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x.astype(np.float32)).reshape(len(x), 1, 1, dim)

    return TensorDataset(
        name="synthetic",
        x_train=tensor(arrays["x_train"]), y_train=torch.from_numpy(arrays["y_train"]).long(),
        x_test=tensor(arrays["x_test"]), y_test=torch.from_numpy(arrays["y_test"]).long(),
        num_classes=num_classes, natural_ids=arrays["natural_ids"],
        source=f"synthetic(alpha={alpha}, beta={beta})",
    )


def synthetic_arrays(alpha: float, beta: float, num_devices: int = 30, dim: int = 60,
                     num_classes: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """Synthetic(alpha, beta) as numpy arrays (no torch): ``x_train`` / ``x_test`` float64
    (n, dim), ``y_train`` / ``y_test`` int labels, ``natural_ids`` (each training example's
    device).

    Device k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k, b_k ~ N(u_k, 1); v_k ~ N(B_k, 1);
    x ~ N(v_k, Sigma) with Sigma_jj = j^-1.2; y = argmax softmax(W_k x + b_k).
    As in the authors' generator, alpha and beta are standard deviations and sizes
    follow a power law (log-normal(4, 2) + 50); 80/20 train/test per device.
    """
    rng = np.random.default_rng(seed)
    sizes = (rng.lognormal(4, 2, num_devices).astype(int) + 50)
    cov = np.diag(np.arange(1, dim + 1, dtype=np.float64) ** -1.2)
    xs, ys, ids = [], [], []
    for k, n_k in enumerate(sizes):
        u_k, b_k = rng.normal(0, alpha), rng.normal(0, beta)
        w = rng.normal(u_k, 1, (num_classes, dim))
        b = rng.normal(u_k, 1, num_classes)
        v_k = rng.normal(b_k, 1, dim)
        x = rng.multivariate_normal(v_k, cov, n_k)
        xs.append(x)
        ys.append(np.argmax(x @ w.T + b, axis=1))
        ids.append(np.full(n_k, k))
    x_all, y_all, id_all = np.concatenate(xs), np.concatenate(ys), np.concatenate(ids)
    test_mask = np.zeros(len(y_all), dtype=bool)
    for k in range(num_devices):
        members = np.flatnonzero(id_all == k)
        test_mask[rng.choice(members, size=max(1, len(members) // 5), replace=False)] = True
    return {"x_train": x_all[~test_mask], "y_train": y_all[~test_mask],
            "x_test": x_all[test_mask], "y_test": y_all[test_mask],
            "natural_ids": id_all[~test_mask]}


def main(argv: list[str] | None = None) -> int:
    """``python -m task.data ensure NAME [DATA_DIR]``: load (download if needed) or explain."""
    import sys  # noqa: PLC0415

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "ensure":
        print("usage: python -m task.data ensure DATASET [DATA_DIR]", file=sys.stderr)
        return 2
    try:
        data = load_dataset(args[1], args[2] if len(args) > 2 else "")
    except (DataNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{data.name}: {len(data.y_train)} train / {len(data.y_test)} test examples from {data.source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

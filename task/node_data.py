"""What a node trains on: its partition, from the node's on-disk data cache.

:func:`load_partition` gives one client's (x, y) as numpy arrays. Two entries of the
on-disk cache (:mod:`task.cache`) hold what every process of the node would otherwise
recompute: the decoded dataset (keyed by dataset, its source files, ``normalize`` and the
synthetic parameters) and the index arrays of all partitions (keyed, in addition, by the
partition scheme and its parameters, the seed and the number of partitions). Both keys
also hold the versions of the code and libraries that compute the arrays, and the entries
are checked against the source files' sizes and modification times on every use.

A new process (a deployed SuperNode starts one per message; a simulation's Ray actor)
maps both entries and gathers its rows: no decoding, no partitioning, and no torch, so a
client-info query needs neither. The first process on a machine builds the entries
(decode and partition once, as :func:`task.data.client_data` does); several SuperNodes
on one machine share them. The arrays are the bytes the in-memory path gives (the same
functions compute them), so a run is bit-identical with or without the cache.

With a validation split (``DataSource.validation_fraction`` > 0) the dataset entry still
holds the whole training split; the partition entry (keyed by the fraction too) splits the
training rows :func:`task.data.training_rows` keeps and holds those rows' numbers, so a
client's examples are the ones :func:`task.data.client_data` gives from the reduced set.

Where: the node config's ``data-cache-dir``, else :func:`task.cache.default_root`.
``hf:`` datasets are not cached on disk (their files are not ours to name).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from .cache import LOGGER, ArrayCache, Entry, default_root
from .data import (DataNotFoundError, DataSource, PartitionSpec, source_files, split_labels,
                   training_rows)

# the modules whose code computes the cached arrays: their bytes are part of every key
COMPUTED_BY = ("data.py", "partition.py")
LIBRARIES = ("numpy", "torch", "flwr-datasets")


@dataclasses.dataclass(frozen=True, eq=False)
class Partition:
    """One client's training data: x (n, C, H, W) float32 and y (n,) int64."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    source: str

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x.shape[1:])  # type: ignore[return-value]


# partitions a process keeps decoded: a packed SuperNode serves many virtual clients, each
# with its own partition, every round (together they are at most the dataset, once per split)
PARTITIONS_KEPT = 16384


@functools.lru_cache(maxsize=PARTITIONS_KEPT)
def load_partition(source: DataSource, spec: PartitionSpec, partition_id: int,
                   num_partitions: int, cache_dir: str = "") -> Partition:
    """Partition ``partition_id`` of ``num_partitions`` (once per process), through the
    on-disk cache in ``cache_dir`` ("" = the default folder) when the source's files can be
    named; decoded in memory when they cannot, or when the cache folder is unusable."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id={partition_id} is outside [0, {num_partitions - 1}] "
            f"for num-partitions={num_partitions}"
        )
    files = source_files(source)
    if files is None:
        return _in_memory(source, spec, partition_id, num_partitions)
    cache = ArrayCache(Path(cache_dir) if cache_dir else default_root())
    try:
        data, index = cached_entries(cache, source, files, spec, num_partitions)
    except DataNotFoundError:
        raise
    except OSError as exc:  # the cache folder (not the data) failed: read-only, full, ...
        LOGGER.warning("Data cache %s is unusable (%s); decoding in memory", cache.root, exc)
        return _in_memory(source, spec, partition_id, num_partitions)
    offsets = index.arrays["offsets"]
    rows = index.arrays["indices"][offsets[partition_id]:offsets[partition_id + 1]]
    return Partition(x=np.asarray(data.arrays["x_train"][rows]),
                     y=np.asarray(data.arrays["y_train"][rows]),
                     num_classes=int(data.meta["num-classes"]), source=str(data.meta["source"]))


def cached_entries(cache: ArrayCache, source: DataSource, files: list[Path],
                   spec: PartitionSpec, num_partitions: int) -> tuple[Entry, Entry]:
    """(the decoded dataset's entry, the partition index entry), built when missing."""
    dataset_request = {
        "kind": "dataset", "dataset": source.name, "normalize": source.normalize,
        "files": [str(f) for f in files], "code": code_version(),
        **({"synthetic": [source.synthetic_alpha, source.synthetic_beta]}
           if source.name == "synthetic" else {}),
    }
    identity = {"files": [[f.stat().st_size, f.stat().st_mtime_ns] for f in files]}
    label = f"{source.name}{'' if source.normalize else ', normalize=false'}"

    def decode() -> tuple[dict, dict]:
        dataset = dataclasses.replace(source, validation_fraction=0.0).load()  # all of it
        arrays = {"x_train": dataset.x_train.numpy(), "y_train": dataset.y_train.numpy()}
        if dataset.natural_ids is not None:
            arrays["natural_ids"] = np.asarray(dataset.natural_ids)
        return arrays, {"num-classes": dataset.num_classes, "source": dataset.source}

    data = cache.load(dataset_request, identity, decode, what=label)
    fraction = source.validation_fraction
    index_request = {"kind": "partitions", "dataset": dataset_request,
                     "partition": dataclasses.asdict(spec), "num-partitions": num_partitions,
                     **({"validation-fraction": fraction} if fraction else {})}

    def split() -> tuple[dict, dict]:
        labels, natural_ids = data.arrays["y_train"], data.arrays.get("natural_ids")
        rows = (training_rows(labels, fraction, source.name) if fraction else
                np.arange(len(labels), dtype=np.int64))  # what the clients train on
        parts = split_labels(labels[rows], spec, num_partitions,
                             None if natural_ids is None else natural_ids[rows])
        offsets = np.cumsum([0, *(len(p) for p in parts)]).astype(np.int64)
        indices = rows[np.concatenate(parts)] if parts else np.zeros(0, np.int64)
        return {"indices": indices.astype(np.int64), "offsets": offsets}, {}

    held_out = f", validation-fraction={fraction:g} held out" if fraction else ""
    index = cache.load(index_request, identity, split,
                       what=f"{label}, {spec.scheme} into {num_partitions}{held_out}")
    return data, index


def _in_memory(source: DataSource, spec: PartitionSpec, partition_id: int,
               num_partitions: int) -> Partition:
    from .data import client_data  # noqa: PLC0415 - torch

    dataset = source.load()
    x, y = client_data(dataset, spec, partition_id, num_partitions)
    return Partition(x=x.numpy(), y=y.numpy(), num_classes=dataset.num_classes,
                     source=dataset.source)


@functools.cache
def code_version() -> str:
    """sha256 of the task modules that compute the arrays, plus the libraries' versions."""
    digest = hashlib.sha256()
    for name in COMPUTED_BY:
        digest.update((Path(__file__).parent / name).read_bytes())
    for library in LIBRARIES:
        try:
            digest.update(f"{library}=={version(library)}".encode())
        except PackageNotFoundError:
            digest.update(f"{library} absent".encode())
    return digest.hexdigest()[:16]

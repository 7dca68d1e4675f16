"""A run checked in the driver before anything starts: what the ServerApp or every
ClientApp would otherwise find out only after the SuperLink, Ray and the ServerApp have
started. A refusal is one message naming the key, the value and the fix; nothing ran.

* :func:`refuse_bad_run_configs` (``run``, every run of a ``sweep``): the run config by
  the ServerApp's own rules (:func:`fedapp.registry.check_run_config`: the keys' types and
  values, the strategy's own checks), and against the federation (``min-available-nodes``,
  a ``device`` the ClientApps get no GPU for);
* :func:`check_before_start` (``run``, ``run --check``; ``python -m deploy run`` runs
  ``run --check --deployment`` in a child process, deploy/ importing no simulation module
  but the runtime): ``resume-from`` (the ServerApp's checks of the checkpoint,
  :func:`fedapp.checkpoint.check_resumable`); the data (a ``data-dir`` that does not hold
  the dataset; a dataset neither on this machine nor downloadable); the partitions, split
  as every ClientApp splits them (:func:`task.data.split_labels`) but from the training
  labels alone (:func:`task.data.train_labels`): a split the partitioner cannot make, a
  ``batch-size`` larger than every partition (a warning when larger than some).

CIFAR's and ``hf:`` datasets' labels come only with their images: their partitions are
not checked here (the ClientApps still check them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from flwr.common.logger import FLOWER_LOGGER

from fedapp.checkpoint import check_resumable
from fedapp.config import RunConfig, with_fix_as
from fedapp.registry import build_strategy, check_run_config
from strategies import contract as C
from task.data import (IDX_FILES, SYSTEM_FASHION_MNIST, TORCHVISION_FOLDERS, DataSource,
                       PartitionSpec, default_cache_dir, download_hosts, download_reachable,
                       fashion_mnist_folder, missing_idx_files, split_labels, train_labels)

from .runtime import NOTHING_RAN

APT_FIX = ("sudo apt-get install dataset-fashion-mnist (puts them in "
           "/usr/share/datasets/fashion-mnist)")
# the keys of each partition scheme, named in a refusal of its split
SCHEME_KEYS = {"dirichlet": ("dirichlet-alpha", "min-partition-size"),
               "dirichlet-niid-bench": ("dirichlet-alpha", "min-partition-size"),
               "classes": ("classes-per-partition",), "shards": ("shards-per-partition",),
               "quantity-skew": ("quantity-sigma",)}
DIRICHLET_FIX = ("raise -c dirichlet-alpha (less skew), lower -c min-partition-size (0 allows "
                 "empty partitions, whose clients send no update), or run fewer SuperNodes "
                 "(--num-supernodes)")


class PreflightError(ValueError):
    """A run that would fail once started; the message names the key, the value and the fix."""


RUN_CONFIG_CHECK = "run config check"  # ``what`` of a run's own check (fedhetero run)


def prefixed(what: str, message: str) -> str:
    """``what: message``; a run's own check leaves out a prefix that would say "run config"
    twice."""
    if what == RUN_CONFIG_CHECK and message.startswith("run config:"):
        return message
    return f"{what}: {message}"


def refuse_bad_run_configs(runs: Iterable[tuple[str, Mapping[str, object]]],
                           federation: Mapping[str, object] | None = None,
                           fix_as: Callable[[Mapping[str, object]], str] | None = None) -> None:
    """SystemExit with the ServerApp's own message, prefixed by ``what`` (not for a run's own
    check: the message says "run config:" already), for the first ``(what, run_config)`` pair
    whose run config (overrides of pyproject.toml's defaults) would stop the run, its fix
    written by ``fix_as`` (the syntax the user gave the values in; default: ``flwr run``'s);
    nothing has started yet. With the runs' ``federation``, also a
    ``device`` of ``cuda`` for ClientApps that ask for no GPU share: Ray hides the GPU from
    them, and every ClientApp would fail on its first message; and a federation smaller
    than ``min-available-nodes``, for which the ServerApp would wait forever."""
    gpu_share = bool((federation or {}).get("client-resources-num-gpus"))
    nodes = (federation or {}).get("num-supernodes")
    for what, run_config in runs:
        try:
            cfg = check_run_config(run_config)
        except ValueError as exc:  # ConfigError and the strategies' own checks
            raise SystemExit(f"{prefixed(what, with_fix_as(exc, fix_as))}\n{NOTHING_RAN}") \
                from None
        if cfg.virtual_clients and cfg.min_available_nodes > cfg.virtual_clients:
            raise SystemExit(
                f"{what}: min-available-nodes={cfg.min_available_nodes}, but there are "
                f"virtual-clients={cfg.virtual_clients}: the ServerApp would wait for nodes "
                f"forever. Give -c min-available-nodes={cfg.virtual_clients}\n{NOTHING_RAN}")
        if isinstance(nodes, int) and not cfg.virtual_clients and cfg.min_available_nodes > nodes:
            raise SystemExit(
                f"{what}: min-available-nodes={cfg.min_available_nodes}, but the federation "
                f"has {nodes} SuperNode(s) (num-supernodes): the ServerApp would wait for "
                f"nodes forever. Give -c min-available-nodes={nodes}, or --num-supernodes "
                f"{cfg.min_available_nodes} (a sweep file's num-supernodes), or serve them "
                f"packed (-c virtual-clients={cfg.min_available_nodes})\n{NOTHING_RAN}")
        device = str(run_config.get("device", ""))
        if federation is not None and not gpu_share and device.startswith("cuda"):
            raise SystemExit(
                f"{what}: device={device!r}, but the ClientApps ask for no GPU share and Ray "
                f"hides the GPU from them: give them one (fedhetero run --gpus-per-client "
                f"0.25, a sweep file's gpus-per-client = 0.25), or device='auto'\n{NOTHING_RAN}")


def refuse_unstartable(what: str, run_config: Mapping[str, object], num_partitions: int,
                       node_data_dir: str = "",
                       fix_as: Callable[[Mapping[str, object]], str] | None = None) -> None:
    """SystemExit with ``what: message`` when :func:`check_before_start` refuses the run
    (a ConfigError's fix written by ``fix_as``, as in :func:`refuse_bad_run_configs`); its
    warnings go to stderr, one line each."""
    try:
        warnings = check_before_start(run_config, num_partitions, node_data_dir)
    except ValueError as exc:  # PreflightError, and the ConfigError of a checkpoint
        raise SystemExit(f"{prefixed(what, with_fix_as(exc, fix_as))}\n{NOTHING_RAN}") from None
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)


def check_before_start(run_config: Mapping[str, object], num_partitions: int,
                       node_data_dir: str = "") -> list[str]:
    """The checks of ``resume-from``, the data and the partitions of a run whose config
    passes :func:`refuse_bad_run_configs`, with ``num_partitions`` SuperNodes (one partition
    each; with ``virtual-clients`` = N, N partitions whatever the SuperNodes). ``node_data_dir``: the SuperNodes' data folder where it is not the run config's
    ``data-dir`` (``python -m deploy run --data-dir``). Raises :class:`PreflightError` (or
    the ServerApp's ConfigError of a checkpoint); returns the warnings."""
    cfg = check_run_config(run_config)
    strategy, train_config = quietly_built(cfg)
    if cfg.resume_from:
        check_resumable(cfg.resume_from, cfg.to_dict(), type(strategy).__name__)
    clients = data_source(cfg, node_data_dir or cfg.data_dir)
    check_data(clients, "--data-dir" if node_data_dir else "data-dir")
    if node_data_dir and node_data_dir != cfg.data_dir:  # the ServerApp's test split
        check_data(data_source(cfg, cfg.data_dir), "data-dir")
    sizes = partition_sizes(cfg, clients, cfg.virtual_clients or num_partitions)  # packed: N
    batch_size = int(train_config.get(C.BATCH_SIZE, cfg.batch_size))
    return batch_size_warnings(cfg, batch_size, sizes)


def quietly_built(cfg: RunConfig):
    """(strategy, train config) of ``cfg``, without the constructors' log lines."""
    was_disabled, FLOWER_LOGGER.disabled = FLOWER_LOGGER.disabled, True
    try:
        return build_strategy(cfg)
    finally:
        FLOWER_LOGGER.disabled = was_disabled


# ----------------------------------------------------------------- the data
def data_source(cfg: RunConfig, data_dir: str) -> DataSource:
    """The data a ClientApp (or the ServerApp) of ``cfg`` reads, from ``data_dir``."""
    return cfg.data_source(data_dir)


def setting(key: str, value: str) -> str:
    """How a user gives ``key`` = ``value``: ``-c "data-dir='...'"`` or ``--data-dir ...``
    (``no --data-dir`` for an empty value)."""
    if key.startswith("--"):
        return f"{key} {value}" if value else f"no {key}"
    return f"-c \"{key}='{value}'\""


def shown(key: str, value: str) -> str:
    """``data-dir='/x'`` or ``--data-dir /x``: the key and the value as the user gave them."""
    return f"{key} {value}" if key.startswith("--") else f"{key}={value!r}"


def check_data(source: DataSource, key: str = "data-dir") -> None:
    """PreflightError when ``source`` would not load: its ``key`` (``data-dir`` or deploy's
    ``--data-dir``) names no folder or one without the dataset, or the dataset is neither
    on this machine nor downloadable. Synthetic is generated; ``hf:`` is not checked."""
    if source.name == "synthetic" or source.name.startswith("hf:"):
        return
    data_dir = source.data_dir
    if data_dir and not Path(data_dir).is_dir():
        raise PreflightError(
            f"{shown(key, data_dir)} does not exist (no such folder); it must be the folder that "
            f"holds {expected(source.name, data_dir)}. Fix: give {setting(key, '/abs/folder')} "
            f"of the folder that holds them, or {setting(key, '')} for the default lookup")
    if source.name == "fashion-mnist":
        check_fashion_mnist(source, key)
    else:
        check_torchvision_dataset(source, key)


def expected(name: str, data_dir: str) -> str:
    """What ``data_dir`` must hold for dataset ``name``, and where."""
    if name == "fashion-mnist":
        return (f"Fashion-MNIST's four IDX files ({', '.join(IDX_FILES.values())}, each also "
                f"as .gz) in {data_dir} or {Path(data_dir) / 'fashion-mnist'}")
    return f"torchvision's files of {name} in {Path(data_dir) / TORCHVISION_FOLDERS[name]}"


def check_fashion_mnist(source: DataSource, key: str) -> None:
    """Fashion-MNIST's lookup (task.data): the IDX files in ``data-dir`` (or its
    ``fashion-mnist`` folder), the system copy, torchvision's copy or download."""
    data_dir = source.data_dir
    own = [Path(data_dir), Path(data_dir) / "fashion-mnist"] if data_dir else []
    folder = fashion_mnist_folder(data_dir)
    if folder is not None and (not own or folder in own):
        return
    if folder is not None:  # the system copy, read in place of the data-dir the user gave
        raise PreflightError(
            f"{shown(key, data_dir)} does not hold Fashion-MNIST: {lacking(own)}; the run would "
            f"read {folder} instead. Fix: put the four IDX files "
            f"({', '.join(IDX_FILES.values())}, each also as .gz) into {data_dir}, or give "
            f"{setting(key, '')} to use {folder}")
    root = Path(data_dir) if data_dir else default_cache_dir()
    if source.allow_download and any_files(root / TORCHVISION_FOLDERS["fashion-mnist"]):
        return  # torchvision's copy of an earlier download
    why = not_downloadable(source)
    if why is None:
        return
    looked = ", ".join(str(f) for f in [*own, SYSTEM_FASHION_MNIST])
    lead = (f"{shown(key, data_dir)} does not hold Fashion-MNIST ({lacking(own)})" if own else
            "dataset='fashion-mnist' is not on this machine")
    raise PreflightError(
        f"{lead}, and it cannot be downloaded: {why}. Looked for its four IDX files "
        f"({', '.join(IDX_FILES.values())}, each also as .gz) in {looked}. Fix one of: "
        f"(1) {APT_FIX}; (2) put them in a folder and give {setting(key, '/abs/folder')}; "
        f"(3) -c allow-download=true on a machine with network access (downloads into "
        f"{root})")


def check_torchvision_dataset(source: DataSource, key: str) -> None:
    """MNIST, CIFAR-10/100: torchvision's files below ``data-dir`` (or the user cache), or
    a download."""
    root = Path(source.data_dir) if source.data_dir else default_cache_dir()
    folder = root / TORCHVISION_FOLDERS[source.name]
    if any_files(folder):
        return
    why = not_downloadable(source)
    if why is None:
        return
    lead = (f"{shown(key, source.data_dir)} does not hold {source.name}" if source.data_dir else
            f"dataset={source.name!r} is not on this machine")
    raise PreflightError(
        f"{lead} (torchvision's files expected in {folder}), and it cannot be downloaded: "
        f"{why}. Fix one of: put torchvision's files of {source.name} in {folder}; give "
        f"{setting(key, '/abs/folder')} of a folder with {TORCHVISION_FOLDERS[source.name]} "
        f"in it; or -c allow-download=true on a machine with network access (downloads into "
        f"{root})")


def lacking(folders: list[Path]) -> str:
    """What the closer of ``folders`` (data-dir, data-dir/fashion-mnist) lacks."""
    best = min(folders, key=lambda folder: len(missing_idx_files(folder)))
    missing = missing_idx_files(best)
    if len(missing) == len(IDX_FILES):
        return f"none of its four IDX files is in {' or '.join(str(f) for f in folders)}"
    return f"{best} lacks {', '.join(f'{stem}[.gz]' for stem in missing)}"


def any_files(folder: Path) -> bool:
    return folder.is_dir() and any(path.is_file() for path in folder.iterdir())


def not_downloadable(source: DataSource) -> str | None:
    """Why ``source`` cannot be downloaded now (``allow-download=false``, or no download
    host answers), or None when it can."""
    if not source.allow_download:
        return "allow-download=false"
    hosts = download_hosts(source.name)
    if download_reachable(hosts):
        return None
    shown = ", ".join(f"{host}:{port}" for host, port in hosts)
    return f"allow-download=true, but {shown} cannot be reached (offline?)"


# ----------------------------------------------------------------- the partitions
def partition_spec(cfg: RunConfig) -> PartitionSpec:
    """The partition of ``cfg`` as the ClientApp builds it (fedapp.client_app)."""
    return PartitionSpec(
        scheme=cfg.partition, seed=cfg.partition_data_seed, alpha=cfg.dirichlet_alpha,
        min_size=cfg.min_partition_size, classes_per_partition=cfg.classes_per_partition,
        shards_per_partition=cfg.shards_per_partition, sigma=cfg.quantity_sigma,
    )


def partition_sizes(cfg: RunConfig, source: DataSource, num_partitions: int) -> list[int] | None:
    """The training examples of each of the ``num_partitions`` partitions, split by the
    ClientApps' partitioner from the labels alone; None where the labels come only with
    the images (CIFAR, ``hf:``). PreflightError when the split cannot be made."""
    try:
        found = train_labels(source)
    except (OSError, ValueError) as exc:  # a corrupt or unreadable label file
        raise PreflightError(f"dataset={source.name!r}: {exc}") from None
    if found is None:
        return None
    labels, natural_ids = found
    try:
        parts = split_labels(labels, partition_spec(cfg), num_partitions, natural_ids)
    except ValueError as exc:
        values = cfg.to_dict()
        keys = ("partition", *SCHEME_KEYS.get(cfg.partition, ()))
        shown = ", ".join(f"{key}={values[key]!r}" for key in keys)
        fix = partition_fix(cfg, keys, len(labels), num_partitions)
        raise PreflightError(
            f"{shown} cannot split the {len(labels)} training examples of {cfg.dataset} into "
            f"{num_partitions} partitions (one per SuperNode, --num-supernodes "
            f"{num_partitions}): {exc}. Every ClientApp would fail on it. Fix: {fix}") from None
    return [len(part) for part in parts]


def partition_fix(cfg: RunConfig, keys: tuple[str, ...], examples: int,
                  num_partitions: int) -> str:
    """The fix of a split that cannot be made; only what can help (more SuperNodes than
    examples: no partition key can)."""
    if num_partitions > examples:
        return (f"run at most {examples} SuperNodes (--num-supernodes {examples}): each "
                "partition needs an example of its own, whatever the partition keys")
    if cfg.partition.startswith("dirichlet"):
        if num_partitions * cfg.min_partition_size > examples:
            return (f"lower -c min-partition-size to at most {examples // num_partitions} "
                    f"({examples} examples / {num_partitions} partitions), or run fewer "
                    "SuperNodes (--num-supernodes)")
        return DIRICHLET_FIX
    return (f"change {' or '.join(f'-c {key}' for key in keys)}, or run fewer SuperNodes "
            "(--num-supernodes)")


def batch_size_warnings(cfg: RunConfig, batch_size: int, sizes: list[int] | None) -> list[str]:
    """PreflightError when ``batch_size`` (0: full batch) is larger than every partition;
    one warning when it is larger than some."""
    if batch_size <= 0 or not sizes:
        return []
    largest = max(sizes)
    if batch_size > largest:
        raise PreflightError(
            f"batch-size={batch_size} is larger than every partition: the largest of the "
            f"{len(sizes)} partitions (partition={cfg.partition!r}, one per SuperNode) holds "
            f"{largest} training examples, so every client would train on fewer than "
            f"{batch_size} examples per step. Fix: -c batch-size={largest} (or smaller), "
            f"-c full-batch=true to train on whole partitions, or fewer SuperNodes "
            f"(--num-supernodes)")
    small = [size for size in sizes if 0 < size < batch_size]
    if not small:
        return []
    empty = sizes.count(0)
    return [f"batch-size={batch_size} is larger than {len(small)} of the {len(sizes)} "
            f"partitions (the smallest holds {min(small)} training examples): those clients "
            f"train on batches of all their examples, fewer than {batch_size}"
            + (f"; {empty} partition(s) are empty (their clients send no update)"
               if empty else "")]

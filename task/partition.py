"""Federated data partitioners over a label vector.

Every scheme returns ``num_partitions`` sorted ``int64`` index arrays that are
disjoint and together cover ``range(len(labels))`` exactly once.  Results are a
pure function of the arguments (``seed`` included); schemes without randomness
(``fedveca-case1/2/3`` and ``natural`` with one group per partition) ignore
``seed``.

Schemes (McMahan et al. 2017, Sec. 3: IID and pathological shards; "Understanding
Federated Learning from IID to Non-IID dataset", Sec. 4.2.2 and 4.3.1: quantity skew and
Dirichlet label skew; Li et al. 2022, NIID-Bench: "#C=k"; Luo et al., FedVeca, Sec. IV-A3):

* ``iid``            random permutation split into nearly equal parts (numpy).
* ``dirichlet``      "hetero-dir" label skew (Yurochkin et al. / NIID-Bench),
                     via flwr-datasets' ``DirichletPartitioner``.
* ``dirichlet-niid-bench``  the same rule on NIID-Bench's own random stream (numpy's
                     legacy ``RandomState``): with seed 2020 the partition of its tables.
* ``classes``        NIID-Bench "#C=k", via flwr-datasets'
                     ``PathologicalPartitioner`` (first-deterministic) when every
                     label is some partition's first label; numpy otherwise.
* ``shards``         McMahan et al. pathological shards, via flwr-datasets'
                     ``ShardPartitioner`` plus round-robin of the leftover samples.
* ``quantity-skew``  FedLab ``unbalance_sgm``: log-normal sizes, IID labels (numpy).
* ``fedveca-case1/2/3``  FedVeca reference-code rules (numpy, deterministic).
* ``natural``        one natural group (writer, device, role) per partition, or
                     groups dealt round-robin after a seeded shuffle (numpy).

Empty partitions can occur only where the scheme allows it: ``dirichlet`` and
``dirichlet-niid-bench`` with ``min_size=0``; ``fedveca-case2``/``fedveca-case3`` when a label is missing or
has fewer samples than the partitions that share it.  All other schemes give
every partition at least one sample (given ``num_partitions <= len(labels)``).

Heavy libraries (datasets, flwr_datasets, matplotlib) are imported lazily.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np

from .figure_png import save_png

PARTITION_NAMES: tuple[str, ...] = (
    "iid",
    "dirichlet",
    "dirichlet-niid-bench",
    "classes",
    "shards",
    "quantity-skew",
    "fedveca-case1",
    "fedveca-case2",
    "fedveca-case3",
    "natural",
)

# Outer re-draw budget for dirichlet: flwr's DirichletPartitioner gives up
# after 11 draws; we restart it with fresh sub-seeds up to this many times.
_DIRICHLET_MAX_RESTARTS = 30
# and for dirichlet-niid-bench (NIID-Bench itself loops without a bound)
_NIID_BENCH_MAX_DRAWS = 1000


# --------------------------------------------------------------------------- #
# Public API
# --------------------------------------------------------------------------- #
def partition_indices(
    labels: np.ndarray,
    num_partitions: int,
    scheme: str,
    *,
    seed: int = 0,
    alpha: float = 0.5,
    min_size: int = 10,
    classes_per_partition: int = 2,
    shards_per_partition: int = 2,
    shard_size: int | None = None,
    sigma: float = 0.5,
    natural_ids: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Return one sorted int64 index array per partition.

    ``labels`` is a 1-D array of non-negative integer class ids.  Only the
    keyword arguments of the chosen ``scheme`` are used (and validated):
    ``dirichlet``, ``dirichlet-niid-bench``: alpha, min_size; ``classes``: classes_per_partition;
    ``shards``: shards_per_partition, shard_size; ``quantity-skew``: sigma;
    ``natural``: natural_ids.  Invalid arguments raise ``ValueError``.
    """
    labels = _check_labels(labels)
    _check_int("num_partitions", num_partitions, 1)
    if num_partitions > labels.size:
        raise ValueError(
            f"num_partitions must be <= number of samples ({labels.size}), "
            f"got {num_partitions}"
        )
    if scheme not in PARTITION_NAMES:
        raise ValueError(f"scheme must be one of {PARTITION_NAMES}, got {scheme!r}")
    _check_int("seed", seed, 0)
    k = int(num_partitions)
    if scheme == "iid":
        parts = _iid(labels, k, seed)
    elif scheme == "dirichlet":
        parts = _dirichlet(labels, k, seed, alpha, min_size)
    elif scheme == "dirichlet-niid-bench":
        parts = _dirichlet_niid_bench(labels, k, seed, alpha, min_size)
    elif scheme == "classes":
        parts = _classes(labels, k, seed, classes_per_partition)
    elif scheme == "shards":
        parts = _shards(labels, k, seed, shards_per_partition, shard_size)
    elif scheme == "quantity-skew":
        parts = _quantity_skew(labels, k, seed, sigma)
    elif scheme == "fedveca-case1":
        parts = _fedveca_case1(labels, k)
    elif scheme == "fedveca-case2":
        parts = _fedveca_case2(labels, k)
    elif scheme == "fedveca-case3":
        parts = _fedveca_case3(labels, k)
    else:  # natural
        parts = _natural(labels, k, seed, natural_ids)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def label_histogram(
    labels: np.ndarray, parts: list[np.ndarray], num_classes: int
) -> np.ndarray:
    """Return a (num_partitions, num_classes) int64 array of label counts."""
    labels = _check_labels(labels)
    _check_int("num_classes", num_classes, 1)
    if labels.size and int(labels.max()) >= num_classes:
        raise ValueError(
            f"num_classes must be > the largest label ({int(labels.max())}), "
            f"got {num_classes}"
        )
    hist = np.zeros((len(parts), int(num_classes)), dtype=np.int64)
    for i, p in enumerate(parts):
        hist[i] = np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes)
    return hist


def plot_label_distribution(
    labels: np.ndarray,
    parts: list[np.ndarray],
    num_classes: int,
    path: str | os.PathLike,
    title: str = "",
) -> str:
    """Write a stacked bar chart (x: partition id, y: #samples, one colour per
    class) as PNG to ``path`` and return ``path`` as a string."""
    return plot_label_histogram(label_histogram(labels, parts, num_classes), path, title)


def plot_label_histogram(hist: np.ndarray, path: str | os.PathLike, title: str = "") -> str:
    """Stacked-bar PNG of a (num_partitions, num_classes) count matrix; returns ``path``."""
    # Object-oriented Agg API: no pyplot global state, no backend switching.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    hist = np.asarray(hist)
    n_parts, num_classes = hist.shape
    fig = Figure(figsize=(max(6.0, min(0.12 * n_parts + 3.0, 24.0)), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    cmap_name = "tab10" if num_classes <= 10 else ("tab20" if num_classes <= 20 else "viridis")
    cmap = _get_cmap(cmap_name)
    x = np.arange(n_parts)
    bottom = np.zeros(n_parts)
    for c in range(int(num_classes)):
        colour = cmap(c % 20) if cmap_name != "viridis" else cmap(c / max(num_classes - 1, 1))
        ax.bar(x, hist[:, c], bottom=bottom, width=0.85, color=colour, label=str(c))
        bottom += hist[:, c]
    ax.set_xlabel("partition id")
    ax.set_ylabel("#samples")
    ax.set_xlim(-0.6, n_parts - 0.4)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        ax.set_title(title)
    ax.legend(
        title="class",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize="small",
        ncol=1 if num_classes <= 20 else 2,
    )
    fig.tight_layout()
    return save_png(fig, path, dpi=100)


# --------------------------------------------------------------------------- #
# Validation helpers
# --------------------------------------------------------------------------- #
def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_labels(labels: Any) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"labels must be a non-empty 1-D array, got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"labels must have an integer dtype, got {arr.dtype}")
    if int(arr.min()) < 0:
        raise ValueError(f"labels must be >= 0, got minimum {int(arr.min())}")
    return arr.astype(np.int64, copy=False)


def _get_cmap(name: str):
    import matplotlib

    try:
        return matplotlib.colormaps[name]
    except AttributeError:  # matplotlib < 3.5
        from matplotlib import cm

        return cm.get_cmap(name)


# --------------------------------------------------------------------------- #
# flwr-datasets bridge
# --------------------------------------------------------------------------- #
def _flwr_partition(partitioner: Any, labels: np.ndarray, order: np.ndarray, k: int) -> list[np.ndarray]:
    """Run a flwr-datasets partitioner on ``labels`` presented in ``order``.

    The rows are ``{"label": labels[order], "idx": order}`` so the indices read
    back from each partition are indices into the original ``labels``.  A seeded
    random ``order`` makes the within-class order random, which the flwr
    partitioners themselves do not do (they split each class's rows in dataset
    order and only shuffle *after* assignment).

    The rows are in Arrow format: the partitioners read the whole label column with
    ``np.array(dataset["label"])``, which for datasets >= 4 walks a ``Column`` row by row
    (about a second per draw of 60,000 labels); an Arrow column converts at once, with the
    same values, so the partitions are the same.
    """
    from datasets import Dataset

    ds = Dataset.from_dict({"label": labels[order], "idx": order.astype(np.int64)})
    ds = ds.with_format("arrow")
    partitioner.dataset = ds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flwr warns on every re-draw / unused class
        return [np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64) for i in range(k)]


def _sub_seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**31 - 1))


# --------------------------------------------------------------------------- #
# Schemes
# --------------------------------------------------------------------------- #
def _iid(labels: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    # numpy: flwr's IidPartitioner is a contiguous, unshuffled split
    # (dataset.shard(contiguous=True)); shuffling first and then cutting is the
    # whole scheme, so np.array_split on a permutation is used directly.
    perm = np.random.default_rng(seed).permutation(labels.size)
    return np.array_split(perm, k)


def _check_dirichlet_args(labels: np.ndarray, k: int, alpha: Any, min_size: Any) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(alpha)) or float(alpha) <= 0:
        raise ValueError(f"dirichlet-alpha must be > 0, got {alpha!r}")
    _check_int("min_size", min_size, 0)
    if min_size * k > labels.size:
        raise ValueError(
            f"min_size must be <= number of samples / num_partitions "
            f"({labels.size} / {k} = {labels.size // k}), got {min_size}"
        )


def _dirichlet(labels: np.ndarray, k: int, seed: int, alpha: float, min_size: int) -> list[np.ndarray]:
    """hetero-dir via flwr_datasets.partitioner.DirichletPartitioner.

    Checked against NIID-Bench's hetero-dir (flwr-datasets 0.6.1 source): per
    class it draws Dir_K(alpha), zeroes the share of every partition holding
    more than N/K samples (NIID-Bench: >= N/K; differs only on exact ties),
    renormalises, splits the class at ``(cumsum(p) * n_c).astype(int)[:-1]``
    and repeats the whole draw until every partition has >= min_size.
    Two gaps are closed here: (1) the class indices are split in dataset order
    (no shuffle before the split), so we hand it a seeded random row order;
    (2) it raises after 11 draws, so we restart it with fresh sub-seeds
    (deterministically derived from ``seed``) up to _DIRICHLET_MAX_RESTARTS times.
    """
    from flwr_datasets.partitioner import DirichletPartitioner

    _check_dirichlet_args(labels, k, alpha, min_size)
    n = labels.size
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    for _ in range(_DIRICHLET_MAX_RESTARTS):
        part = DirichletPartitioner(
            num_partitions=k,
            partition_by="label",
            alpha=float(alpha),
            min_partition_size=int(min_size),
            self_balancing=True,
            shuffle=True,
            seed=_sub_seed(rng),
        )
        try:
            return _flwr_partition(part, labels, order, k)
        except ValueError as exc:
            if "max number of attempts" not in str(exc):
                raise
    raise ValueError(
        f"min_size={min_size} could not be met with dirichlet-alpha={alpha} and "
        f"num_partitions={k} after {11 * _DIRICHLET_MAX_RESTARTS} Dirichlet draws; "
        f"lower min_size or raise alpha"
    )


def _dirichlet_niid_bench(labels: np.ndarray, k: int, seed: int, alpha: float,
                          min_size: int) -> list[np.ndarray]:
    """hetero-dir drawn as NIID-Bench's ``partition_data`` ("noniid-labeldir") draws it
    (Li et al., ICDE 2022, Sec. IV-A: p_k ~ Dir_N(beta) per label), step for step on one
    numpy ``RandomState(seed)``: per label, shuffle its indices, draw the proportions,
    zero those of parties already holding >= N / parties, renormalise, split at
    ``(cumsum(p) * n_label).astype(int)[:-1]``; redraw everything until every party has
    >= ``min_size``. NIID-Bench's code of its tables seeded numpy with 2020 right before
    this draw, whatever the trial (until its commit 27886d9), so ``seed=2020`` with the
    labels in the dataset's file order gives that partition."""
    _check_dirichlet_args(labels, k, alpha, min_size)
    if seed >= 2**32:
        raise ValueError(f"dirichlet-niid-bench needs a seed < 2**32 (numpy's RandomState), "
                         f"got {seed}")
    rng = np.random.RandomState(seed)
    n = labels.size
    for _ in range(_NIID_BENCH_MAX_DRAWS):
        parts: list[list[int]] = [[] for _ in range(k)]
        for label in range(int(labels.max()) + 1):
            idx = np.where(labels == label)[0]
            rng.shuffle(idx)
            p = rng.dirichlet(np.repeat(float(alpha), k))
            p = np.array([share * (len(part) < n / k) for share, part in zip(p, parts)])
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            parts = [part + chunk.tolist() for part, chunk in zip(parts, np.split(idx, cuts))]
        if min(len(part) for part in parts) >= min_size:
            return [np.asarray(part, dtype=np.int64) for part in parts]
    raise ValueError(
        f"min_size={min_size} could not be met with dirichlet-alpha={alpha} and "
        f"num_partitions={k} after {_NIID_BENCH_MAX_DRAWS} Dirichlet draws; "
        f"lower min_size or raise alpha"
    )


def _classes(labels: np.ndarray, k: int, seed: int, cpp: int) -> list[np.ndarray]:
    """NIID-Bench "#C=k": partition i holds label uniq[i % U] plus cpp-1 other
    random distinct labels; each label's (shuffled) samples are split evenly
    (np.array_split) among the partitions holding it.

    If k >= U (number of distinct labels) every label is some partition's first
    label, so nothing is dropped and flwr's PathologicalPartitioner with
    class_assignment_mode="first-deterministic" is exactly NIID-Bench (given a
    seeded row order, because it splits each class in dataset order).
    If k < U, flwr (and NIID-Bench) would silently drop labels that no
    partition drew.  To stay covering we then assign in numpy with the same
    first-label rule but draw the extra labels preferentially from
    still-unused labels; this needs k * cpp >= U, otherwise ValueError.
    """
    _check_int("classes_per_partition", cpp, 1)
    uniq, counts = np.unique(labels, return_counts=True)
    u = uniq.size
    if cpp > u:
        raise ValueError(
            f"classes_per_partition must be <= number of distinct labels ({u}), got {cpp}"
        )
    if k * cpp < u:
        raise ValueError(
            f"classes_per_partition must be >= ceil(distinct labels / num_partitions) "
            f"= {-(-u // k)} so that no label is dropped "
            f"({u} labels, {k} partitions), got {cpp}"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(labels.size)
    if k >= u:
        from flwr_datasets.partitioner import PathologicalPartitioner

        part = PathologicalPartitioner(
            num_partitions=k,
            partition_by="label",
            num_classes_per_partition=int(cpp),
            class_assignment_mode="first-deterministic",
            shuffle=True,
            seed=_sub_seed(rng),
        )
        return _flwr_partition(part, labels, order, k)

    # numpy path (k < u)
    held: list[list[int]] = []
    unused = set(range(u)) - set(range(k))
    for i in range(k):
        cur = [i]  # i % u == i because k < u
        while len(cur) < cpp:
            pool = sorted(unused) if unused else [c for c in range(u) if c not in cur]
            c = int(pool[rng.integers(len(pool))])
            cur.append(c)
            unused.discard(c)
        held.append(cur)
    holders = [[i for i in range(k) if c in held[i]] for c in range(u)]
    for c in range(u):
        if len(holders[c]) > counts[c]:
            raise ValueError(
                f"classes_per_partition={cpp} with num_partitions={k} needs label "
                f"{int(uniq[c])} in {len(holders[c])} partitions but it has only "
                f"{int(counts[c])} samples"
            )
    out: list[list[np.ndarray]] = [[] for _ in range(k)]
    shuffled_labels = labels[order]
    for c in range(u):
        idx_c = order[shuffled_labels == uniq[c]]
        for pid, chunk in zip(holders[c], np.array_split(idx_c, len(holders[c]))):
            out[pid].append(chunk)
    return [np.concatenate(o) for o in out]


def _shards(labels: np.ndarray, k: int, seed: int, spp: int, shard_size: int | None) -> list[np.ndarray]:
    """McMahan et al. shards via flwr_datasets.partitioner.ShardPartitioner.

    It sorts the rows by label (Arrow's stable sort; we pass a seeded random
    row order so ties are broken randomly), cuts shards of ``shard_size``
    (default N // (k * spp)) and gives each partition ``spp`` shards drawn by a
    seeded permutation.  It drops whatever is not in a used shard (tail of the
    sorted data, unused whole shards); we deal those leftovers round-robin
    (in label-sorted order, partitions 0, 1, ...) so the result is covering.
    """
    _check_int("shards_per_partition", spp, 1)
    n = labels.size
    num_shards = k * spp
    if num_shards > n:
        raise ValueError(
            f"shards_per_partition must be <= number of samples / num_partitions "
            f"({n} / {k} = {n // k}), got {spp}"
        )
    if shard_size is None:
        shard_size = n // num_shards
    else:
        _check_int("shard_size", shard_size, 1)
        if shard_size * num_shards > n:
            raise ValueError(
                f"shard_size must be <= number of samples / (num_partitions * "
                f"shards_per_partition) = {n // num_shards}, got {shard_size}"
            )
    from flwr_datasets.partitioner import ShardPartitioner

    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    part = ShardPartitioner(
        num_partitions=k,
        partition_by="label",
        num_shards_per_partition=int(spp),
        shard_size=int(shard_size),
        keep_incomplete_shard=False,
        shuffle=True,
        seed=_sub_seed(rng),
    )
    parts = _flwr_partition(part, labels, order, k)
    used = np.zeros(n, dtype=bool)
    for p in parts:
        used[p] = True
    if not used.all():
        # leftovers in label-sorted order (stable sort of the same row order)
        sorted_rows = order[np.argsort(labels[order], kind="stable")]
        left = sorted_rows[~used[sorted_rows]]
        parts = [np.concatenate([p, left[i::k]]) for i, p in enumerate(parts)]
    return parts


def _quantity_skew(labels: np.ndarray, k: int, seed: int, sigma: float) -> list[np.ndarray]:
    """FedLab ``unbalance_sgm``: sizes ~ LogNormal(ln(N/K), sigma), rescaled to
    sum N, then each partition gets a seeded IID random sample (consecutive
    slices of one permutation).

    Rounding: floor, then the remaining units go one each to the largest
    fractional parts (so sigma=0 gives exactly np.array_split sizes), then every
    partition is raised to >= 1 sample, the excess taken from the largest
    partition(s).
    numpy: flwr's SizePartitioner only slices contiguously without shuffling and
    has no size model, i.e. it is just the last line here.
    """
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(sigma)) or float(sigma) < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma!r}")
    n = labels.size
    rng = np.random.default_rng(seed)
    if float(sigma) == 0.0:
        raw = np.full(k, n / k)
    else:
        raw = rng.lognormal(mean=math.log(n / k), sigma=float(sigma), size=k)
    exact = raw / raw.sum() * n
    sizes = np.floor(exact).astype(np.int64)
    rem = n - int(sizes.sum())
    if rem > 0:
        frac_order = np.argsort(-(exact - sizes), kind="stable")
        sizes[frac_order[:rem]] += 1
    short = sizes < 1
    if short.any():
        deficit = int((1 - sizes[short]).sum())
        sizes[short] = 1
        while deficit > 0:  # feasible because n >= k
            j = int(np.argmax(sizes))
            take = min(deficit, int(sizes[j]) - 1)
            sizes[j] -= take
            deficit -= take
    assert int(sizes.sum()) == n and sizes.min() >= 1
    perm = rng.permutation(n)
    return np.split(perm, np.cumsum(sizes)[:-1])


def _fedveca_case1(labels: np.ndarray, k: int) -> list[np.ndarray]:
    """FedVeca Case 1 [ref-code]: sample i goes to partition i mod N."""
    idx = np.arange(labels.size)
    return [idx[p::k] for p in range(k)]


def _round_robin(idx: np.ndarray, clients: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Deal ``idx`` (in index order) to ``clients`` cyclically.

    This equals "each sample goes to the least-filled eligible client, ties to
    the lowest id" whenever the clients receive no other samples, which is the
    case for every call below (each client belongs to exactly one group).
    """
    return [(int(c), idx[j::clients.size]) for j, c in enumerate(clients)]


def _collect(k: int, assignments: list[tuple[int, np.ndarray]]) -> list[np.ndarray]:
    out: list[list[np.ndarray]] = [[] for _ in range(k)]
    for pid, idx in assignments:
        out[pid].append(idx)
    return [np.concatenate(o) if o else np.empty(0, dtype=np.int64) for o in out]


def _fedveca_case2(labels: np.ndarray, k: int) -> list[np.ndarray]:
    """FedVeca Case 2 [ref-code], generalised with C = labels.max() + 1 classes.

    G = min(N, C) label groups; partition n is in group n mod G; label l goes to
    group l mod G, each sample to the least-filled partition of that group.
    N <= C: partition = label mod N (N=5, C=10: partition n holds {n, n+5}).
    N > C: label l spread over partitions n with n = l (mod C).
    A partition is empty if its labels are missing or too rare.
    """
    c = int(labels.max()) + 1
    g = min(k, c)
    idx = np.arange(labels.size)
    pid = np.arange(k)
    assignments = []
    for grp in range(g):
        samples = idx[labels % g == grp]
        assignments += _round_robin(samples, pid[pid % g == grp])
    return _collect(k, assignments)


def _fedveca_case3(labels: np.ndarray, k: int) -> list[np.ndarray]:
    """FedVeca Case 3 [ref-code + spec A20], C = labels.max() + 1 classes.

    G = min(N, C) groups (partition n in group n mod G); first half = groups
    0..H-1 with H = ceil(G/2); second half = groups H..G-1 (M = G - H of them).
    * labels l < C/2 ("first half of the labels") are dealt round-robin in
      sample-index order over all partitions of the first-half groups (IID);
    * every other label l goes label-wise, as in Case 2, to group H + (l mod M),
      each sample to the least-filled partition of that group.
    N=5, C=10 reproduces the reference: partitions 0-2 share 0-4 IID,
    partition 3 gets {6, 8}, partition 4 gets {5, 7, 9}.  N=10: 0-4 IID over
    partitions 0-4, label l>=5 to partition l.  N>10 (e.g. 50): partitions with
    n mod 10 < 5 share labels 0-4, label l>=5 goes to partitions n = l (mod 10),
    consistent with Case 2.  N=1: everything to partition 0.
    Second-half partitions can be empty if their labels are missing/too rare.
    """
    c = int(labels.max()) + 1
    g = min(k, c)
    h = -(-g // 2)
    m = g - h
    idx = np.arange(labels.size)
    pid = np.arange(k)
    if m == 0:  # a single group (N == 1 or C == 1): nothing to split
        return _collect(k, _round_robin(idx, pid))
    low = 2 * labels < c
    assignments = _round_robin(idx[low], pid[pid % g < h])
    for j in range(m):
        samples = idx[~low & (labels % m == j)]
        assignments += _round_robin(samples, pid[pid % g == h + j])
    return _collect(k, assignments)


def _natural(labels: np.ndarray, k: int, seed: int, natural_ids: np.ndarray | None) -> list[np.ndarray]:
    """Natural groups (writer / device / role id) mapped onto partitions.

    Groups are the sorted unique ``natural_ids``.  k == #groups: group j ->
    partition j (seed unused).  k < #groups: groups are shuffled (seeded) and
    dealt round-robin.  k > #groups: ValueError.
    numpy: flwr's NaturalIdPartitioner only does one group per partition (with a
    per-sample Python loop and a tqdm bar), and GroupedNaturalIdPartitioner
    groups contiguous runs of ids, not a seeded round-robin deal.
    """
    if natural_ids is None:
        raise ValueError("natural_ids must be given for scheme 'natural', got None")
    ids = np.asarray(natural_ids)
    if ids.shape != labels.shape:
        raise ValueError(
            f"natural_ids must have the same shape as labels {labels.shape}, got {ids.shape}"
        )
    uniq, inverse = np.unique(ids, return_inverse=True)
    n_groups = uniq.size
    if k > n_groups:
        raise ValueError(
            f"num_partitions must be <= number of natural groups ({n_groups}) "
            f"for scheme 'natural', got {k}"
        )
    if k == n_groups:
        group_to_part = np.arange(n_groups)
    else:
        shuffled = np.random.default_rng(seed).permutation(n_groups)
        group_to_part = np.empty(n_groups, dtype=np.int64)
        group_to_part[shuffled] = np.arange(n_groups) % k
    owner = group_to_part[inverse.ravel()]
    idx = np.arange(labels.size)
    return [idx[owner == p] for p in range(k)]

"""Tests for task.partition: covering/disjoint/deterministic partitions, the
scheme-specific properties, label_histogram, plotting and argument errors."""

import numpy as np
import pytest

from task.partition import (
    PARTITION_NAMES,
    label_histogram,
    partition_indices,
    plot_label_distribution,
)

# MNIST train label counts (digits 0..9), used for the FedVeca Case 3 sizes.
MNIST_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


def shuffled_labels(per_class: int, num_classes: int = 10, seed: int = 123) -> np.ndarray:
    labels = np.repeat(np.arange(num_classes), per_class)
    return np.random.default_rng(seed).permutation(labels)


LABELS = shuffled_labels(600)  # 6000 samples, 10 classes
N = LABELS.size
NATURAL_IDS = np.random.default_rng(7).integers(0, 40, size=N)  # 40 "writers"

# scheme -> (num_partitions, extra kwargs, uses randomness)
CASES = {
    "iid": (10, {}, True),
    "dirichlet": (10, {"alpha": 0.5}, True),
    "dirichlet-niid-bench": (10, {"alpha": 0.5}, True),
    "classes": (20, {"classes_per_partition": 2}, True),
    "shards": (10, {"shards_per_partition": 2}, True),
    "quantity-skew": (10, {"sigma": 1.0}, True),
    "fedveca-case1": (5, {}, False),
    "fedveca-case2": (5, {}, False),
    "fedveca-case3": (5, {}, False),
    "natural": (8, {"natural_ids": NATURAL_IDS}, True),
}


def assert_partition(parts, n, k):
    assert isinstance(parts, list) and len(parts) == k
    for p in parts:
        assert isinstance(p, np.ndarray) and p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0), "each partition must be sorted and unique"
    allidx = np.concatenate(parts)
    assert allidx.size == n, "partitions must be disjoint and covering"
    assert np.array_equal(np.sort(allidx), np.arange(n))


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def entropy_rows(hist):
    p = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)


def test_names_cover_cases():
    assert PARTITION_NAMES == (
        "iid", "dirichlet", "dirichlet-niid-bench", "classes", "shards", "quantity-skew",
        "fedveca-case1", "fedveca-case2", "fedveca-case3", "natural",
    )
    assert set(CASES) == set(PARTITION_NAMES)


@pytest.mark.parametrize("scheme", PARTITION_NAMES)
def test_disjoint_covering_deterministic(scheme):
    k, kw, random = CASES[scheme]
    a = partition_indices(LABELS, k, scheme, seed=0, **kw)
    assert_partition(a, N, k)
    assert all(p.size > 0 for p in a)  # none of these settings allows empties
    b = partition_indices(LABELS, k, scheme, seed=0, **kw)
    assert same(a, b)
    c = partition_indices(LABELS, k, scheme, seed=1, **kw)
    assert_partition(c, N, k)
    assert same(a, c) is (not random)


def test_input_not_modified_and_list_input():
    labels = LABELS.copy()
    parts = partition_indices(labels.tolist(), 10, "iid", seed=3)
    assert np.array_equal(labels, LABELS)
    assert_partition(parts, N, 10)


# ----------------------------------------------------------------- iid
def test_iid_sizes_and_labels():
    parts = partition_indices(LABELS, 7, "iid", seed=0)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert len(np.unique(LABELS[parts[0]])) == 10


# ----------------------------------------------------------------- dirichlet
def test_dirichlet_skew_grows_as_alpha_shrinks():
    h_small = label_histogram(LABELS, partition_indices(LABELS, 10, "dirichlet", alpha=0.1, seed=0), 10)
    h_large = label_histogram(LABELS, partition_indices(LABELS, 10, "dirichlet", alpha=100.0, seed=0), 10)
    assert entropy_rows(h_small).mean() < entropy_rows(h_large).mean() - 0.5
    assert entropy_rows(h_large).mean() > 0.95 * np.log(10)


@pytest.mark.parametrize("alpha,min_size", [(0.1, 10), (0.1, 150), (0.3, 300)])
def test_dirichlet_respects_min_size(alpha, min_size):
    parts = partition_indices(LABELS, 10, "dirichlet", alpha=alpha, min_size=min_size, seed=2)
    assert_partition(parts, N, 10)
    assert min(p.size for p in parts) >= min_size


def test_dirichlet_min_size_zero_allowed():
    parts = partition_indices(LABELS, 10, "dirichlet", alpha=0.05, min_size=0, seed=0)
    assert_partition(parts, N, 10)


# ----------------------------------------------------------------- dirichlet-niid-bench
# Label counts per party (rows) of NIID-Bench's Dir(0.5) partition of Fashion-MNIST's training
# labels over 10 parties, numpy seeded with 2020: the output of NIID-Bench's own loop
# (utils.partition_data, "noniid-labeldir", before its commit 27886d9, where it seeds 2020),
# run once beside ours on the same labels; the index sets were identical.
NIID_BENCH_FMNIST_DIR05_2020 = [
    [0, 2359, 0, 36, 687, 560, 1133, 254, 93, 894],
    [117, 1697, 140, 551, 42, 79, 1361, 383, 256, 565],
    [571, 305, 778, 160, 2009, 1729, 153, 2009, 0, 0],
    [420, 208, 1902, 266, 154, 684, 449, 645, 21, 1152],
    [82, 114, 596, 845, 2134, 313, 1304, 0, 623, 0],
    [1046, 27, 1087, 93, 36, 40, 329, 188, 2761, 353],
    [318, 160, 276, 20, 189, 74, 39, 1515, 593, 2891],
    [353, 278, 232, 1012, 221, 1101, 789, 71, 51, 102],
    [1063, 780, 58, 2357, 38, 1012, 371, 3, 241, 43],
    [2030, 72, 931, 660, 490, 408, 72, 932, 1361, 0],
]


def test_dirichlet_niid_bench_gives_niid_bench_fashion_mnist_partition():
    from task.data import IDX_FILES, SYSTEM_FASHION_MNIST, idx_path, read_idx  # noqa: PLC0415

    # the labels in file order, as NIID-Bench's torchvision loader reads them
    labels = read_idx(idx_path(SYSTEM_FASHION_MNIST, IDX_FILES["y_train"])).astype(np.int64)
    parts = partition_indices(labels, 10, "dirichlet-niid-bench", seed=2020, alpha=0.5,
                              min_size=10)
    assert_partition(parts, labels.size, 10)
    assert label_histogram(labels, parts, 10).tolist() == NIID_BENCH_FMNIST_DIR05_2020


def test_dirichlet_niid_bench_stops_a_party_at_n_over_k():
    """Once a party holds >= N / parties it gets no share of the later labels."""
    labels = np.repeat(np.arange(10), 100)  # labels in order: the loop sees 0, 1, ..., 9
    parts = partition_indices(labels, 4, "dirichlet-niid-bench", seed=5, alpha=0.05,
                              min_size=0)
    for part in parts:
        held = 0
        for label in range(10):
            got = int(np.sum(labels[part] == label))
            assert not (held >= labels.size / 4 and got > 0)
            held += got


def test_dirichlet_niid_bench_seed_below_2_pow_32():
    with pytest.raises(ValueError, match=r"dirichlet-niid-bench needs a seed < 2\*\*32"):
        partition_indices(LABELS, 10, "dirichlet-niid-bench", seed=2**32)


# ----------------------------------------------------------------- classes
@pytest.mark.parametrize("k,cpp", [(20, 2), (10, 1), (30, 3), (5, 2), (4, 3), (3, 5)])
def test_classes_labels_per_partition(k, cpp):
    parts = partition_indices(LABELS, k, "classes", classes_per_partition=cpp, seed=4)
    assert_partition(parts, N, k)  # covering even when k < number of classes
    hist = label_histogram(LABELS, parts, 10)
    held = hist > 0
    assert np.all(held.sum(axis=1) == cpp)
    # NIID-Bench: partition i always holds label i % 10
    assert all(held[i, i % 10] for i in range(k))
    # each label split evenly among its holders
    for c in range(10):
        counts = hist[held[:, c], c]
        assert counts.max() - counts.min() <= 1


def test_classes_too_few_slots_raises():
    with pytest.raises(ValueError, match="classes_per_partition"):
        partition_indices(LABELS, 4, "classes", classes_per_partition=2)


# ----------------------------------------------------------------- shards
def test_shards_mnist_like():
    labels = shuffled_labels(6000)  # sorted-equal to MNIST's 60k as a 10 x 6000 vector
    parts = partition_indices(labels, 100, "shards", shards_per_partition=2, seed=0)
    assert_partition(parts, 60000, 100)
    assert all(p.size == 600 for p in parts)
    held = (label_histogram(labels, parts, 10) > 0).sum(axis=1)
    assert held.max() <= 2  # 300-shards never straddle a class boundary here
    assert (held == 2).sum() >= 75


def test_shards_leftover_round_robin():
    labels = shuffled_labels(603)  # 6030 samples, 20 shards of 301, 10 left over
    parts = partition_indices(labels, 10, "shards", shards_per_partition=2, seed=0)
    assert_partition(parts, labels.size, 10)
    sizes = np.array([p.size for p in parts])
    assert np.all((sizes >= 602) & (sizes <= 603)) and sizes.sum() == 6030
    parts = partition_indices(labels, 10, "shards", shards_per_partition=2, shard_size=250, seed=0)
    assert_partition(parts, labels.size, 10)
    assert min(p.size for p in parts) >= 500


# ----------------------------------------------------------------- quantity-skew
def test_quantity_skew_sigma0_balanced():
    parts = partition_indices(LABELS, 10, "quantity-skew", sigma=0.0, seed=0)
    assert all(p.size == 600 for p in parts)
    parts = partition_indices(LABELS, 7, "quantity-skew", sigma=0.0, seed=0)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_quantity_skew_sigma1_unbalanced_iid_labels():
    labels = shuffled_labels(3000)  # 30k samples
    parts = partition_indices(labels, 20, "quantity-skew", sigma=1.0, seed=0)
    assert_partition(parts, labels.size, 20)
    sizes = np.array([p.size for p in parts])
    assert sizes.min() >= 1
    assert sizes.std() / sizes.mean() > 0.3
    hist = label_histogram(labels, parts, 10)
    big = sizes >= 500
    frac = hist[big] / sizes[big, None]
    assert np.abs(frac - 0.1).max() < 0.06  # labels roughly IID


def test_quantity_skew_tiny_dataset_at_least_one_each():
    labels = np.arange(12) % 3
    for seed in range(20):
        parts = partition_indices(labels, 12, "quantity-skew", sigma=3.0, seed=seed)
        assert_partition(parts, 12, 12)
        assert all(p.size == 1 for p in parts)
    parts = partition_indices(labels, 5, "quantity-skew", sigma=3.0, seed=1)
    assert min(p.size for p in parts) >= 1


# ----------------------------------------------------------------- fedveca
def test_fedveca_case1_round_robin():
    parts = partition_indices(LABELS, 5, "fedveca-case1")
    for n in range(5):
        assert np.array_equal(parts[n], np.arange(n, N, 5))


def test_fedveca_case2_n5():
    parts = partition_indices(LABELS, 5, "fedveca-case2")
    for n in range(5):
        assert np.array_equal(parts[n], np.flatnonzero(LABELS % 5 == n))
        assert set(np.unique(LABELS[parts[n]])) == {n, n + 5}


def test_fedveca_case2_more_than_10_clients():
    parts = partition_indices(LABELS, 15, "fedveca-case2")
    assert_partition(parts, N, 15)
    for n in range(15):
        assert set(np.unique(LABELS[parts[n]])) == {n % 10}
    # label 3 spread evenly over partitions 3 and 13 (least-filled rule)
    assert parts[3].size == parts[13].size == 300
    assert parts[7].size == 600


def test_fedveca_case3_n5_spec_example():
    parts = partition_indices(LABELS, 5, "fedveca-case3")
    assert_partition(parts, N, 5)
    for n in range(3):
        assert set(np.unique(LABELS[parts[n]])) == {0, 1, 2, 3, 4}
        assert parts[n].size == 1000
    assert np.array_equal(parts[3], np.flatnonzero(np.isin(LABELS, [6, 8])))
    assert np.array_equal(parts[4], np.flatnonzero(np.isin(LABELS, [5, 7, 9])))


def test_fedveca_case3_mnist_and_cifar_sizes():
    mnist = np.random.default_rng(0).permutation(np.repeat(np.arange(10), MNIST_COUNTS))
    sizes = [p.size for p in partition_indices(mnist, 5, "fedveca-case3")]
    # spec: ~10.2k x 3, ~11.8k ({6,8}), ~17.6k ({5,7,9})
    assert sizes == [10199, 10199, 10198, 11769, 17635]
    cifar = shuffled_labels(5000)
    sizes = [p.size for p in partition_indices(cifar, 5, "fedveca-case3")]
    assert sizes == [8334, 8333, 8333, 10000, 15000]


def test_fedveca_case3_generalisation():
    # N = 10: labels 0-4 IID over partitions 0-4; label l >= 5 to partition l
    parts = partition_indices(LABELS, 10, "fedveca-case3")
    assert_partition(parts, N, 10)
    for n in range(5):
        assert set(np.unique(LABELS[parts[n]])) == {0, 1, 2, 3, 4}
    for n in range(5, 10):
        assert set(np.unique(LABELS[parts[n]])) == {n}
    # N = 50: partitions with n % 10 < 5 share 0-4; others hold label n % 10
    parts = partition_indices(LABELS, 50, "fedveca-case3")
    assert_partition(parts, N, 50)
    for n in range(50):
        got = set(np.unique(LABELS[parts[n]]))
        assert got == ({0, 1, 2, 3, 4} if n % 10 < 5 else {n % 10})
    # N = 1: everything in one partition
    assert_partition(partition_indices(LABELS, 1, "fedveca-case3"), N, 1)


def test_fedveca_case2_may_leave_partition_empty():
    labels = np.array([0, 0, 1, 1, 2, 2, 4, 4])  # label 3 missing
    parts = partition_indices(labels, 5, "fedveca-case2")
    assert_partition(parts, labels.size, 5)
    assert parts[3].size == 0


# ----------------------------------------------------------------- natural
def test_natural_one_group_each():
    ids = np.array([30, 10, 20, 10, 30, 30, 20])
    labels = np.zeros(7, dtype=int)
    parts = partition_indices(labels, 3, "natural", natural_ids=ids)
    assert [p.tolist() for p in parts] == [[1, 3], [2, 6], [0, 4, 5]]
    assert same(parts, partition_indices(labels, 3, "natural", natural_ids=ids, seed=9))


def test_natural_fewer_partitions_keeps_groups_whole():
    parts = partition_indices(LABELS, 8, "natural", natural_ids=NATURAL_IDS, seed=0)
    owner = np.empty(N, dtype=int)
    for i, p in enumerate(parts):
        owner[p] = i
    groups_per_part = np.zeros(8, dtype=int)
    for g in np.unique(NATURAL_IDS):
        owners = np.unique(owner[NATURAL_IDS == g])
        assert owners.size == 1  # a group is never split
        groups_per_part[owners[0]] += 1
    assert np.all(groups_per_part == 5)  # 40 groups dealt round-robin over 8


def test_natural_string_ids():
    ids = np.array(["b", "a", "c", "a"])
    parts = partition_indices(np.zeros(4, dtype=int), 3, "natural", natural_ids=ids)
    assert [p.tolist() for p in parts] == [[1, 3], [0], [2]]


# ----------------------------------------------------------------- histogram / plot
def test_label_histogram_sums():
    parts = partition_indices(LABELS, 10, "dirichlet", alpha=0.5, seed=0)
    hist = label_histogram(LABELS, parts, 10)
    assert hist.shape == (10, 10)
    assert np.array_equal(hist.sum(axis=1), [p.size for p in parts])
    assert np.array_equal(hist.sum(axis=0), np.bincount(LABELS, minlength=10))
    assert hist.sum() == N
    assert label_histogram(LABELS, parts, 12).shape == (10, 12)
    with pytest.raises(ValueError, match="num_classes"):
        label_histogram(LABELS, parts, 5)


def test_plot_writes_png(tmp_path):
    parts = partition_indices(LABELS, 10, "dirichlet", alpha=0.3, seed=0)
    out = plot_label_distribution(LABELS, parts, 10, tmp_path / "sub" / "dist.png", title="dir 0.3")
    assert out == str(tmp_path / "sub" / "dist.png")
    data = (tmp_path / "sub" / "dist.png").read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "args,kwargs,pattern",
    [
        ((LABELS, 10, "nope"), {}, r"scheme must be one of .*'iid'.*'natural'.*got 'nope'"),
        ((LABELS, 0, "iid"), {}, r"num_partitions must be an integer >= 1, got 0"),
        ((LABELS, 2.5, "iid"), {}, r"num_partitions must be an integer >= 1, got 2.5"),
        ((LABELS, N + 1, "iid"), {}, rf"num_partitions must be <= number of samples \({N}\), got {N + 1}"),
        ((LABELS, 10, "iid"), {"seed": -1}, r"seed must be an integer >= 0, got -1"),
        ((LABELS.astype(float), 10, "iid"), {}, r"labels must have an integer dtype"),
        ((LABELS.reshape(100, 60), 10, "iid"), {}, r"labels must be a non-empty 1-D array"),
        ((LABELS - 1, 10, "iid"), {}, r"labels must be >= 0"),
        ((LABELS, 10, "dirichlet"), {"alpha": 0.0}, r"dirichlet-alpha must be > 0, got 0.0"),
        ((LABELS, 10, "dirichlet"), {"alpha": -1}, r"dirichlet-alpha must be > 0, got -1"),
        ((LABELS, 10, "dirichlet"), {"min_size": -1}, r"min_size must be an integer >= 0, got -1"),
        ((LABELS, 10, "dirichlet"), {"min_size": 601}, r"min_size must be <= .*got 601"),
        ((LABELS, 10, "classes"), {"classes_per_partition": 0}, r"classes_per_partition must be an integer >= 1, got 0"),
        ((LABELS, 10, "classes"), {"classes_per_partition": 11}, r"classes_per_partition must be <= number of distinct labels \(10\), got 11"),
        ((LABELS, 10, "shards"), {"shards_per_partition": 0}, r"shards_per_partition must be an integer >= 1, got 0"),
        ((LABELS, 10, "shards"), {"shards_per_partition": 601}, r"shards_per_partition must be <= .*got 601"),
        ((LABELS, 10, "shards"), {"shard_size": 0}, r"shard_size must be an integer >= 1, got 0"),
        ((LABELS, 10, "shards"), {"shard_size": 301}, r"shard_size must be <= .*= 300, got 301"),
        ((LABELS, 10, "quantity-skew"), {"sigma": -0.5}, r"sigma must be >= 0, got -0.5"),
        ((LABELS, 10, "natural"), {}, r"natural_ids must be given for scheme 'natural', got None"),
        ((LABELS, 10, "natural"), {"natural_ids": NATURAL_IDS[:-1]}, r"natural_ids must have the same shape"),
        ((LABELS, 41, "natural"), {"natural_ids": NATURAL_IDS}, r"num_partitions must be <= number of natural groups \(40\).*got 41"),
    ],
)
def test_value_errors(args, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        partition_indices(*args, **kwargs)


def test_dirichlet_unreachable_min_size_raises():
    labels = shuffled_labels(10)  # 100 samples
    with pytest.raises(ValueError, match=r"min_size=10 could not be met with dirichlet-alpha=0.01"):
        partition_indices(labels, 10, "dirichlet", alpha=0.01, min_size=10, seed=0)

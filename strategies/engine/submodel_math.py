"""Width-heterogeneous sub-models, numpy only: the units a client of a given width keeps,
its sub-model arrays, and the overlap aggregation.

* HeteroFL (Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient
  Federated Learning for Heterogeneous Clients", ICLR 2021), Sec. 3.1: width r trains the
  first r-fraction of each hidden layer's units; each global entry is averaged over the
  clients whose sub-model contains it.
* FjORD (Horvath et al., "FjORD: Fair and Accurate Federated Learning under heterogeneous
  targets with Ordered Dropout", NeurIPS 2021), Sec. 3: Ordered Dropout keeps the left-most
  ceil(p K) units of each layer.
* FedRolex (Alam, Liu, Yan and Zhang, "FedRolex: Model-Heterogeneous Federated Learning
  with Rolling Sub-Model Extraction", NeurIPS 2022), Sec. 3.2 and Algorithm 1: as many
  units, in a window starting at (round mod K) that wraps around; the same aggregation.

Not confirmed: the papers' text was not available here, so no equation numbers are cited
and the sections are as we know them; the window start (round mod K, rounds from 0) follows
others' transcription of FedRolex's Sec. 3.2 equation, which has floor(r K) units.
Confirmed in the authors' code: HeteroFL ``src/fed.py`` (``arange(K)[:int(np.ceil(K *
rate))]``; ``combine``: ``count += 1``, each client counts once whatever its examples, count
0 keeps the global value); FjORD's Flower baseline (``int(np.ceil(width * p))``, averages
weighted by examples); FedRolex ``resnet_server.py`` (``torch.roll(arange(K), rounds %
K)[:ceil(K * rate)]``: ceil, as we use, and a window starting at (-round) mod K, the mirror
image of ours). A product ratio * size within a relative 1e-12 above an integer counts as
that integer (0.55 * 100 = 55.000000000000007 keeps 55 units, not 56); the papers' levels
(1/2^k) give exact products. Weights: uniform unless given (e.g. example counts, as FjORD's
code). Floating arrays are averaged in float64 and cast back to their dtype.

Label split (:func:`output_layer` and :func:`label_rows`): HeteroFL's code trains every
client with a masked cross-entropy (the logits of the labels absent from its data set to 0;
its README's "Masked CrossEntropy", ``mask: '1'`` in ``src/config.yml``) and its ``combine``
averages each client's output-layer rows only over its own labels (``param_idx[m][k][0] =
param_idx[m][k][0][label_split]``, ``local_parameters[m][k][label_split]``, for the output
layer's weight and bias: the last ``weight`` and ``bias`` of ``conv``, the ``linear`` keys
of ``resnet``); FedRolex's ``resnet_server.py`` ``combine`` does the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from .averaging import WeightedModelSum

NDArrays = dict[str, np.ndarray]
AxisIndex = np.ndarray | slice
Indices = dict[str, tuple[AxisIndex, ...]]
ClientUpdate = tuple[Mapping[str, Sequence[AxisIndex]], Mapping[str, np.ndarray], float | None]
SCHEMES = ("static", "rolling")  # static: HeteroFL, FjORD; rolling: FedRolex


@dataclass(frozen=True)
class HiddenUnits:
    """An array axis made of the units of hidden dimension ``dim``, ``repeat`` consecutive
    entries per unit (repeat > 1 after a flatten: 16 channels x 4 x 4 -> 256 inputs)."""

    dim: str
    repeat: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.dim, str) or not self.dim:
            raise ValueError(f"dim={self.dim!r} must be a non-empty name of a hidden dimension")
        if not _is_int(self.repeat) or self.repeat < 1:
            raise ValueError(f"repeat={self.repeat!r} must be an int >= 1 (height x width)")


@dataclass(frozen=True)
class WidthSpec:
    """Per parameter key, per array axis: the :class:`HiddenUnits` the axis scales with (a
    bare name means repeat 1) or None (never scales: first inputs, class outputs, kernels).
    Keys not listed never scale (e.g. ``num_batches_tracked``)."""

    axes: Mapping[str, tuple[str | HiddenUnits | None, ...]]

    def __post_init__(self) -> None:
        normalised = {}
        for key, entries in self.axes.items():
            if not isinstance(entries, (tuple, list)):
                raise ValueError(f"axes[{key!r}]={entries!r} must be a tuple with one entry "
                                 f"per array axis, e.g. ('conv1', None, None, None)")
            for entry in entries:
                if not (entry is None or isinstance(entry, (str, HiddenUnits))):
                    raise ValueError(f"axes[{key!r}] has entry {entry!r}; use a hidden-"
                                     f"dimension name, HiddenUnits(name, repeat) or None")
            normalised[key] = tuple(HiddenUnits(e) if isinstance(e, str) else e for e in entries)
        object.__setattr__(self, "axes", MappingProxyType(normalised))


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value) -> bool:
    return _is_int(value) or isinstance(value, (float, np.floating))


def _check_ratio(ratio, name: str = "ratio") -> float:
    if not _is_real(ratio) or not 0.0 < float(ratio) <= 1.0:
        raise ValueError(f"{name}={ratio!r} must be a number in (0, 1], e.g. 0.5 for half width")
    return float(ratio)


def unit_indices(scheme: str, size: int, ratio: float, round: int = 0) -> np.ndarray:
    """The kept units (int64) of a hidden dimension of ``size`` units at width ``ratio``:
    n = ceil(ratio * size) units 0 .. n-1 ("static": HeteroFL Sec. 3.1, FjORD Sec. 3) or n
    units from (round mod size), wrapping to 0, in window order ("rolling": FedRolex Sec.
    3.2). ``round`` is the 0-based round (Flower: ``server_round - 1``); static ignores it."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r}: use 'static' (HeteroFL, FjORD) or 'rolling'")
    if not _is_int(size) or size < 1:
        raise ValueError(f"size={size!r} must be an int >= 1: the units of the hidden dimension")
    ratio = _check_ratio(ratio)
    if not _is_int(round) or round < 0:
        raise ValueError(f"round={round!r} must be an int >= 0: the 0-based round index "
                         f"(Flower's server_round - 1)")
    product = int(size) * ratio
    kept = min(int(size), math.ceil(product - product * 1e-12))
    start = int(round) % int(size) if scheme == "rolling" else 0
    return (start + np.arange(kept, dtype=np.int64)) % int(size)


def _dim_sizes(spec: WidthSpec, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for key, entries in spec.axes.items():
        if key not in shapes:
            raise ValueError(f"spec key {key!r} is not a parameter; remove it or fix its name")
        shape = tuple(shapes[key])
        if len(entries) != len(shape):
            raise ValueError(f"spec for {key!r} lists {len(entries)} axes but its shape "
                             f"{shape} has {len(shape)}; give one entry per axis")
        for axis, entry in ((a, e) for a, e in enumerate(entries) if e is not None):
            units, rest = divmod(shape[axis], entry.repeat)
            if rest:
                raise ValueError(f"{key!r} axis {axis} has {shape[axis]} entries, not a "
                                 f"multiple of repeat={entry.repeat}; fix the repeat")
            if sizes.setdefault(entry.dim, units) != units:
                raise ValueError(f"hidden dimension {entry.dim!r} has {sizes[entry.dim]} units "
                                 f"elsewhere but {units} on {key!r} axis {axis}; fix the spec")
    return sizes


def submodel_indices(spec: WidthSpec, shapes: Mapping[str, tuple[int, ...]], scheme: str,
                     ratio: float, round: int = 0) -> Indices:
    """Per parameter of ``shapes``, per axis: the kept entries (int64), or ``slice(None)``
    for an axis that never scales. Every hidden dimension keeps :func:`unit_indices`; a
    unit u on an axis with repeat R keeps entries u*R .. u*R+R-1."""
    units = {dim: unit_indices(scheme, size, ratio, round)
             for dim, size in _dim_sizes(spec, shapes).items()}
    out: Indices = {}
    for key, shape in shapes.items():
        entries = spec.axes.get(key, (None,) * len(tuple(shape)))
        out[key] = tuple(slice(None) if entry is None else
                         (units[entry.dim][:, None] * entry.repeat
                          + np.arange(entry.repeat, dtype=np.int64)).ravel()
                         for entry in entries)
    return out


def _open_mesh(key: str, shape: tuple[int, ...], index: Sequence[AxisIndex]
               ) -> tuple[tuple[np.ndarray, ...], tuple[int, ...]]:
    """``np.ix_`` of ``index`` on an array of ``shape``, and the shape it selects."""
    if len(index) != len(shape):
        raise ValueError(f"indices of {key!r} have {len(index)} axes but its shape {shape} has "
                         f"{len(shape)}; build them with submodel_indices")
    axes = []
    for axis, (length, entry) in enumerate(zip(shape, index)):
        picked = np.arange(length)[entry] if isinstance(entry, slice) else np.asarray(entry)
        if (picked.ndim != 1 or not np.issubdtype(picked.dtype, np.integer)
                or (picked.size and (picked.min() < 0 or picked.max() >= length))
                or np.unique(picked).size != picked.size):
            raise ValueError(f"indices of {key!r} axis {axis} must be distinct ints in "
                             f"[0, {length}); build them with submodel_indices")
        axes.append(picked)
    return np.ix_(*axes), tuple(a.size for a in axes)


def _same_keys(what: str, keys, expected) -> None:
    missing, extra = sorted(set(expected) - set(keys)), sorted(set(keys) - set(expected))
    if missing or extra:
        raise ValueError(f"{what}: keys missing {missing}, unexpected {extra}; use the same "
                         f"keys as the indices")


def extract(params: Mapping[str, np.ndarray], indices: Mapping[str, Sequence[AxisIndex]]
            ) -> NDArrays:
    """The client's sub-model: a C-contiguous copy of every parameter's selected entries."""
    _same_keys("params", params, indices)
    out: NDArrays = {}
    for key, index in indices.items():
        array = np.asarray(params[key])
        mesh, _ = _open_mesh(key, array.shape, index)
        out[key] = np.ascontiguousarray(array[mesh]) if mesh else np.array(array, copy=True)
    return out


def output_layer(spec: WidthSpec, shapes: Mapping[str, tuple[int, ...]]
                 ) -> tuple[tuple[str, ...], int]:
    """The output layer's parameters and the number of classes C, for the label split.

    The output layer is the parameters of ``spec`` whose first axis never scales (None): in
    a width-scalable classifier every other layer's first axis is its own hidden units, and
    the class outputs are the one unscaled first axis (HeteroFL's code: ``split_model``
    keeps every output row of the output layer, ``torch.arange(output_size)``). Their first
    axis has C entries, one per class.

    Raises
    ------
    ValueError
        When no parameter of ``spec`` has an unscaled first axis, or when those that have
        one disagree on C (naming the keys, their shapes and the fix).
    """
    keys = tuple(key for key, entries in spec.axes.items()
                 if entries and entries[0] is None and key in shapes
                 and len(tuple(shapes[key])) >= 1)
    if not keys:
        raise ValueError("the label split averages each output-layer row over the clients "
                         "that hold its label, but no parameter of the width spec has an "
                         "unscaled first axis (the class outputs: None as its first entry, "
                         "e.g. 'fc3.weight': (None, ('fc2', 1)), 'fc3.bias': (None,)); list "
                         "the output layer in the spec, or turn the label split off "
                         "(label_split=False)")
    rows = {key: int(tuple(shapes[key])[0]) for key in keys}
    if len(set(rows.values())) != 1:
        raise ValueError(f"the width spec's parameters with an unscaled first axis should be "
                         f"the output layer (one row per class), but their first axes differ: "
                         f"{rows}; mark the first axis of every other parameter with its "
                         f"hidden dimension, or turn the label split off (label_split=False)")
    return keys, next(iter(rows.values()))


def label_rows(indices: Mapping[str, Sequence[AxisIndex]], sub_params: Mapping[str, np.ndarray],
               keys: Sequence[str], labels: Sequence[int] | np.ndarray
               ) -> tuple[Indices, NDArrays]:
    """A client's update restricted to the output rows of its own labels (HeteroFL's and
    FedRolex's ``combine`` with ``label_split``): on every key of ``keys`` (the output
    layer, :func:`output_layer`), axis 0 keeps only the entries ``labels`` (indices into the
    client's rows, distinct, ascending), both in the indices and in the arrays; the other
    keys are unchanged. :func:`overlap_aggregate` then counts the client as a holder of an
    output row only for its labels.

    Raises
    ------
    ValueError
        When a key is not in both ``indices`` and ``sub_params``, or ``labels`` are not
        distinct ints in [0, rows).
    """
    labels = np.asarray(labels)
    out_indices: Indices = {k: tuple(v) for k, v in indices.items()}
    out_params: NDArrays = dict(sub_params)
    for key in keys:
        if key not in indices or key not in sub_params:
            raise ValueError(f"output-layer key {key!r} is not in the client's update; "
                             f"give the keys of output_layer()")
        rows = np.asarray(sub_params[key]).shape[0]
        if (labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer)
                or (labels.size and (labels.min() < 0 or labels.max() >= rows))
                or np.unique(labels).size != labels.size):
            raise ValueError(f"labels={labels.tolist()!r} must be distinct ints in [0, {rows}): "
                             f"the rows of {key!r} the client trained")
        first, *rest = indices[key]
        kept = np.arange(rows, dtype=np.int64)[first] if isinstance(first, slice) \
            else np.asarray(first, dtype=np.int64)
        out_indices[key] = (kept[labels], *rest)
        out_params[key] = np.asarray(sub_params[key])[labels]
    return out_indices, out_params


def overlap_aggregate(global_params: Mapping[str, np.ndarray],
                      client_updates: Sequence[ClientUpdate]) -> NDArrays:
    """HeteroFL's aggregation (Sec. 3.1; also FedRolex's, Algorithm 1): each entry becomes
    sum_k w_k x_k / sum_k w_k over the clients k whose sub-model holds it, else keeps its
    global value. One (indices, sub-model arrays, weight) per client; weight None = 1
    (uniform, HeteroFL's code) or e.g. example counts (FjORD's code). A client omits a key
    from both dicts to leave it untrained (:func:`label_rows` leaves out the output rows of
    the labels it lacks); integer arrays keep the global value."""
    for number, (indices, sub_params, weight) in enumerate(client_updates):
        _same_keys(f"client {number} sub-model", sub_params, indices)
        unknown = sorted(set(indices) - set(global_params))
        if unknown:
            raise ValueError(f"client {number} sends {unknown}, not global parameters; "
                             f"build its indices with submodel_indices")
        if weight is not None and (not _is_real(weight) or not 0 < float(weight) < math.inf):
            raise ValueError(f"client {number} weight={weight!r} must be a finite number > 0 "
                             f"(e.g. its example count), or None for uniform")
    acc = WeightedModelSum()
    for number, (indices, sub_params, weight) in enumerate(client_updates):
        w = 1.0 if weight is None else float(weight)
        for key, index in indices.items():
            value = np.asarray(global_params[key])
            if not np.issubdtype(value.dtype, np.floating):
                continue
            mesh, expected = _open_mesh(key, value.shape, index)
            sub = np.asarray(sub_params[key], dtype=np.float64)
            if sub.shape != expected:
                raise ValueError(f"client {number} sends {key!r} with shape {sub.shape} but its "
                                 f"indices select {expected}; send extract()'s arrays")
            acc.add_part(key, sub, w, mesh, value.shape)
        acc.finish_part(w)
    return acc.held_mean(global_params)

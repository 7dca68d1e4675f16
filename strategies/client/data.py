"""A client's local training data as two tensors, from what a ClientApp usually holds.

The helpers that follow a strategy's step schedule (FedVeca's tau steps, DynamicFL's
chunks) need random access to the local set: ``x`` and ``y`` tensors. A ClientApp
written like Flower's PyTorch template holds a ``DataLoader`` whose batches are dicts
(``{"img": ..., "label": ...}``) or ``(x, y)`` pairs; :func:`as_tensors` turns either into
the two tensors, in the dataset's own order (never the loader's shuffled order, so that
every call sees the same indices). Convert once per process and keep the result when
a round has many messages (DynamicFL sends one per chunk). :func:`writable_tensor` turns
one array of a message (often a read-only view of its buffer) into a tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FEATURE_KEYS = ("img", "image", "x", "features", "input")
LABEL_KEYS = ("label", "labels", "y", "target", "targets")


def _pair(batch: Any) -> tuple[Any, Any]:
    """(features, labels) of one batch: a dict with known keys, or a 2-sequence."""
    if isinstance(batch, Mapping):
        x_key = next((k for k in FEATURE_KEYS if k in batch), None)
        y_key = next((k for k in LABEL_KEYS if k in batch), None)
        if x_key is None or y_key is None:
            raise ValueError(
                f"a batch dict needs a feature key (one of {FEATURE_KEYS}) and a label key "
                f"(one of {LABEL_KEYS}); got keys {sorted(batch)}. Pass (x, y) tensors instead")
        return batch[x_key], batch[y_key]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(f"cannot read (x, y) from a batch of type {type(batch).__name__}; "
                     "pass (x, y) tensors, or a DataLoader of dicts or (x, y) pairs")


def as_tensors(data: Any, device: Any = None) -> tuple[Any, Any]:
    """``(x, y)`` tensors of the local training set, on ``device`` when given.

    Parameters
    ----------
    data
        ``(x, y)`` tensors (or numpy arrays); or a ``torch.utils.data.DataLoader`` (its
        dataset is read in order with the loader's ``collate_fn``); or a Dataset / iterable
        of batches that are dicts (``img``/``label`` and similar keys) or ``(x, y)`` pairs.
    device
        Where the tensors go (e.g. the model's device); None leaves them where they are.
    """
    import torch  # noqa: PLC0415  (lazy: strategies never needs torch at import)
    from torch.utils.data import DataLoader  # noqa: PLC0415

    pair = isinstance(data, (tuple, list)) and len(data) == 2
    if pair and all(hasattr(t, "shape") for t in data):
        x, y = torch.as_tensor(data[0]), torch.as_tensor(data[1])  # tensors or numpy arrays
    else:
        if isinstance(data, DataLoader):
            batches = DataLoader(data.dataset, batch_size=data.batch_size or 256, shuffle=False,
                                 collate_fn=data.collate_fn)
        elif hasattr(data, "__getitem__") and hasattr(data, "__len__"):
            batches = DataLoader(data, batch_size=256, shuffle=False)
        else:
            batches = data
        pairs = [_pair(batch) for batch in batches]
        if not pairs:
            raise ValueError("the local training data is empty")
        x = torch.cat([torch.as_tensor(p[0]) for p in pairs])
        y = torch.cat([torch.as_tensor(p[1]) for p in pairs])
    if device is not None:
        x, y = x.to(device), y.to(device)
    return x, y


def loader_batch_size(data: Any) -> int | None:
    """The ``batch_size`` of a DataLoader (None for tensors or a loader without one)."""
    size = getattr(data, "batch_size", None)
    return int(size) if isinstance(size, int) and size > 0 else None


def model_device(model: Any) -> Any:
    """The device of the model's first parameter (None for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return None


def tensors_for(model: Any, data: Any) -> tuple[Any, Any]:
    """:func:`as_tensors` of ``data``, on ``model``'s device."""
    x, y = as_tensors(data)
    device = model_device(model)
    return (x, y) if device is None else (x.to(device), y.to(device))


def writable_tensor(array: Any) -> Any:
    """``torch.as_tensor(array)``, copying a read-only numpy array first (the arrays of a
    Flower message are often views of its read-only buffer, which torch warns it cannot
    share safely); writable arrays and tensors are shared, not copied."""
    import torch  # noqa: PLC0415

    flags = getattr(array, "flags", None)
    return torch.as_tensor(array.copy() if flags is not None and not flags.writeable else array)

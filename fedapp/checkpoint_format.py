"""The typed codec of a checkpoint: Python/numpy values <-> tagged JSON plus named arrays.

``encode(value)`` returns ``(tree, arrays)``: ``tree`` is JSON-able (no NaN constants) and
``arrays`` maps names to the numpy arrays it references, to be saved in an ``.npz`` and
loaded with ``allow_pickle=False``; ``decode(tree, arrays)`` gives back a value equal to the
original in bits and types (:func:`identical`). Nothing is unpickled, nothing is imported
by name: a hostile file can fail to load, never run code.

JSON values stand for themselves where JSON is exact: ``null``, ``true``/``false``, strings,
integers (Python's ``json`` keeps them exact at any size), finite floats (written with
``repr``, read back to the same bits) and lists. Every JSON object is a tag with one key:

=========================================  ===============================================
``{"tuple": [...]}``                       a tuple
``{"dict": [[key, value], ...]}``          a dict, in order; keys encoded like values, so
                                           ``3`` and ``"3"`` stay apart
``{"float": "7ff8000000000000"}``          a non-finite float, by its 64 bits
``{"ndarray": "a3"}``                      the array named ``a3`` of the ``.npz``
``{"numpy": ["<f4", "0000c03f"]}``         a numpy scalar: dtype string, its bytes in hex
=========================================  ===============================================

Object dtypes (which only a pickle could hold) are refused when writing and reading.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np

TAGS = ("tuple", "dict", "float", "ndarray", "numpy")


class CheckpointFormatError(ValueError):
    """A value that the checkpoint format cannot hold, or a tree that is not one it wrote."""


# ----------------------------------------------------------------- encode
def encode(value: object) -> tuple[object, dict[str, np.ndarray]]:
    """(tagged JSON tree, arrays by name) of ``value``."""
    arrays: dict[str, np.ndarray] = {}
    return _encode(value, arrays, "payload"), arrays


def _encode(value: object, arrays: dict[str, np.ndarray], where: str) -> object:
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else {"float": struct.pack(">d", value).hex()}
    if kind is list:
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]
    if kind is tuple:
        return {"tuple": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]}
    if kind is dict:
        return {"dict": [[_encode(k, arrays, f"{where} key {k!r}"),
                          _encode(v, arrays, f"{where}[{k!r}]")] for k, v in value.items()]}
    if kind is np.ndarray:
        _refuse_object_dtype(value.dtype, where)
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {"ndarray": name}
    if isinstance(value, np.generic):
        _refuse_object_dtype(value.dtype, where)
        return {"numpy": [value.dtype.str, np.asarray(value).tobytes().hex()]}
    raise CheckpointFormatError(
        f"checkpoint: {where} is a {kind.__module__}.{kind.__qualname__}, which the checkpoint "
        "format cannot hold; a state_dict may hold dicts, lists, tuples, str, int, float, bool, "
        "None, numpy arrays and numpy scalars (fedapp/checkpoint_format.py)")


def _refuse_object_dtype(dtype: np.dtype, where: str) -> None:
    if dtype.hasobject:
        raise CheckpointFormatError(f"checkpoint: {where} has dtype {dtype} (Python objects); "
                                    "only numeric, bool and string dtypes can be stored")


# ----------------------------------------------------------------- decode
def decode(tree: object, arrays: dict[str, np.ndarray]) -> object:
    """The value :func:`encode` was given (raises CheckpointFormatError on a tree it did
    not write: an unknown tag, a missing array, a bad scalar)."""
    return _decode(tree, arrays, "payload")


def _decode(tree: object, arrays: dict[str, np.ndarray], where: str) -> object:
    kind = type(tree)
    if tree is None or kind in (bool, int, str):
        return tree
    if kind is float:
        if not math.isfinite(tree):
            raise CheckpointFormatError(f"{where}: a bare non-finite float")
        return tree
    if kind is list:
        return [_decode(v, arrays, f"{where}[{i}]") for i, v in enumerate(tree)]
    if kind is not dict or len(tree) != 1 or next(iter(tree)) not in TAGS:
        raise CheckpointFormatError(f"{where}: {_short(tree)} is not a value of the checkpoint "
                                    f"format (a JSON object must have one key of {TAGS})")
    tag, body = next(iter(tree.items()))
    return _DECODERS[tag](body, arrays, where)


def _decode_tuple(body: object, arrays: dict, where: str) -> tuple:
    if type(body) is not list:
        raise CheckpointFormatError(f"{where}: a tuple's body must be a list, not {_short(body)}")
    return tuple(_decode(v, arrays, f"{where}[{i}]") for i, v in enumerate(body))


def _decode_dict(body: object, arrays: dict, where: str) -> dict:
    if type(body) is not list or any(type(p) is not list or len(p) != 2 for p in body):
        raise CheckpointFormatError(f"{where}: a dict's body must be a list of [key, value] "
                                    f"pairs, not {_short(body)}")
    out = {}
    for key_tree, value_tree in body:
        key = _decode(key_tree, arrays, f"{where} key")
        try:
            hash(key)
        except TypeError:
            raise CheckpointFormatError(f"{where}: dict key {_short(key)} is unhashable") from None
        if key in out:
            raise CheckpointFormatError(f"{where}: dict key {key!r} twice")
        out[key] = _decode(value_tree, arrays, f"{where}[{key!r}]")
    return out


def _decode_float(body: object, arrays: dict, where: str) -> float:
    del arrays
    if type(body) is not str or len(body) != 16:
        raise CheckpointFormatError(f"{where}: a float's bits must be 16 hex digits, "
                                    f"not {_short(body)}")
    try:
        return struct.unpack(">d", bytes.fromhex(body))[0]
    except ValueError:
        raise CheckpointFormatError(f"{where}: {body!r} is not 16 hex digits") from None


def _decode_ndarray(body: object, arrays: dict, where: str) -> np.ndarray:
    if type(body) is not str or body not in arrays:
        raise CheckpointFormatError(f"{where}: array {_short(body)} is not in the .npz")
    return arrays[body]


def _decode_numpy(body: object, arrays: dict, where: str) -> np.generic:
    del arrays
    if type(body) is not list or len(body) != 2 or not all(type(b) is str for b in body):
        raise CheckpointFormatError(f"{where}: a numpy scalar must be [dtype, hex bytes], "
                                    f"not {_short(body)}")
    try:
        dtype = np.dtype(body[0])
        data = bytes.fromhex(body[1])
    except (TypeError, ValueError):
        raise CheckpointFormatError(f"{where}: {_short(body)} is not a numpy scalar") from None
    if (dtype.hasobject or dtype.shape != () or dtype.itemsize != len(data)
            or dtype.itemsize == 0):
        raise CheckpointFormatError(f"{where}: {_short(body)}: dtype {dtype} with "
                                    f"{len(data)} bytes is not a numpy scalar")
    return np.frombuffer(data, dtype=dtype)[0]


_DECODERS = {"tuple": _decode_tuple, "dict": _decode_dict, "float": _decode_float,
             "ndarray": _decode_ndarray, "numpy": _decode_numpy}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ----------------------------------------------------------------- the JSON text
def dumps(tree: object) -> str:
    """The one JSON text of ``tree`` (sorted keys, no NaN constants): what is hashed."""
    return json.dumps(tree, sort_keys=True, separators=(",", ":"), allow_nan=False)


def loads(text: str) -> object:
    """JSON text without NaN / Infinity constants (the format writes non-finite floats as
    tagged bits, so a bare one means the file was not written by it)."""
    def refuse(name: str) -> None:
        raise CheckpointFormatError(f"bare {name} in the JSON")
    return json.loads(text, parse_constant=refuse)


# ----------------------------------------------------------------- equality
def identical(a: object, b: object) -> bool:
    """True when ``a`` and ``b`` are equal in types and bits (arrays: dtype, shape, bytes;
    floats: their 64 bits, so NaN == NaN and 0.0 != -0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    if type(a) is float:
        return struct.pack(">d", a) == struct.pack(">d", b)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return (len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
                and all(identical(a[k], b[k]) for k in a))
    return a == b

"""strategies.engine.records: ArrayRecord arrays read in place (views of the .npy bytes) and
written with one copy, against Flower's own Array(ndarray) / Array.numpy()."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from strategies.engine import records

ARRAYS = {
    "float32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "scalar": np.array(3.5, dtype=np.float32),
    "int64": np.arange(5, dtype=np.int64),
    "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    "empty": np.zeros((0, 3)),
    "bool": np.array([True, False]),
    "float16": np.array([[1.5, -2.0]], dtype=np.float16),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_array_view_reads_what_flower_wrote(name):
    value = ARRAYS[name]
    view = records.array_view(Array(value))
    np.testing.assert_array_equal(view, value)
    assert view.dtype == value.dtype and view.shape == value.shape
    assert not view.flags.writeable  # a view of the message bytes, not a copy


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_array_of_writes_what_flower_reads(name):
    value = ARRAYS[name]
    array = records.array_of(value)
    np.testing.assert_array_equal(array.numpy(), value)  # Flower's own reader
    assert array.dtype == Array(value).dtype and tuple(array.shape) == value.shape
    if value.flags.c_contiguous:
        assert array.data == Array(value).data  # the same .npy bytes as np.save's


def test_to_numpy_and_to_record_round_trip():
    record = records.to_record(ARRAYS)
    assert isinstance(record, ArrayRecord) and list(record.keys()) == list(ARRAYS)
    back = records.to_numpy(record)
    for key, value in ARRAYS.items():
        np.testing.assert_array_equal(back[key], value)


def test_array_view_falls_back_to_flowers_reader_for_what_it_does_not_know():
    broken = Array(dtype="float32", shape=(2,), stype="numpy.ndarray", data=b"not an npy file")
    with pytest.raises(ValueError):
        records.array_view(broken)  # np.load's error, as Array.numpy() gives it

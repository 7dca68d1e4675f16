"""Width-heterogeneous sub-models (strategies.engine.submodel_math) against hand-computed arrays:
HeteroFL / FjORD static prefixes, FedRolex rolling windows, extraction across a flatten,
HeteroFL's overlap aggregation and the deadline-to-width helper."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from strategies.engine import submodel_math as sm
from strategies.engine.submodel_math import HiddenUnits, WidthSpec

F32 = np.float32

# A conv layer (4 output channels, 1 input channel, 1x2 kernel) and a linear layer after a
# flatten: each channel's 1x2 feature map becomes 2 consecutive inputs of fc (4 x 2 = 8).
SPEC = WidthSpec({"conv.weight": ("conv", None, None, None), "conv.bias": ("conv",),
                  "fc.weight": (None, HiddenUnits("conv", repeat=2))})
SHAPES = {"conv.weight": (4, 1, 1, 2), "conv.bias": (4,), "fc.weight": (3, 8),
          "fc.bias": (3,), "bn.num_batches_tracked": ()}


def toy_model() -> dict[str, np.ndarray]:
    return {"conv.weight": np.arange(8, dtype=F32).reshape(4, 1, 1, 2),
            "conv.bias": np.array([10, 11, 12, 13], F32),
            "fc.weight": np.arange(24, dtype=F32).reshape(3, 8),
            "fc.bias": np.array([-1, -2, -3], F32),
            "bn.num_batches_tracked": np.array(7, np.int64)}


# --- unit_indices ----------------------------------------------------------------------

@pytest.mark.parametrize("size, ratio, expected", [
    (4, 1.0, [0, 1, 2, 3]), (4, 0.5, [0, 1]), (4, 0.25, [0]), (4, 0.75, [0, 1, 2]),
    (5, 0.5, [0, 1, 2]),  # ceil(2.5) = 3, as HeteroFL's int(np.ceil(size * rate))
    (3, 0.1, [0]),        # ceil(0.3) = 1: never an empty layer
    (10, 0.7, [0, 1, 2, 3, 4, 5, 6]),
])
def test_static_units_are_the_first_ceil_ratio_size(size, ratio, expected):
    units = sm.unit_indices("static", size, ratio, round=5)  # static ignores the round
    assert units.dtype == np.int64
    np.testing.assert_array_equal(units, expected)


def test_unit_count_ignores_floating_point_noise_in_the_product():
    # 0.55 * 100 = 55.000000000000007 in floating point: 55 units, not 56
    assert sm.unit_indices("static", 100, 0.55).size == 55
    assert sm.unit_indices("static", 5, 0.2).size == 1


@pytest.mark.parametrize("size, ratio, round_, expected", [
    (4, 0.5, 0, [0, 1]), (4, 0.5, 1, [1, 2]), (4, 0.5, 2, [2, 3]),
    (4, 0.5, 3, [3, 0]),            # wraps around
    (4, 0.75, 6, [2, 3, 0]),        # 6 mod 4 = 2
    (5, 0.5, 4, [4, 0, 1]),         # ceil(2.5) = 3 units from 4
    (4, 1.0, 3, [3, 0, 1, 2]),      # full width: every unit, in window order
    (4, 0.25, 9, [1]),
])
def test_rolling_window_starts_at_round_mod_size(size, ratio, round_, expected):
    np.testing.assert_array_equal(sm.unit_indices("rolling", size, ratio, round=round_),
                                  expected)


@pytest.mark.parametrize("args, words", [
    (("dynamic", 4, 0.5, 0), ["scheme='dynamic'", "'static'", "'rolling'"]),
    (("static", 0, 0.5, 0), ["size=0", ">= 1"]),
    (("static", 4.0, 0.5, 0), ["size=4.0"]),
    (("static", True, 0.5, 0), ["size=True"]),
    (("static", 4, 0.0, 0), ["ratio=0.0", "(0, 1]"]),
    (("static", 4, 1.5, 0), ["ratio=1.5"]),
    (("static", 4, math.nan, 0), ["ratio=nan"]),
    (("static", 4, True, 0), ["ratio=True"]),
    (("static", 4, "0.5", 0), ["ratio='0.5'"]),
    (("rolling", 4, 0.5, -1), ["round=-1", "server_round - 1"]),
    (("rolling", 4, 0.5, 1.0), ["round=1.0"]),
])
def test_unit_indices_refuses_bad_arguments(args, words):
    with pytest.raises(ValueError) as error:
        sm.unit_indices(*args[:3], round=args[3])
    for word in words:
        assert word in str(error.value)


# --- WidthSpec ---------------------------------------------------------------------------

def test_width_spec_normalises_names_and_is_read_only():
    assert SPEC.axes["conv.bias"] == (HiddenUnits("conv", 1),)
    assert SPEC.axes["fc.weight"] == (None, HiddenUnits("conv", 2))
    with pytest.raises(TypeError):
        SPEC.axes["new"] = (None,)


@pytest.mark.parametrize("build, words", [
    (lambda: HiddenUnits("conv", 0), ["repeat=0"]),
    (lambda: HiddenUnits("conv", 2.0), ["repeat=2.0"]),
    (lambda: HiddenUnits(""), ["dim=''"]),
    (lambda: WidthSpec({"conv.bias": "conv"}), ["axes['conv.bias']='conv'", "tuple"]),
    (lambda: WidthSpec({"conv.bias": (3,)}), ["axes['conv.bias']", "entry 3"]),
])
def test_width_spec_refuses_malformed_entries(build, words):
    with pytest.raises(ValueError) as error:
        build()
    for word in words:
        assert word in str(error.value)


# --- submodel_indices and extract -----------------------------------------------------------

def test_full_width_extracts_the_whole_model_as_copies():
    params = toy_model()
    sub = sm.extract(params, sm.submodel_indices(SPEC, SHAPES, "static", 1.0))
    assert set(sub) == set(params)
    for key, value in params.items():
        np.testing.assert_array_equal(sub[key], value)
        assert sub[key].dtype == value.dtype and sub[key].flags.c_contiguous
    sub["conv.bias"][0] = 99
    sub["bn.num_batches_tracked"][()] = 99
    assert params["conv.bias"][0] == 10 and params["bn.num_batches_tracked"] == 7


def test_half_width_keeps_the_first_two_channels_and_their_flattened_inputs():
    indices = sm.submodel_indices(SPEC, SHAPES, "static", 0.5)
    np.testing.assert_array_equal(indices["fc.weight"][1], [0, 1, 2, 3])
    assert indices["fc.weight"][0] == slice(None) and indices["bn.num_batches_tracked"] == ()
    sub = sm.extract(toy_model(), indices)
    np.testing.assert_array_equal(sub["conv.weight"], [[[[0, 1]]], [[[2, 3]]]])
    np.testing.assert_array_equal(sub["conv.bias"], [10, 11])
    np.testing.assert_array_equal(sub["fc.weight"], [[0, 1, 2, 3], [8, 9, 10, 11],
                                                     [16, 17, 18, 19]])
    np.testing.assert_array_equal(sub["fc.bias"], [-1, -2, -3])
    assert sub["bn.num_batches_tracked"] == 7
    assert all(a.flags.c_contiguous for a in sub.values())


def test_quarter_width_keeps_one_channel():
    sub = sm.extract(toy_model(), sm.submodel_indices(SPEC, SHAPES, "static", 0.25))
    np.testing.assert_array_equal(sub["conv.weight"], [[[[0, 1]]]])
    np.testing.assert_array_equal(sub["conv.bias"], [10])
    np.testing.assert_array_equal(sub["fc.weight"], [[0, 1], [8, 9], [16, 17]])
    assert sub["fc.weight"].shape == (3, 2) and sub["fc.weight"].dtype == F32


def test_rolling_half_width_wraps_across_the_flatten():
    # round 3: channels [3, 0]; fc inputs [6, 7, 0, 1], in window order
    sub = sm.extract(toy_model(), sm.submodel_indices(SPEC, SHAPES, "rolling", 0.5, 3))
    np.testing.assert_array_equal(sub["conv.weight"], [[[[6, 7]]], [[[0, 1]]]])
    np.testing.assert_array_equal(sub["conv.bias"], [13, 10])
    np.testing.assert_array_equal(sub["fc.weight"], [[6, 7, 0, 1], [14, 15, 8, 9],
                                                     [22, 23, 16, 17]])


def test_flatten_of_16_channels_by_4x4_maps_channel_blocks_of_16_inputs():
    spec = WidthSpec({"conv2.weight": ("conv2", "conv1", None, None),
                      "fc1.weight": ("fc1", HiddenUnits("conv2", 16))})
    shapes = {"conv2.weight": (16, 6, 5, 5), "fc1.weight": (120, 256)}
    indices = sm.submodel_indices(spec, shapes, "static", 0.25)
    np.testing.assert_array_equal(indices["conv2.weight"][0], [0, 1, 2, 3])
    np.testing.assert_array_equal(indices["conv2.weight"][1], [0, 1])  # ceil(1.5)
    np.testing.assert_array_equal(indices["fc1.weight"][1], np.arange(64))
    assert indices["fc1.weight"][0].size == 30


@pytest.mark.parametrize("spec, shapes, words", [
    (WidthSpec({"missing": ("conv",)}), {"conv.bias": (4,)}, ["'missing'"]),
    (WidthSpec({"conv.bias": ("conv", None)}), {"conv.bias": (4,)}, ["2 axes", "(4,)"]),
    (WidthSpec({"fc.weight": (None, HiddenUnits("conv", 3))}), {"fc.weight": (3, 8)},
     ["8 entries", "repeat=3"]),
    (WidthSpec({"a": ("conv",), "b": ("conv",)}), {"a": (4,), "b": (6,)}, ["'conv'", "4", "6"]),
])
def test_submodel_indices_refuses_inconsistent_specs(spec, shapes, words):
    with pytest.raises(ValueError) as error:
        sm.submodel_indices(spec, shapes, "static", 0.5)
    for word in words:
        assert word in str(error.value)


def test_extract_refuses_mismatched_keys_and_bad_indices():
    indices = sm.submodel_indices(SPEC, SHAPES, "static", 0.5)
    params = toy_model()
    del params["fc.bias"]
    with pytest.raises(ValueError, match=r"missing \['fc.bias'\]"):
        sm.extract(params, indices)
    with pytest.raises(ValueError, match="'conv.bias' axis 0"):
        sm.extract(toy_model(), {**indices, "conv.bias": (np.array([0, 4]),)})
    with pytest.raises(ValueError, match="'conv.bias' axis 0"):
        sm.extract(toy_model(), {**indices, "conv.bias": (np.array([1, 1]),)})
    with pytest.raises(ValueError, match="indices of 'conv.bias' have 2 axes"):
        sm.extract(toy_model(), {**indices, "conv.bias": (slice(None), slice(None))})


# --- overlap_aggregate -----------------------------------------------------------------------

def global_model() -> dict[str, np.ndarray]:
    return {"conv.weight": np.full((4, 1, 1, 2), -1, F32),
            "conv.bias": np.array([10, 20, 30, 40], F32),
            "fc.weight": np.full((3, 8), -1, F32),
            "fc.bias": np.zeros(3, F32),
            "bn.num_batches_tracked": np.array(7, np.int64)}


def three_clients(weights):
    """Widths 3/4, 1/2, 1/4: channel 0 trained by 3 clients, 1 by 2, 2 by 1, 3 by none."""
    updates = []
    for ratio, bias, fill, fc_bias, count, weight in zip(
            (0.75, 0.5, 0.25), ([1, 2, 3], [5, 6], [9]), (1, 4, 7), (1, 2, 6),
            (100, 200, 300), weights):
        indices = sm.submodel_indices(SPEC, SHAPES, "static", ratio)
        width = len(bias)
        sub = {"conv.weight": np.full((width, 1, 1, 2), fill, F32),
               "conv.bias": np.array(bias, F32),
               "fc.weight": np.full((3, 2 * width), fill, F32),
               "fc.bias": np.full(3, fc_bias, F32),
               "bn.num_batches_tracked": np.array(count, np.int64)}
        updates.append((indices, sub, weight))
    return updates


def test_uniform_overlap_average_of_three_widths():
    out = sm.overlap_aggregate(global_model(), three_clients([None, None, None]))
    # channel 0: (1 + 5 + 9) / 3; 1: (2 + 6) / 2; 2: 3 alone; 3: nobody, global 40
    np.testing.assert_array_equal(out["conv.bias"], [5, 4, 3, 40])
    np.testing.assert_array_equal(out["conv.weight"],
                                  [[[[4, 4]]], [[[2.5, 2.5]]], [[[1, 1]]], [[[-1, -1]]]])
    np.testing.assert_array_equal(out["fc.weight"], [[4, 4, 2.5, 2.5, 1, 1, -1, -1]] * 3)
    np.testing.assert_array_equal(out["fc.bias"], [3, 3, 3])  # (1 + 2 + 6) / 3
    assert out["bn.num_batches_tracked"] == 7
    assert out["bn.num_batches_tracked"].dtype == np.int64
    assert all(out[k].dtype == F32 for k in ("conv.weight", "conv.bias", "fc.weight"))


def test_weighted_overlap_average_of_three_widths():
    out = sm.overlap_aggregate(global_model(), three_clients([1, 3, 4]))
    # channel 0: (1*1 + 3*5 + 4*9) / 8 = 6.5; 1: (1*2 + 3*6) / 4 = 5; 2: 3; 3: 40
    np.testing.assert_array_equal(out["conv.bias"], [6.5, 5, 3, 40])
    # channel 0: (1 + 12 + 28) / 8 = 5.125; channel 1: (1 + 12) / 4 = 3.25
    np.testing.assert_array_equal(out["fc.weight"],
                                  [[5.125, 5.125, 3.25, 3.25, 1, 1, -1, -1]] * 3)
    np.testing.assert_array_equal(out["fc.bias"], [3.875] * 3)  # (1 + 6 + 24) / 8


def test_rolling_windows_aggregate_and_unsent_keys_keep_the_global_value():
    # round 3: width 1/2 trains channels [3, 0], width 1/4 trains [3]; only the bias is sent
    updates = []
    for ratio, bias in ((0.5, [1, 2]), (0.25, [5])):
        indices = sm.submodel_indices(SPEC, SHAPES, "rolling", ratio, 3)
        updates.append(({"conv.bias": indices["conv.bias"]},
                        {"conv.bias": np.array(bias, F32)}, None))
    out = sm.overlap_aggregate(global_model(), updates)
    np.testing.assert_array_equal(out["conv.bias"], [2, 20, 30, 3])  # 3: (1 + 5) / 2
    np.testing.assert_array_equal(out["fc.weight"], np.full((3, 8), -1, F32))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_aggregation_keeps_each_global_dtype(dtype):
    indices = {"b": (np.array([0, 1]),)}
    out = sm.overlap_aggregate({"b": np.array([10, 20, 30, 40], dtype)},
                               [(indices, {"b": np.array([1, 2], np.float64)}, None),
                                (indices, {"b": np.array([2, 4], np.float32)}, 2.0)])
    assert out["b"].dtype == dtype
    np.testing.assert_array_equal(out["b"], np.array([5 / 3, 10 / 3, 30, 40]).astype(dtype))


def test_no_clients_returns_copies_of_the_global_model():
    model = global_model()
    out = sm.overlap_aggregate(model, [])
    np.testing.assert_array_equal(out["conv.bias"], [10, 20, 30, 40])
    out["conv.bias"][0] = 0
    assert model["conv.bias"][0] == 10


def test_aggregation_refuses_a_sub_array_whose_shape_disagrees_with_its_indices():
    indices, sub, _ = three_clients([None] * 3)[1]
    sub["conv.bias"] = np.array([5, 6, 7], F32)
    with pytest.raises(ValueError) as error:
        sm.overlap_aggregate(global_model(), [(indices, sub, None)])
    message = str(error.value)
    assert "'conv.bias'" in message and "(3,)" in message and "(2,)" in message


@pytest.mark.parametrize("weight", [0, -1.0, math.nan, math.inf, True, "3"])
def test_aggregation_refuses_bad_weights(weight):
    indices, sub, _ = three_clients([None] * 3)[0]
    with pytest.raises(ValueError, match=re.escape(f"client 0 weight={weight!r}")):
        sm.overlap_aggregate(global_model(), [(indices, sub, weight)])


def test_aggregation_refuses_unknown_or_mismatched_keys():
    indices, sub, _ = three_clients([None] * 3)[0]
    with pytest.raises(ValueError, match=r"client 0 sub-model: keys missing \['fc.bias'\]"):
        sm.overlap_aggregate(global_model(), [(indices, {k: v for k, v in sub.items()
                                                         if k != "fc.bias"}, None)])
    with pytest.raises(ValueError, match=r"client 0 sends \['extra'\]"):
        sm.overlap_aggregate(global_model(), [({**indices, "extra": ()},
                                               {**sub, "extra": np.array(1.0)}, None)])
    with pytest.raises(ValueError, match="'conv.bias' axis 0"):
        sm.overlap_aggregate(global_model(), [({"conv.bias": (np.array([4]),)},
                                               {"conv.bias": np.array([1.0])}, None)])

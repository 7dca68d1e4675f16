"""The checkpoint format (fedapp.checkpoint_format, fedapp.checkpoint): load(save(x)) is x in
bits and types for every registered strategy's real state after a few rounds, the RNG states
and generated values; what it cannot hold is refused before anything is written; a file it
did not write (changed bytes, another .npz, object arrays, unknown tags) is refused with
the file named, and nothing in it is ever run."""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest

from fedapp import checkpoint as ckpt
from fedapp import server_app
from fedapp.checkpoint_format import CheckpointFormatError, decode, dumps, encode, identical, loads
from fedapp.config import ConfigError
from fedapp.registry import STRATEGIES
from simulation.reliability import run_inprocess
from tests.reliability_common import config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# per strategy: what makes its state hold more than the defaults (momentum buffers, moments)
EXTRA = {"fednova": {"server-momentum": 0.5}, "fedavgm": {"server-momentum": 0.5},
         "fedadam": {"server-lr": 0.01}, "fedyogi": {"server-lr": 0.01},
         "fedadagrad": {"server-lr": 0.01}}
FEW_ROUNDS = {"num-server-rounds": 3, "fault-crash-prob": 0.2, "seed": 3}


def round_trip(value: object) -> object:
    """decode(encode(value)), through the JSON text and an .npz as the files hold them."""
    tree, arrays = encode(value)
    return decode(loads(dumps(tree)), {k: np.array(v, copy=True) for k, v in arrays.items()})


@pytest.fixture
def built(monkeypatch):
    """The strategies the ServerApp builds in this test (the registry's, called as is)."""
    strategies = []

    def keep(cfg, model=None):
        built = STRATEGIES[cfg.strategy](cfg, model)
        strategies.append(built.strategy)
        return built

    monkeypatch.setattr(server_app, "build_strategy", keep)
    return strategies


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.usefixtures("processes")
def test_every_strategys_state_after_a_few_rounds_comes_back_identical(name, built, tmp_path):
    rc = config(name, tmp_path / "out", **FEW_ROUNDS, **EXTRA.get(name, {}))
    _, run_dir = run_inprocess(rc, 3)
    state = built[-1].state_dict()
    assert identical(round_trip(state), state)
    payload = ckpt.make_payload(3, ckpt.arrays_of({"arrays": {"w": np.arange(4.0)}}), built[-1],
                                [{"round": 0, "accuracy": 0.5, "loss": float("nan")}], 2.5,
                                json.loads((run_dir / "config.json").read_text())["run-config"])
    (tmp_path / "ckpt").mkdir()
    saved = ckpt.save_checkpoint(tmp_path / "ckpt", payload)
    assert identical(ckpt.load_checkpoint(saved.parent), payload)
    # the copies of every client's state (one model each) are in the state, as arrays
    if name in ("scaffold", "feddyn", "moon"):
        copies = state["client-states"]["arrays"]
        assert copies and all(type(a) is np.ndarray for c in copies.values() for a in c.values())


def test_the_rng_states_come_back_and_draw_the_same_numbers():
    np.random.seed(5)
    random.seed(5)
    np.random.random(3)
    random.random()
    state = ckpt.rng_state()
    back = round_trip(state)
    assert identical(back, state) and ckpt.rng_problem(back) is None
    expected = (np.random.random(4).tolist(), [random.random() for _ in range(4)])
    ckpt.restore_rng(back)
    assert (np.random.random(4).tolist(), [random.random() for _ in range(4)]) == expected


def random_value(rng: np.random.Generator, depth: int = 0) -> object:
    """A value of the kinds a state_dict holds, nested up to 3 deep."""
    floats = [0.0, -0.0, 1.5, float("nan"), float("inf"), float("-inf"), 1e-310,
              struct.unpack(">d", bytes.fromhex("7ff8000000000123"))[0]]
    leaves = [
        lambda: None, lambda: bool(rng.integers(2)), lambda: int(rng.integers(-2**62, 2**62)),
        lambda: 2**80 + int(rng.integers(9)), lambda: floats[rng.integers(len(floats))],
        lambda: "k" + str(rng.integers(99)) + "é\x00", lambda: np.float32(rng.normal()),
        lambda: np.float64("nan"), lambda: np.int64(rng.integers(-9, 9)), lambda: np.bool_(1),
        lambda: np.uint8(7), lambda: np.float16(0.1),
        lambda: rng.normal(size=(2, 3)).astype(rng.choice(["<f4", ">f8", "<f2"])),
        lambda: np.asfortranarray(rng.integers(0, 9, size=(3, 2))), lambda: np.zeros((0, 4)),
        lambda: np.array(3.0), lambda: np.array(["ab", "c"]), lambda: np.arange(5)[::2],
    ]
    if depth >= 3 or rng.random() < 0.4:
        return leaves[rng.integers(len(leaves))]()
    size = int(rng.integers(0, 4))
    kind = rng.integers(3)
    if kind == 0:
        return [random_value(rng, depth + 1) for _ in range(size)]
    if kind == 1:
        return tuple(random_value(rng, depth + 1) for _ in range(size))
    keys = [int(rng.integers(9)), str(rng.integers(9)), (1, "a"), None, True, -0.5]
    return {keys[rng.integers(len(keys))]: random_value(rng, depth + 1) for _ in range(size)}


def test_generated_values_come_back_identical():
    rng = np.random.default_rng(46)
    for _ in range(300):
        value = random_value(rng)
        assert identical(round_trip(value), value), value


def test_identical_tells_types_and_bits_apart():
    assert not identical({3: 1}, {"3": 1}) and not identical((1,), [1])
    assert not identical(0.0, -0.0) and identical(float("nan"), float("nan"))
    assert not identical(np.float32(1), np.float64(1)) and not identical(1, True)
    assert not identical(np.zeros(2, "<f4"), np.zeros(2, ">f4"))


@pytest.mark.parametrize("value, where", [
    ({"a": {1, 2}}, r"payload\['a'\] is a builtins.set"),
    ([np.array([None, 1], dtype=object)], r"payload\[0\] has dtype object"),
    ({"f": lambda: 0}, r"payload\['f'\] is a builtins.function"),
    ({"x": np.float64}, "builtins.type"),
])
def test_what_the_format_cannot_hold_is_refused_naming_where(value, where):
    with pytest.raises(CheckpointFormatError, match=where):
        encode(value)


@pytest.mark.parametrize("tree, says", [
    ({"pickle": "gASV"}, "is not a value of the checkpoint format"),
    ({"tuple": [1], "dict": []}, "is not a value of the checkpoint format"),
    ({"ndarray": "a9"}, "array 'a9' is not in the .npz"),
    ({"numpy": ["|O", "00" * 8]}, "not a numpy scalar"),
    ({"numpy": ["<f8", "00"]}, "not a numpy scalar"),
    ({"numpy": ["(2,)<f4", "00" * 8]}, "not a numpy scalar"),
    ({"float": "zz"}, "16 hex digits"),
    ({"dict": [[[1], 2]]}, "unhashable"),
    ({"dict": [["a", 1], ["a", 2]]}, "twice"),
    (float("nan"), "bare non-finite"),
])
def test_a_tree_the_format_did_not_write_is_refused(tree, says):
    with pytest.raises(CheckpointFormatError, match=says):
        decode(tree, {})


def test_bare_nan_constants_in_the_json_are_refused():
    with pytest.raises(CheckpointFormatError, match="bare NaN"):
        loads('{"float": NaN}')


# ----------------------------------------------------------------- files a checkpoint is
def saved_checkpoint(tmp_path):
    payload = ckpt.make_payload(
        2, ckpt.arrays_of({"arrays": {"w": np.arange(6, dtype=np.float32)}}),
        STRATEGIES["fedavg"](_cfg())[0], [{"round": 0}], 1.0, _cfg().to_dict())
    return ckpt.save_checkpoint(tmp_path, payload), payload


def _cfg():
    from fedapp.config import RunConfig  # noqa: PLC0415

    return RunConfig.from_user_config({"strategy": "fedavg", "num-server-rounds": 3})


def test_the_files_are_json_and_an_npz_and_load_back_identical(tmp_path):
    path, payload = saved_checkpoint(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    manifest = json.loads(path.read_text())
    assert names == sorted([ckpt.CHECKPOINT_NAME, manifest["arrays-file"]])
    assert manifest["format"] == "fedhetero-checkpoint" and manifest["format-version"] == 2
    assert manifest["config-digest"] == ckpt.config_digest(_cfg().to_dict())
    assert identical(ckpt.load_checkpoint(tmp_path), payload)


def test_a_changed_npz_is_refused_by_its_sha256(tmp_path):
    path, _ = saved_checkpoint(tmp_path)
    npz = tmp_path / json.loads(path.read_text())["arrays-file"]
    data = bytearray(npz.read_bytes())
    data[-30] ^= 1
    npz.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=rf"{path}.*SHA-256 of {npz.name} does not match"):
        ckpt.load_checkpoint(tmp_path)


def test_an_npz_with_object_arrays_is_refused_without_unpickling(tmp_path):
    """A planted .npz whose SHA-256 the JSON records (anyone can compute it): np.load with
    allow_pickle=False refuses its object array; the pickle inside never runs."""
    class Planted:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    path, _ = saved_checkpoint(tmp_path)
    manifest = json.loads(path.read_text())
    npz = tmp_path / manifest["arrays-file"]
    np.savez(npz, a0=np.array([Planted()], dtype=object), allow_pickle=True)
    manifest["arrays-sha256"] = ckpt.file_sha256(npz)
    path.write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="cannot be read.*allow_pickle=False"):
        ckpt.load_checkpoint(tmp_path)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("name", ["../checkpoint-round2-00000000.npz", "/etc/passwd",
                                  "other.npz"])
def test_an_arrays_file_outside_the_run_directory_is_refused(tmp_path, name):
    path, _ = saved_checkpoint(tmp_path)
    manifest = json.loads(path.read_text())
    manifest["arrays-file"] = name
    path.write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="is not a checkpoint .npz name"):
        ckpt.load_checkpoint(tmp_path)


def test_a_changed_state_is_refused_by_its_sha256(tmp_path):
    path, _ = saved_checkpoint(tmp_path)
    path.write_text(path.read_text().replace('["round",0]', '["round",1]'))
    with pytest.raises(ConfigError, match="SHA-256 of its state does not match"):
        ckpt.load_checkpoint(tmp_path)


def test_a_state_that_is_not_a_payload_is_refused(tmp_path):
    """Hashes made to match (they detect damage, not a forger): the decoded payload is still
    checked before the ServerApp uses any of it."""
    path, _ = saved_checkpoint(tmp_path)
    manifest = json.loads(path.read_text())
    tree, _ = encode({"format": 2})
    manifest["state"], manifest["state-sha256"] = tree, ckpt.text_sha256(dumps(tree))
    path.write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="its payload has keys"):
        ckpt.load_checkpoint(tmp_path)


def test_a_newer_or_older_format_version_is_refused(tmp_path):
    path, _ = saved_checkpoint(tmp_path)
    path.write_text(path.read_text().replace('"format-version":2', '"format-version":3'))
    with pytest.raises(ConfigError, match="format-version 3, this fedhetero reads 2"):
        ckpt.load_checkpoint(tmp_path)

"""Checkpoints planted by an attacker who recomputes the hashes (issue #57, item 4): deep
JSON, an .npy header that claims terabytes, a zip bomb, a model the run does not have.
Each is refused with a ConfigError naming the file and what it claims; none raises
RecursionError or MemoryError, and none inflates anything."""

from __future__ import annotations

import json
import resource
import struct
import zipfile

import numpy as np
import pytest

from fedapp import checkpoint as ckpt
from fedapp.config import ConfigError, RunConfig
from fedapp.npz_file import NpzFormatError, read_npz
from fedapp.registry import STRATEGIES
from simulation.reliability import SimulatedKill, run_inprocess
from tests.reliability_common import config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def saved_checkpoint(directory):
    cfg = RunConfig.from_user_config({"strategy": "fedavg", "num-server-rounds": 3})
    payload = ckpt.make_payload(2, ckpt.arrays_of({"arrays": {"w": np.arange(6, dtype=np.float32)}}),
                                STRATEGIES["fedavg"](cfg)[0], [{"round": 0}], 1.0, cfg.to_dict())
    return ckpt.save_checkpoint(directory, payload)


def replace_npz(path, write_members) -> None:
    """Write new .npz bytes in place of the checkpoint's and record their SHA-256 (what an
    attacker with write access to the run directory does)."""
    manifest = json.loads(path.read_text())
    npz = path.parent / manifest["arrays-file"]
    with zipfile.ZipFile(npz, "w") as archive:
        write_members(archive)
    manifest["arrays-sha256"] = ckpt.file_sha256(npz)
    path.write_text(json.dumps(manifest))


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    """A version 1.0 .npy header (magic, length, dict, padding to 64 bytes)."""
    text = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode("latin1")
    text += b" " * (63 - (10 + len(text)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text


def test_json_nested_200000_deep_is_refused_without_recursion_error(tmp_path):
    path = saved_checkpoint(tmp_path)
    manifest = json.loads(path.read_text())
    deep = "[" * 200_000 + "]" * 200_000
    text = json.dumps({**manifest, "state": "@"}).replace('"@"', deep)
    path.write_text(text)
    with pytest.raises(ConfigError, match="nested deeper than any checkpoint"):
        ckpt.load_checkpoint(tmp_path)


def test_an_npy_header_claiming_4_tib_is_refused_before_any_allocation(tmp_path):
    path = saved_checkpoint(tmp_path)
    replace_npz(path, lambda z: z.writestr("a0.npy", npy_header((1 << 40,)) + b"\0" * 64))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ConfigError, match=r"a0.npy.*claims shape \(1099511627776,\).*4398046511104"
                                          r" bytes.*holds 64 bytes"):
        ckpt.load_checkpoint(tmp_path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB


def test_a_zip_bomb_member_is_refused_without_inflating(tmp_path):
    path = saved_checkpoint(tmp_path)
    bomb = npy_header((128 << 20,)) + bytes(512 << 20)  # 512 MiB of zeros

    def write(archive):
        archive.writestr(zipfile.ZipInfo("a0.npy"), bomb, compress_type=zipfile.ZIP_DEFLATED)
    replace_npz(path, write)
    del bomb
    npz = next(tmp_path.glob("*.npz"))
    assert npz.stat().st_size < 1 << 20  # 0.5 MB on disk
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ConfigError, match="a0.npy' is compressed.*np.savez stores arrays"):
        ckpt.load_checkpoint(tmp_path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024


def test_read_npz_gives_back_what_np_savez_wrote(tmp_path):
    arrays = {"a0": np.arange(12, dtype=np.float64).reshape(3, 4),
              "a1": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
              "a2": np.array(3.5, dtype=np.float32), "a3": np.zeros((0, 5), np.uint8),
              "a4": np.array(["ab", "c"]), "a5": np.array([True, False])}
    np.savez(tmp_path / "x.npz", **arrays)
    back = read_npz(tmp_path / "x.npz")
    assert list(back) == list(arrays)
    for key, array in arrays.items():
        assert back[key].dtype == array.dtype and back[key].shape == array.shape
        assert np.array_equal(back[key], array) and back[key].flags.writeable


@pytest.mark.parametrize("name, data, says", [
    ("a0.txt", b"x", "is not one .npy"),
    ("a0.npy", npy_header((2,), "|O") + b"\0" * 16, "holds Python objects"),
    ("a0.npy", npy_header((4,)) + b"\0" * 15, "claims shape"),
    ("a0.npy", b"\x93NUMPY\x09\x00" + b"\0" * 60, "version|unsupported"),
])
def test_members_np_savez_did_not_write_are_refused(tmp_path, name, data, says):
    with zipfile.ZipFile(tmp_path / "x.npz", "w") as archive:
        archive.writestr(name, data)
    with pytest.raises((NpzFormatError, ValueError), match=says):
        read_npz(tmp_path / "x.npz")


def test_model_problem_names_planted_keys_and_shapes():
    model = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}

    def payload(arrays):
        return {"arrays": arrays}
    assert ckpt.model_problem(payload(dict(model)), model) is None
    planted = ckpt.model_problem(payload({**model, "evil": np.zeros(1)}), model)
    assert "keys the model does not have: ['evil']" in planted
    assert "another order" in ckpt.model_problem(payload({"b": model["b"], "w": model["w"]}), model)
    assert "'w' is int64[2, 3], the run's model has float32[2, 3]" in ckpt.model_problem(
        payload({**model, "w": np.zeros((2, 3), np.int64)}), model)
    assert "'w' is float32[3, 2]" in ckpt.model_problem(
        payload({**model, "w": np.zeros((3, 2), np.float32)}), model)
    assert ckpt.model_problem(payload({**model, "w": np.zeros((2, 3))}), model) is None  # f64


@pytest.mark.usefixtures("processes")
def test_a_planted_model_with_recomputed_hashes_is_not_resumed(tmp_path):
    """A killed run's checkpoint, its model given an extra key 'evil' and every hash
    recomputed: the resumed run stops before training and says which key, and the fix."""
    rc = config("fedavg", tmp_path / "killed", **{"num-server-rounds": 3, "checkpoint-every": 1})
    with pytest.raises(SimulatedKill):
        run_inprocess(rc, 2, kill_after_round=1)
    killed = next((tmp_path / "killed").iterdir())
    payload = ckpt.load_checkpoint(killed)
    payload["arrays"]["evil"] = np.ones(3, np.float32)
    ckpt.save_checkpoint(killed, payload)  # a consistent file: the hashes match
    assert "evil" in ckpt.load_checkpoint(killed)["arrays"]
    resumed = config("fedavg", tmp_path / "resumed",
                     **{"num-server-rounds": 3, "checkpoint-every": 1, "resume-from": str(killed)})
    with pytest.raises(RuntimeError, match=r"stopped before training.*keys the model does not "
                                           r"have: \['evil'\].*resume-from=''"):
        run_inprocess(resumed, 2)


"""The disk filling up while a checkpoint is written, on a real small filesystem: a tmpfs the
test mounts (skipped, saying why, where mounting is not permitted) and unmounts.

The write fails with an error naming the file and the cause, leaves no temporary file and
no stray .npz, and the last good checkpoint still loads; a run whose disk fills during a
checkpoint stops with that error, and resuming from its last good checkpoint gives the
uninterrupted run's final model and run log bit for bit.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from fedapp.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointWriteError,
    load_checkpoint,
    make_payload,
    save_checkpoint,
)
from fedapp.checkpoint_format import identical
from fedapp.config import RunConfig
from fedapp.registry import build_strategy
from fedapp.run_log import read_rounds
from simulation.reliability import run_inprocess
from strategies import contract as C
from tests.messages import record
from tests.reliability_common import config, resend_aside, run, same_model, without_timings

pytestmark = pytest.mark.usefixtures("one_torch_thread", "processes")
LEFT_FREE = 64 * 1024  # room for a run-log line, not for a checkpoint of the test's model


@contextmanager
def small_disk(where: Path, size: str):
    """A tmpfs of ``size`` mounted on ``where`` (made here), unmounted afterwards."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                              str(where)], capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to fill it (needs root and mount rights): "
                    f"{mounted.stderr.strip() or mounted.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, timeout=30, check=False)
        if os.path.ismount(where):  # something still holds it open: detach it lazily
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30,
                           check=False)


def fill(disk: Path, leave: int) -> Path:
    """A ballast file that leaves about ``leave`` bytes free on ``disk``."""
    stat = os.statvfs(disk)
    ballast = disk / "ballast"
    with ballast.open("ab") as handle:
        handle.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave))
    return ballast


def leftovers(directory: Path) -> list[str]:
    """Temporary files and .npz files that no checkpoint.json names."""
    names = sorted(p.name for p in directory.iterdir())
    named = json.loads((directory / CHECKPOINT_NAME).read_text())["arrays-file"]
    return [n for n in names if n.endswith(".tmp") or (n.endswith(".npz") and n != named)]


def test_checkpoints_written_until_the_disk_is_full_keep_the_last_good_one(tmp_path):
    cfg = RunConfig.from_user_config({"strategy": "fedavg", "num-server-rounds": 100})
    strategy, _ = build_strategy(cfg)
    with small_disk(tmp_path / "disk", "2m") as disk:
        good = None
        for server_round in range(1, 40):  # ~256 KB more each round: full well before 40
            arrays = record({"w": np.full(server_round * 64 * 1024, server_round, np.float32)})
            payload = make_payload(server_round, arrays, strategy, [{"round": server_round}],
                                   float(server_round), cfg.to_dict())
            try:
                save_checkpoint(disk, payload)
            except CheckpointWriteError as exc:
                failed = exc
                break
            good = payload
        else:
            pytest.fail("2 MB never filled up")
        assert good is not None and failed.errno == errno.ENOSPC
        message = str(failed)
        assert "No space left on device" in message and str(disk) in message
        assert f"checkpoint of round {good['round'] + 1} could not be written" in message
        assert "the previous checkpoint" in message and "resume-from=" in message
        assert leftovers(disk) == []
        assert identical(load_checkpoint(disk), good)


def test_a_run_whose_disk_fills_stops_and_its_last_checkpoint_resumes_bit_exactly(tmp_path):
    common = {"num-server-rounds": 4, "checkpoint-every": 1, "eval-overlap": False,
              "fault-crash-prob": 0.2, "seed": 2}
    _, _, full_rounds, full_model = run("scaffold", tmp_path / "full", 3, **common)

    def fill_in_round_3(msg, reply, context):
        del context
        config_record = msg.content[C.CONFIG] if C.CONFIG in msg.content else {}
        if msg.metadata.message_type == "train" and config_record.get(C.SERVER_ROUND) == 3 \
                and not (disk / "ballast").exists():
            fill(disk, LEFT_FREE)
        return reply

    with small_disk(tmp_path / "disk", "8m") as disk:
        rc = config("scaffold", disk / "runs", **common)
        with pytest.raises(CheckpointWriteError, match="No space left on device") as info:
            run_inprocess(rc, 3, reply_hook=fill_in_round_3)
        assert "checkpoint of round 3 could not be written" in str(info.value)
        (stopped,) = list((disk / "runs").iterdir())
        assert [r["round"] for r in read_rounds(stopped)] == [0, 1, 2, 3]
        assert leftovers(stopped) == [] and not (stopped / "final_model.pt").exists()
        assert load_checkpoint(stopped)["round"] == 2
        (disk / "ballast").unlink()  # what a user does: free space, then resume
        _, _, resumed_rounds, resumed_model = run(
            "scaffold", tmp_path / "resumed", 3, **common, **{"resume-from": str(stopped)})
    full, resumed = without_timings(full_rounds), without_timings(resumed_rounds)
    resend_aside(full, resumed, 3)  # the first resumed round resends the copies of c_i
    assert resumed == full
    assert same_model(resumed_model, full_model)

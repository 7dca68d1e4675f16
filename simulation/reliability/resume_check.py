"""``python -m simulation resume-check``: kill a run (SIGKILL) after round r, resume it from
its checkpoint, and compare with an uninterrupted run bit for bit.

In-process runs on :class:`simulation.reliability.FaultGrid`; the killed run is a child
process (``python -m simulation.reliability.resume_check CONFIG.json``) that holds at the
first train message after round r until the parent kills it, by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from fedapp.checkpoint import load_checkpoint
from fedapp.model_file import read_model
from fedapp.run_log import read_rounds
from strategies import contract as C

from ..runtime import PROJECT_ROOT
from .common import add_arguments as add_common_arguments
from .common import out_file, quiet_flower, run_config
from .grid import SimulatedKill, run_inprocess

OUT_NAME = "resume_check.json"
CHILD = "simulation.reliability.resume_check"  # python -m CHILD CONFIG.json: the killed run
KILL_AFTER = 3  # the round after which the run is killed
CHECKPOINT_EVERY = 2  # so the resume starts from round 2's checkpoint, one round back


def hold_after_round(config_path: Path) -> int:
    """The killed child: run the config in-process, stop at the first train message after
    round ``hold-after`` and wait there for the SIGKILL, so the kill always lands right
    after that round however fast the rounds are."""
    payload = json.loads(Path(config_path).read_text())
    try:
        run_inprocess(
            payload["run-config"], payload["nodes"], kill_after_round=payload["hold-after"]
        )
    except SimulatedKill:
        time.sleep(3600)
    return 0


def wait_for_round(out: Path, round_: int, proc: subprocess.Popen, timeout: float = 600) -> Path:
    """The run directory under ``out`` once its run log has round ``round_``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dirs = list(out.iterdir()) if out.is_dir() else []
        if dirs and (dirs[0] / "rounds.jsonl").is_file():
            with warnings.catch_warnings():  # a line half written as we read: read it next time
                warnings.simplefilter("ignore", RuntimeWarning)
                rounds = read_rounds(dirs[0])
            if rounds and rounds[-1][C.LOG_ROUND] >= round_:
                return dirs[0]
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (rc {proc.returncode}) before round {round_}")
        time.sleep(0.05)
    raise TimeoutError(f"round {round_} not reached in {timeout} s")


def without_timings(records: list[dict], resent_round: int | None = None) -> list[dict]:
    """Round records without their wall-clock keys (and, in round ``resent_round``, the first
    after a resume, without the keys that count client state sent again)."""
    return [{k: v for k, v in r.items() if k not in C.LOG_TIMING_KEYS
             and not (r.get(C.LOG_ROUND) == resent_round and k in C.LOG_RESEND_KEYS)}
            for r in records]


def resume_check(
    strategy: str, rounds: int, kill_after: int, every: int, nodes: int, seed: int, workdir: Path
) -> dict:
    """Uninterrupted run vs. a run SIGKILLed once round ``kill_after`` is logged, resumed."""
    extra = {"checkpoint-every": every, "fault-crash-prob": 0.2, "fault-late-prob": 0.1}
    _, full_dir = run_inprocess(run_config(strategy, workdir / "full", seed, rounds, extra), nodes)
    killed_out = workdir / "killed"
    cfg_path = workdir / "killed.json"
    killed_rc = run_config(strategy, killed_out, seed, rounds, extra)
    cfg_path.write_text(
        json.dumps({"run-config": killed_rc, "nodes": nodes, "hold-after": kill_after})
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", CHILD, str(cfg_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=PROJECT_ROOT,
    )
    killed_dir = wait_for_round(killed_out, kill_after, proc)
    os.kill(proc.pid, signal.SIGKILL)  # our own child, by PID
    proc.wait()
    logged = read_rounds(killed_dir)[-1][C.LOG_ROUND]
    ckpt_round = load_checkpoint(killed_dir)["round"]
    resumed_rc = run_config(
        strategy, workdir / "resumed", seed, rounds, {**extra, "resume-from": str(killed_dir)}
    )
    _, resumed_dir = run_inprocess(resumed_rc, nodes)
    a, b = read_model(full_dir / "final_model.pt"), read_model(resumed_dir / "final_model.pt")
    first = ckpt_round + 1
    resent = read_rounds(resumed_dir)[first].get(C.LOG_CLIENT_STATE_ATTACHED, 0) - read_rounds(
        full_dir)[first].get(C.LOG_CLIENT_STATE_ATTACHED, 0)
    return {
        "strategy": strategy,
        "killed-after-round": logged,
        "checkpoint-round": ckpt_round,
        "final-model-bit-identical": list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a),
        "max-abs-diff": max(float((a[k].double() - b[k].double()).abs().max()) for k in a),
        "run-log-identical-timings-aside": without_timings(read_rounds(full_dir), first)
        == without_timings(read_rounds(resumed_dir), first),
        "client-state-copies-resent": resent,
        "final-accuracy": read_rounds(resumed_dir)[-1][C.LOG_ACCURACY],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The resume-check options."""
    add_common_arguments(parser, OUT_NAME)


def run(args: argparse.Namespace) -> int:
    """One check per strategy (killed after round 3, checkpoint every 2); 0 if all pass."""
    if args.rounds <= KILL_AFTER:
        raise SystemExit(f"resume-check: --rounds {args.rounds}: the check kills each run after "
                         f"round {KILL_AFTER} and resumes it, so give --rounds >= {KILL_AFTER + 1}")
    quiet_flower()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in args.strategies:
            res = resume_check(
                strategy,
                args.rounds,
                kill_after=KILL_AFTER,
                every=CHECKPOINT_EVERY,
                nodes=args.nodes,
                seed=args.seed,
                workdir=Path(tmp) / strategy,
            )
            print(json.dumps(res), flush=True)
            results.append(res)
    ok = all(
        r["final-model-bit-identical"] and r["run-log-identical-timings-aside"] for r in results
    )
    print("RESUME CHECK:", "PASS" if ok else "FAIL")
    out = out_file(args, OUT_NAME)
    if out:
        out.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(hold_after_round(Path(sys.argv[1])))

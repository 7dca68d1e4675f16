"""``python -m simulation faults-table``: each fault class x each strategy -> run completed?,
rounds done, failures, final accuracy vs the fault-free run. ``python -m simulation
resume-check``: kill a run (SIGKILL) after round r, resume it, compare with an
uninterrupted run bit for bit.

Both use the in-process Grid of :mod:`simulation.inprocess` (the real ServerApp and
ClientApp, one process, virtual time for late replies): real ``flwr run`` launches for
every combination are too slow on a small machine; tests/test_reliability_flwr.py runs
the fault path once on the real simulation engine.
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
from pathlib import Path

import torch

from fedapp.registry import STRATEGIES
from fedapp.run_log import TIMING_KEYS, read_rounds

from .inprocess import CORRUPTIONS, SimulatedKill, run_inprocess

BASE = {
    "dataset": "synthetic", "model": "mlp-2nn", "partition": "iid", "local-steps": 5, "batch-size": 10,
    "lr": 0.05, "eval-batch-size": 2000, "fedveca-tau-init": 2, "fedveca-tau-max": 5,
    "dynamicfl-local-steps": 4, "round-timeout": 0.3, "drift-diagnostics": False,
}
FAULTS = {
    "none": {},
    "crash 30%": {"fault-crash-prob": 0.3},
    "late 30%": {"fault-late-prob": 0.3},
    "crash 20% + late 20%": {"fault-crash-prob": 0.2, "fault-late-prob": 0.2},
    "malformed (1 client/round)": {},
    "crash 100%": {"fault-crash-prob": 1.0},
}


def _config(strategy: str, out: Path, seed: int, rounds: int, extra: dict) -> dict:
    rc = {**BASE, "strategy": strategy, "seed": seed, "num-server-rounds": rounds, "output-dir": str(out), **extra}
    if strategy == "dynamicfl":
        rc["dynamicfl-intervals"] = "1-4"
    return rc


def malformed_hook(num_nodes: int):
    """Round t: partition (t mod N) sends the (t mod K)-th kind of malformed reply."""
    kinds = sorted(CORRUPTIONS)
    seen = set()

    def hook(msg, reply, context):
        if msg.metadata.message_type != "train" or reply.has_error():
            return reply
        t = int(msg.content["config"]["server-round"])
        if context.node_config["partition-id"] != t % num_nodes or t in seen:
            return reply
        seen.add(t)
        return CORRUPTIONS[kinds[t % len(kinds)]](reply, msg)

    return hook


def faults_table(strategies: list[str], rounds: int, nodes: int, seed: int, workdir: Path) -> list[dict]:
    rows = []
    for strategy in strategies:
        baseline = None
        for fault, extra in FAULTS.items():
            out = workdir / strategy / fault.replace(" ", "_").replace("%", "").replace("+", "").replace("/", "-")
            grid_kwargs = {"reply_hook": malformed_hook(nodes)} if fault.startswith("malformed") else {}
            row = {"strategy": strategy, "fault": fault, "completed": False, "rounds": 0}
            try:
                _, run_dir = run_inprocess(_config(strategy, out, seed, rounds, extra), nodes, **grid_kwargs)
                records = read_rounds(run_dir)
                row.update(completed=(run_dir / "final_model.pt").is_file(), rounds=records[-1]["round"],
                           failed=sum(r.get("clients-failed", 0) for r in records[1:]),
                           kept=sum(bool(r.get("model-kept")) for r in records[1:]),
                           accuracy=records[-1]["accuracy"])
            except Exception as exc:  # noqa: BLE001 - a row says what broke
                row["error"] = f"{type(exc).__name__}: {exc}"[:120]
            if fault == "none":
                baseline = row.get("accuracy")
            row["baseline"] = baseline
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


HEADER = ("| strategy | fault class | completed | rounds done | client failures | rounds model kept | "
          "final acc | fault-free acc | diff |\n|---|---|---|---|---|---|---|---|---|")


def format_row(row: dict) -> str:
    acc, base = row.get("accuracy"), row.get("baseline")
    diff = f"{acc - base:+.4f}" if acc is not None and base is not None else "-"
    cells = [row["strategy"], row["fault"], "yes" if row["completed"] else f"NO ({row.get('error', '')})",
             str(row["rounds"]), str(row.get("failed", "-")), str(row.get("kept", "-")),
             f"{acc:.4f}" if acc is not None else "-", f"{base:.4f}" if base is not None else "-", diff]
    return "| " + " | ".join(cells) + " |"


# ----------------------------------------------------------------- resume check
def _child(config_path: str) -> int:
    """Run one config in-process (the process the parent kills). It stops at the first train
    message after round ``_hold_after`` and waits there for the SIGKILL, so the kill always
    lands right after that round, however fast the rounds are."""
    rc = json.loads(Path(config_path).read_text())
    nodes, hold_after = rc.pop("_nodes"), rc.pop("_hold_after")
    try:
        run_inprocess(rc, nodes, kill_after_round=hold_after)
    except SimulatedKill:
        time.sleep(3600)
    return 0


def _wait_for_round(out: Path, round_: int, proc: subprocess.Popen, timeout: float = 600) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dirs = list(out.iterdir()) if out.is_dir() else []
        if dirs and (dirs[0] / "rounds.jsonl").is_file():
            rounds = [json.loads(x) for x in (dirs[0] / "rounds.jsonl").read_text().splitlines() if x.strip()]
            if rounds and rounds[-1]["round"] >= round_:
                return dirs[0]
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (rc {proc.returncode}) before round {round_}")
        time.sleep(0.05)
    raise TimeoutError(f"round {round_} not reached in {timeout} s")


def resume_check(strategy: str, rounds: int, kill_after: int, every: int, nodes: int, seed: int, workdir: Path) -> dict:
    """Uninterrupted run vs. a run SIGKILLed once round ``kill_after`` is logged, then resumed."""
    extra = {"checkpoint-every": every, "fault-crash-prob": 0.2, "fault-late-prob": 0.1}
    _, full_dir = run_inprocess(_config(strategy, workdir / "full", seed, rounds, extra), nodes)
    killed_out = workdir / "killed"
    cfg_path = workdir / "killed.json"
    cfg_path.write_text(json.dumps({**_config(strategy, killed_out, seed, rounds, extra), "_nodes": nodes,
                                    "_hold_after": kill_after}))
    proc = subprocess.Popen([sys.executable, "-m", "simulation.faults_table", "_child", str(cfg_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=Path(__file__).parent.parent)
    killed_dir = _wait_for_round(killed_out, kill_after, proc)
    os.kill(proc.pid, signal.SIGKILL)  # our own child, by PID
    proc.wait()
    logged = read_rounds(killed_dir)[-1]["round"]
    from fedapp.checkpoint import load_checkpoint  # noqa: PLC0415
    ckpt_round = load_checkpoint(killed_dir)["round"]
    _, resumed_dir = run_inprocess(_config(strategy, workdir / "resumed", seed, rounds,
                                           {**extra, "resume-from": str(killed_dir)}), nodes)
    a, b = torch.load(full_dir / "final_model.pt"), torch.load(resumed_dir / "final_model.pt")
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rs]  # noqa: E731
    return {
        "strategy": strategy, "killed-after-round": logged, "checkpoint-round": ckpt_round,
        "final-model-bit-identical": list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a),
        "max-abs-diff": max(float((a[k].double() - b[k].double()).abs().max()) for k in a),
        "run-log-identical-timings-aside": strip(read_rounds(full_dir)) == strip(read_rounds(resumed_dir)),
        "final-accuracy": read_rounds(resumed_dir)[-1]["accuracy"],
    }


def main(argv: list[str] | None = None, command: str = "faults-table") -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        return _child(argv[1])
    parser = argparse.ArgumentParser(prog=f"python -m simulation {command}")
    parser.add_argument("--strategies", default=",".join(sorted(STRATEGIES)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the table (markdown) / results (JSON) to this file, or into this folder "
                             "as faults_table.md / resume_check.json")
    args = parser.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        parser.error(f"--strategies: unknown {', '.join(unknown)}; choose from {','.join(sorted(STRATEGIES))}")
    if args.out is not None and args.out.is_dir():
        args.out = args.out / ("resume_check.json" if command == "resume-check" else "faults_table.md")
    import logging  # noqa: PLC0415
    logging.getLogger("flwr").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        if command == "resume-check":
            results = []
            for s in strategies:
                res = resume_check(s, args.rounds, kill_after=3, every=2, nodes=args.nodes, seed=args.seed,
                                   workdir=Path(tmp) / s)
                print(json.dumps(res), flush=True)
                results.append(res)
            ok = all(r["final-model-bit-identical"] and r["run-log-identical-timings-aside"] for r in results)
            print("RESUME CHECK:", "PASS" if ok else "FAIL")
            if args.out:
                args.out.write_text(json.dumps(results, indent=1) + "\n")
            return 0 if ok else 1
        print(HEADER, flush=True)
        rows = faults_table(strategies, args.rounds, args.nodes, args.seed, Path(tmp))
    if args.out:
        args.out.write_text(HEADER + "\n" + "\n".join(format_row(r) for r in rows) + "\n")
    return 0 if all(r["completed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""``python -m simulation faults-table``: each fault class x each strategy -> run completed?,
rounds done, client failures, final accuracy vs the fault-free run.

In-process (the real ServerApp and ClientApp on :class:`simulation.reliability.FaultGrid`,
virtual time for late replies): real ``flwr run`` launches for every combination are
too slow on a small machine; tests/test_reliability_flwr.py runs the fault path once on
the real simulation engine.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from fedapp.run_log import read_rounds
from strategies import contract as C

from .common import add_arguments as add_common_arguments
from .common import out_file, quiet_flower, run_config
from .corruptions import malformed_hook
from .grid import run_inprocess

FAULTS = {
    "none": {},
    "crash 30%": {"fault-crash-prob": 0.3},
    "late 30%": {"fault-late-prob": 0.3},
    "crash 20% + late 20%": {"fault-crash-prob": 0.2, "fault-late-prob": 0.2},
    "malformed (1 client/round)": {},
    "crash 100%": {"fault-crash-prob": 1.0},
}
HEADER = ("| strategy | fault class | completed | rounds done | client failures | "
          "rounds model kept | final acc | fault-free acc | diff |\n"
          "|---|---|---|---|---|---|---|---|---|")
OUT_NAME = "faults_table.md"


def folder_name(fault: str) -> str:
    """'crash 20% + late 20%' -> 'crash_20__late_20'."""
    for old, new in ((" ", "_"), ("%", ""), ("+", ""), ("/", "-")):
        fault = fault.replace(old, new)
    return fault


def faults_table(strategies: list[str], rounds: int, nodes: int, seed: int,
                 workdir: Path) -> list[dict]:
    """One row per (strategy, fault class); printed as it is done."""
    rows = []
    for strategy in strategies:
        baseline = None
        for fault, extra in FAULTS.items():
            out = workdir / strategy / folder_name(fault)
            hooks = ({"reply_hook": malformed_hook(nodes, strategy)}
                     if fault.startswith("malformed") else {})
            row = {"strategy": strategy, "fault": fault, "completed": False, "rounds": 0}
            try:
                rc = run_config(strategy, out, seed, rounds, extra)
                _, run_dir = run_inprocess(rc, nodes, **hooks)
                records = read_rounds(run_dir)
                row.update(completed=(run_dir / "final_model.pt").is_file(),
                           rounds=records[-1][C.LOG_ROUND],
                           failed=sum(r.get(C.LOG_CLIENTS_FAILED, 0) for r in records[1:]),
                           kept=sum(bool(r.get(C.LOG_MODEL_KEPT)) for r in records[1:]),
                           accuracy=records[-1][C.LOG_ACCURACY])
            except Exception as exc:  # noqa: BLE001 - a row says what broke
                row["error"] = f"{type(exc).__name__}: {exc}"[:120]
            if fault == "none":
                baseline = row.get("accuracy")
            row["baseline"] = baseline
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def format_row(row: dict) -> str:
    """One Markdown table row."""
    acc, base = row.get("accuracy"), row.get("baseline")
    diff = f"{acc - base:+.4f}" if acc is not None and base is not None else "-"
    completed = "yes" if row["completed"] else f"NO ({row.get('error', '')})"
    cells = [row["strategy"], row["fault"], completed, str(row["rounds"]),
             str(row.get("failed", "-")), str(row.get("kept", "-")),
             f"{acc:.4f}" if acc is not None else "-",
             f"{base:.4f}" if base is not None else "-", diff]
    return "| " + " | ".join(cells) + " |"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The faults-table options."""
    add_common_arguments(parser, OUT_NAME)


def run(args: argparse.Namespace) -> int:
    """Print (and with --out write) the table; 0 if every run completed."""
    quiet_flower()
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = faults_table(args.strategies, args.rounds, args.nodes, args.seed, Path(tmp))
    out = out_file(args, OUT_NAME)
    if out:
        out.write_text(HEADER + "\n" + "\n".join(format_row(r) for r in rows) + "\n")
    return 0 if all(r["completed"] for r in rows) else 1

"""``python -m simulation results``: rebuild every ``docs/results/<experiment>/`` from
``runs/<experiment>/``: a sweep file's report (targets, baselines, title and claim from
``simulation/experiments/<experiment>.toml``) and the FedVeca Fig. 3 panels."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from .experiments import EXPERIMENTS_DIR
from .experiments import fedveca
from .claims_index import write_claims_index
from .protocol import claims_of
from .report import build_report, collect


def experiment_header(spec: dict) -> str:
    """The Markdown title, claim and runtime of a sweep file."""
    runtime = f"\n\nRuntime: {spec['runtime']}." if spec.get("runtime") else ""
    return f"# {spec.get('title', 'sweep')}\n\n{spec.get('claim', '').strip()}{runtime}\n\n"


def rebuild_results(experiments: Path, runs: Path, out: Path, names: list[str]) -> list[str]:
    """Rebuild ``out/<name>/`` from ``runs/<name>/`` for every sweep file that has runs."""
    built = []
    for path in sorted(experiments.glob("*.toml")):
        if (names and path.stem not in names) or not (runs / path.stem).is_dir():
            continue
        if not collect(runs / path.stem):  # e.g. a tuned sweep with only its tuning runs
            print(f"note: {path.stem}: no finished seeded run in {runs / path.stem} yet; "
                  "its report waits")
            continue
        spec = tomllib.loads(path.read_text())
        build_report(runs / path.stem, out / path.stem, list(spec.get("targets", [0.6, 0.7])),
                     spec.get("baselines"), experiment_header(spec),
                     order=list(spec.get("variants", {})), published=spec.get("published"),
                     published_source=spec.get("published-source", ""),
                     tolerance=float(spec.get("tolerance", 0.015)),
                     claims=claims_of(spec, path) or None)
        built.append(path.stem)
    return built


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The results options."""
    parser.add_argument("names", nargs="*",
                        help="experiment names (sweep file stems, or fedveca_fig3); default: all "
                             "with runs")
    parser.add_argument("--experiments", type=Path, default=EXPERIMENTS_DIR,
                        help="folder of the sweep files")
    parser.add_argument("--runs", type=Path, default=Path("runs"),
                        help="folder of the sweeps' results, one sub-folder per experiment")
    parser.add_argument("--out", type=Path, default=Path("docs/results"),
                        help="where the reports go, one sub-folder per experiment")


def run(args: argparse.Namespace) -> int:
    """Rebuild and print the reports written; 1 if there was nothing to rebuild."""
    runs, out = args.runs.resolve(), args.out.resolve()
    built = rebuild_results(args.experiments, runs, out, args.names)
    if not args.names or fedveca.NAME in args.names:
        built += fedveca.rebuild_results(runs, out)
    if not built:
        print(f"no experiment under {args.experiments} has finished seeded runs in "
              f"{args.runs}; run python -m simulation sweep "
              "simulation/experiments/<name>.toml first")
        return 1
    for name in built:
        report = "report.md" if "/" not in name else "tables.md"
        print(f"{args.out / name / report}")
    if write_claims_index(out / "README.md", out):
        print(f"{args.out / 'README.md'} (the protocol experiments' verdicts)")
    return 0

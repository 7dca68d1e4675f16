"""``python -m simulation {run,sweep,report,bench}``.

run    the app with the real ``flwr run . --stream`` (project-local FLWR_HOME, offline
       flags), then stop the managed local SuperLink it started.
sweep  variants x seeds from a TOML file, resumable, with a summary table.
report tables (final/best accuracy, rounds and bytes to target) and plots of a sweep.
results rebuild every docs/results/<experiment>/ from runs/<experiment>/.
faults-table / resume-check  reliability table and resume bit-exactness check (docs/reliability.md).
bench  benchmarks; see ``python -m simulation bench --help``.
centralized    centralized SGD with a given step budget (FedVeca's fairness protocol).
fedveca-fig3   FedVeca vs FedAvg, FedNova (E_avg from FedVeca's steps) and centralized SGD.
fedveca-plots  tables and figures of a fedveca-fig3 folder.
"""

from __future__ import annotations

import argparse
import sys

from .launcher import parse_overrides, run_app


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "sweep":
        from .sweep import main as sweep_main  # noqa: PLC0415
        return sweep_main(argv[1:])
    if argv and argv[0] == "report":
        from .report import main as report_main  # noqa: PLC0415
        return report_main(argv[1:])
    if argv and argv[0] == "results":
        from .report import results_main  # noqa: PLC0415
        return results_main(argv[1:])
    if argv and argv[0] == "centralized":
        from .centralized import main as centralized_main  # noqa: PLC0415
        return centralized_main(argv[1:])
    if argv and argv[0] == "fedveca-fig3":
        from .fedveca_fig3 import main as fig3_main  # noqa: PLC0415
        return fig3_main(argv[1:])
    if argv and argv[0] == "fedveca-plots":
        from .fedveca_plots import main as plots_main  # noqa: PLC0415
        return plots_main(argv[1:])
    if argv and argv[0] in ("faults-table", "resume-check"):
        from .faults_table import main as faults_main  # noqa: PLC0415
        return faults_main(argv[1:], command=argv[0])
    if argv and argv[0] == "bench":
        from .bench import main as bench_main  # noqa: PLC0415
        bench_main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m simulation")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="flwr run . --stream on the simulation engine")
    run.add_argument("--num-supernodes", type=int, default=10)
    run.add_argument("--cpus-per-client", type=float, default=1)
    run.add_argument("--gpus-per-client", type=float, default=0)
    run.add_argument("-c", "--run-config", action="append", default=[], metavar="KEY=VALUE",
                     help="run-config override, repeatable (e.g. -c strategy=fedavg -c lr=0.05)")
    run.add_argument("--flwr-home", default=None, help="FLWR_HOME (default: <project>/.flwr)")
    run.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                     help="run the ClientApps on this Ray cluster instead of a private Ray")
    sub.add_parser("bench", help="benchmarks (python -m simulation bench --help)")
    sub.add_parser("faults-table", help="fault class x strategy table, in-process (python -m simulation faults-table --help)")
    sub.add_parser("resume-check", help="kill, resume and compare a run bit for bit, in-process")
    sub.add_parser("sweep", help="variants x seeds from a TOML file (python -m simulation sweep --help)")
    sub.add_parser("report", help="tables and plots of a sweep folder (python -m simulation report --help)")
    sub.add_parser("centralized", help="centralized SGD baseline (python -m simulation centralized --help)")
    sub.add_parser("fedveca-fig3", help="FedVeca Fig. 3 with the fairness protocol (--help)")
    sub.add_parser("fedveca-plots", help="tables and plots of a fedveca-fig3 folder (--help)")
    sub.add_parser("results", help="rebuild docs/results/* from runs/* (python -m simulation results --help)")
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.run_config)
    except ValueError as exc:
        parser.error(str(exc))
    federation = {"num-supernodes": args.num_supernodes, "client-resources-num-cpus": args.cpus_per_client}
    if args.gpus_per_client:
        federation["client-resources-num-gpus"] = args.gpus_per_client
    return run_app(overrides or None, federation, flwr_home=args.flwr_home, ray_address=args.ray_address).returncode


if __name__ == "__main__":
    sys.exit(main())

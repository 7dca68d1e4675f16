"""``python -m simulation {run,sweep,report,bench}``.

run    the app with the real ``flwr run . --stream`` (project-local FLWR_HOME, offline
       flags), then stop the managed local SuperLink it started.
sweep  variants x seeds from a TOML file, resumable, with a summary table.
report tables (final/best accuracy, rounds and bytes to target) and plots of a sweep.
results rebuild every docs/results/<experiment>/ from runs/<experiment>/.
bench  benchmarks; see ``python -m simulation bench --help``.
"""

from __future__ import annotations

import argparse
import sys

from .launcher import run_app


def _parse_value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text.strip("'\"")


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
    sub.add_parser("sweep", help="variants x seeds from a TOML file (python -m simulation sweep --help)")
    sub.add_parser("report", help="tables and plots of a sweep folder (python -m simulation report --help)")
    sub.add_parser("results", help="rebuild docs/results/* from runs/* (python -m simulation results --help)")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.run_config:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--run-config {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = _parse_value(value.strip())
    federation = {"num-supernodes": args.num_supernodes, "client-resources-num-cpus": args.cpus_per_client}
    if args.gpus_per_client:
        federation["client-resources-num-gpus"] = args.gpus_per_client
    return run_app(overrides or None, federation, flwr_home=args.flwr_home, ray_address=args.ray_address).returncode


if __name__ == "__main__":
    sys.exit(main())

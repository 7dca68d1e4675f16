"""``python -m simulation fedveca-fig3``: FedVeca's Fig. 3 with the paper's fairness protocol.

Per seed, in this order (Luo et al., Sec. IV-A):

1. FedVeca (``strategy='fedveca'``) through the real ``flwr run`` on the simulation
   engine, N SuperNodes, full participation;
2. from its ``rounds.jsonl``: tau_all = sum_k sum_i tau_(k,i), E_avg = (tau_all / K) B / D;
3. FedAvg and FedNova with ``local-epochs=E_avg`` (tau_i = max(1, floor(E_avg D_i / B)),
   fixed over rounds), also through ``flwr run``;
4. centralized SGD on the union of the clients' data with tau_all steps of batch B,
   evaluated after each round's share of FedVeca's steps (:mod:`.centralized`).

Outputs ``<out>/<variant>/seed<k>/<run>/rounds.jsonl`` (variants ``fedveca``, ``fedavg``,
``fednova``, ``centralized``) and ``<out>/fairness_seed<k>.json``; finished runs are
skipped, so an interrupted driver resumes. At the end the tables and plots of
:mod:`.plots` are written into ``<out>`` (and ``python -m simulation
report <out>`` works too).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import ModuleType

from fedapp.run_log import CONFIG_FILE, read_json, read_rounds

from simulation.preflight import refuse_bad_run_configs
from simulation.progress import RoundProgress
from simulation.runtime import (at_least, client_resources, option_type, parse_overrides,
                                refuse_unfittable, run_app)
from simulation.sweep import SweepRun, finished_run_dir

from .centralized import run_centralized
from .fairness import budget, checkpoints, partition_sizes

VARIANTS = ("fedveca", "fedavg", "fednova", "centralized")


def base_config(args: argparse.Namespace) -> dict:
    """The run config every federated method shares (the paper's Fig. 3 setting)."""
    config = {
        "model": args.model, "dataset": args.dataset, "partition": args.partition,
        "num-server-rounds": args.rounds, "lr": args.lr, "batch-size": args.batch_size,
        "min-available-nodes": args.num_clients, "fraction-train": 1.0, "fraction-evaluate": 0.0,
        "momentum": 0.0, "weight-decay": 0.0, "server-lr": 1.0, "server-momentum": 0.0,
        "straggler-fraction": 0.0, "weighting": "examples", "drift-diagnostics": False,
        "device": args.device, "allow-download": False,
    }
    if args.data_dir:
        config["data-dir"] = args.data_dir
    config.update(parse_overrides(args.extra))
    return config


def fedveca_config(args: argparse.Namespace) -> dict:
    return {"strategy": "fedveca", "fedveca-alpha": args.alpha, "fedveca-tau-init": args.tau_init,
            "fedveca-tau-max": args.tau_max, "fedveca-beta-mode": args.beta_mode,
            "fedveca-grad-subsample": args.grad_subsample}


def federated(args, out: Path, variant: str, seed: int, overrides: dict, label: str) -> Path | None:
    """Run (or find) one federated run; its run directory, or None if it failed."""
    directory = out / variant / f"seed{seed}"
    config = {
        **base_config(args),
        **overrides,
        "seed": seed,
        "output-dir": str(directory.resolve()),
    }
    run = SweepRun(variant, seed, config, directory)
    existing = finished_run_dir(run)
    if existing is not None:
        print(f"{label}: already done ({existing})", flush=True)
        return existing
    start = time.monotonic()
    print(f"{label}: running ...", flush=True)
    # isolate_ports: a SuperLink of another FLWR_HOME on the default ports would take the run
    result = run_app(
        config,
        federation_of(args),
        flwr_home=out / ".flwr",
        capture=True,
        timeout=args.timeout,
        isolate_ports=True,
        on_line=RoundProgress(label, args.rounds),
    )
    existing = finished_run_dir(run)
    if result.returncode != 0 or existing is None:
        print(
            f"{label}: FAILED ({result.status}); last output:\n{result.output[-3000:]}", flush=True
        )
        return None
    records = read_rounds(existing)
    print(
        f"{label}: done in {time.monotonic() - start:.0f} s, final accuracy "
        f"{records[-1]['accuracy']:.4f}, "
        f"loss {records[-1]['loss']:.4f}",
        flush=True,
    )
    return existing


def dataset_sizes(args) -> list[int]:
    """D_i of the partitions, from the data (when the FedVeca run has no partitions.json)."""
    from task.data import PartitionSpec, load_dataset, partition_for  # noqa: PLC0415

    dataset = load_dataset(args.dataset, args.data_dir, False)
    parts = partition_for(dataset, PartitionSpec(scheme=args.partition, seed=0), args.num_clients)
    return [len(p) for p in parts]


def centralized(args, out: Path, seed: int, points: list[int], label: str) -> Path | None:
    directory = out / "centralized" / f"seed{seed}"
    run = SweepRun("centralized", seed, {"num-server-rounds": len(points)}, directory)
    existing = finished_run_dir(run)
    if existing is not None:
        stored = read_json(existing, CONFIG_FILE).get("checkpoints")
        if stored == points:
            print(f"{label}: already done ({existing})", flush=True)
            return existing
        print(f"{label}: {existing} has other checkpoints; running again", flush=True)
    start = time.monotonic()
    print(f"{label}: running {points[-1]} steps ...", flush=True)
    run_dir = run_centralized(
        model_name=args.model,
        checkpoints=points,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=seed,
        output_dir=directory.resolve(),
        dataset_name=args.dataset,
        data_dir=args.data_dir,
        partition=args.partition,
        num_partitions=args.num_clients,
        verbose=False,
    )
    records = read_rounds(run_dir)
    print(
        f"{label}: done in {time.monotonic() - start:.0f} s, final accuracy "
        f"{records[-1]['accuracy']:.4f}, "
        f"loss {records[-1]['loss']:.4f}",
        flush=True,
    )
    return run_dir


def run_seed(args, out: Path, seed: int, index: int, total: int) -> bool:
    tag = f"[seed {seed}, {index}/{total}]"
    veca = federated(args, out, "fedveca", seed, fedveca_config(args), f"{tag} fedveca")
    if veca is None:
        return False
    records = read_rounds(veca)
    sizes = partition_sizes(veca) or dataset_sizes(args)
    plan = budget(records, sizes, args.batch_size)
    info = {"seed": seed, "fedveca-run": str(veca), **plan.to_json()}
    (out / f"fairness_seed{seed}.json").write_text(json.dumps(info, indent=1) + "\n")
    print(
        f"{tag} fairness: tau_all = {plan.tau_all} over K = {plan.rounds} rounds "
        f"({plan.tau_all / plan.rounds:.2f} steps/round), D = {sum(sizes)}, E_avg = "
        f"{plan.e_avg!r}, "
        f"baseline tau_i = {plan.baseline_taus} (sum {plan.baseline_steps_per_round}/round)",
        flush=True,
    )
    ok = True
    for variant in ("fedavg", "fednova"):
        overrides = {"strategy": variant, "local-epochs": plan.e_avg, "local-steps": 0}
        ok &= federated(args, out, variant, seed, overrides, f"{tag} {variant}") is not None
    ok &= (
        centralized(args, out, seed, checkpoints(plan.per_round), f"{tag} centralized") is not None
    )
    return ok


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The fedveca-fig3 options."""
    parser.add_argument("--model", default="svm", help="svm (squared-SVM, even/odd) or cnn-fedveca")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="run-config seeds, one full protocol each")
    parser.add_argument("--rounds", type=at_least(1), default=50, help="K (the paper: 100)")
    parser.add_argument("--out", type=Path, default=None, help="default: runs/fedveca_fig3_<model>")
    parser.add_argument("--num-clients", type=option_type("num-supernodes"), default=5,
                        help="N SuperNodes, all in every round")
    parser.add_argument("--partition", default="fedveca-case3", help="run-config partition")
    parser.add_argument("--dataset", default="fashion-mnist", help="run-config dataset")
    parser.add_argument("--data-dir", default="",
                        help="absolute data folder (run-config data-dir; empty: the default place)")
    parser.add_argument("--lr", type=float, default=0.01, help="eta (paper: 0.01)")
    parser.add_argument(
        "--batch-size", type=at_least(1), default=100, help="B (not in the paper; ref. code: 100)"
    )
    parser.add_argument("--alpha", type=float, default=0.95, help="FedVeca's alpha, eq. (15)")
    parser.add_argument("--tau-init", type=at_least(1), default=20, help="tau of rounds 0 and 1")
    parser.add_argument("--tau-max", type=at_least(1), default=50, help="the cap on every tau")
    parser.add_argument("--beta-mode", default="same-batch",
                        help="client estimator of beta: same-batch or literal (Alg. 2)")
    parser.add_argument(
        "--grad-subsample", type=at_least(0), default=0, help="0: full local gradient (paper)"
    )
    parser.add_argument("--device", default="cpu", help="run-config device: auto, cpu, cuda "
                        "(the ClientApps see a GPU only with --gpus-per-client)")
    parser.add_argument("--cpus-per-client", type=option_type("client-resources-num-cpus"),
                        default=1, help="CPUs per ClientApp")
    parser.add_argument("--gpus-per-client", type=option_type("client-resources-num-gpus"),
                        default=0, help="GPU share per ClientApp (0.25: four share a GPU; "
                        "0: Ray hides the GPU from them)")
    parser.add_argument("--timeout", type=float, default=3 * 3600, help="seconds per flwr run")
    parser.add_argument(
        "-c",
        "--extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more run-config overrides for every federated run",
    )
    parser.add_argument(
        "--no-report", action="store_true", help="skip the tables and plots at the end"
    )


def driver_args(args: argparse.Namespace) -> dict:
    """The options of this invocation as JSON values (paths as text), for
    ``driver_args.json``; the tool module the CLI adds to ``args`` is not an option."""
    return {key: (str(value) if isinstance(value, Path) else value)
            for key, value in vars(args).items() if not isinstance(value, ModuleType)}


def federation_of(args: argparse.Namespace) -> dict:
    """Every federated run's federation options."""
    return client_resources(args.num_clients, args.cpus_per_client, args.gpus_per_client)


def run(args: argparse.Namespace) -> int:
    """Every seed's runs, then the tables and plots; 0 if every run finished."""
    federation = federation_of(args)  # before the folder: ClientApps that cannot run
    refuse_bad_run_configs([("fedveca-fig3", {"device": args.device})], federation)
    refuse_unfittable(federation)
    out = (args.out or Path("runs") / f"fedveca_fig3_{args.model}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "driver_args.json").write_text(json.dumps(driver_args(args), indent=1) + "\n")
    ok = all(
        [run_seed(args, out, seed, i, len(args.seeds)) for i, seed in enumerate(args.seeds, 1)]
    )
    if not args.no_report:
        from .plots import build  # noqa: PLC0415

        print(build(out, out), flush=True)
    return 0 if ok else 1

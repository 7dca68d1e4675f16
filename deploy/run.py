"""``python -m deploy run``: SuperLink + N SuperNodes on this machine, one ``flwr run``, stop all.

Examples::

    python -m deploy run --num-supernodes 2 -c num-server-rounds=2
    python -m deploy run --num-supernodes 3 --tls --auth -c strategy=fednova -c num-server-rounds=5
    python -m deploy run --host 0.0.0.0 --port 8000 --tls --auth --cert-host node.example.org

The SuperLink binds 127.0.0.1; any other ``--host`` serves the Fleet API only (SuperNodes,
through deploy.fleet_gateway), and a non-loopback one only with ``--tls --auth`` (or
``--insecure-remote``). docs/deployment.md, "Threat model".

Certificates, keys, logs and the FLWR_HOMEs live in ``--workdir`` (default
``.flwr/deploy/``, git-ignored); the run log goes to the run-config ``output-dir`` as in
simulation. With ``--auth`` the run config gets ``partition-map=WORKDIR/keys/partitions.json``
(unless given): each SuperNode may claim only the partition its registered key was made
for. Flower's own strategies send no client-info query, so with them pass
``-c partition-map=""`` (the run config's check says so). Exits non-zero unless the run ends
``finished:completed``.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from fedapp import check_run_config, cli_fix  # the app's public entry points
from simulation.runtime import parse_overrides, to_flwr_config

from .bind_policy import insecure_remote_warning
from .cluster import DeploySpec, LocalDeployment
from .layout import DEFAULT_WORKDIR, Layout
from .runner import run_on_connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The deploy run options."""
    parser.add_argument("--num-supernodes", type=int, default=2,
                        help="SuperNodes to start (one data partition each)")
    parser.add_argument("--tls", action="store_true",
                        help="TLS (makes a CA + server cert in WORKDIR/certificates)")
    parser.add_argument("--auth", action="store_true",
                        help="SuperNode authentication (needs --tls; keys in WORKDIR/keys, "
                             "registered with flwr)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address SuperNodes reach (0.0.0.0 for remote nodes): anything but "
                             "127.0.0.1/localhost gets the Fleet API only, through a gateway; "
                             "a non-loopback address needs --tls --auth")
    parser.add_argument("--port", type=int, default=0,
                        help="the SuperNodes' port on --host (default: a free one)")
    parser.add_argument("--insecure-remote", action="store_true",
                        help="allow a non-loopback --host without --tls --auth (anyone who "
                             "reaches it can join as a SuperNode): a trusted network only")
    parser.add_argument("--cert-host", action="append", default=[], metavar="NAME_OR_IP",
                        help="also put this name/address into the server certificate's SANs "
                             "(repeatable; the name SuperNodes use when --host is 0.0.0.0)")
    parser.add_argument("--data-dir", default="",
                        help="absolute data folder put into every node config")
    parser.add_argument("--num-threads", type=int, default=0,
                        help="torch threads per SuperNode's ClientApp (node config num-threads); "
                             "default 0: this machine's cores divided among the SuperNodes")
    parser.add_argument("--flower-clientapps", action="store_true",
                        help="Flower's own SuperNode and per-message flwr-clientapp processes "
                             "(default: deploy.supernode with shorter waits and ClientApps "
                             "forked from a warm deploy.warm_superexec)")
    parser.add_argument("--in-memory-superlink", action="store_true",
                        help="the SuperLink's state in memory (Flower's default: faster rounds, "
                             "but a restarted SuperLink has lost its runs and nodes); default: "
                             "WORKDIR/.../state.db")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                        help="certificates, keys, logs and FLWR_HOMEs")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds before flwr run is stopped")
    parser.add_argument(
        "-c",
        "--run-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run-config override, repeatable (e.g. -c strategy=fednova -c lr=0.05)",
    )


def spec_of(args: argparse.Namespace) -> tuple[DeploySpec, dict]:
    """(what to start, run-config overrides); ValueError names a bad option or run-config
    value (the ServerApp's checks: :func:`fedapp.check_run_config`)."""
    overrides = parse_overrides(args.run_config)
    spec = DeploySpec(
        num_supernodes=args.num_supernodes,
        tls=args.tls,
        auth=args.auth,
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        num_threads=args.num_threads,
        warm_clientapps=not args.flower_clientapps,
        superlink_database=not args.in_memory_superlink,
        insecure_remote=args.insecure_remote,
        cert_hosts=tuple(args.cert_host),
    )
    virtual = overrides.get("virtual-clients", 0)  # packed: N virtual clients on the SuperNodes
    overrides.setdefault("min-available-nodes",  # all join before round 1
                         virtual if isinstance(virtual, int) and virtual > 0 else spec.num_supernodes)
    if spec.auth:  # node identity: each registered key may claim only its own partition
        overrides.setdefault("partition-map", str(Layout(args.workdir.resolve()).partition_map))
    cfg = check_run_config(overrides, fix_as=cli_fix)  # the ServerApp's rules, fixes as -c
    if cfg.virtual_clients and cfg.min_available_nodes > cfg.virtual_clients:
        raise ValueError(
            f"min-available-nodes={cfg.min_available_nodes}, but there are virtual-clients="
            f"{cfg.virtual_clients}: the ServerApp would wait for nodes forever; give -c "
            f"min-available-nodes={cfg.virtual_clients}")
    if not cfg.virtual_clients and cfg.min_available_nodes > spec.num_supernodes:
        raise ValueError(
            f"min-available-nodes={cfg.min_available_nodes}, but --num-supernodes is "
            f"{spec.num_supernodes}: the ServerApp would wait for nodes forever; give "
            f"--num-supernodes {cfg.min_available_nodes} or -c min-available-nodes="
            f"{spec.num_supernodes}")
    return spec, overrides


def preflight(spec: DeploySpec, overrides: dict) -> None:
    """ValueError with the message of ``python -m simulation run --check``'s checks of a
    checkpoint to resume, the data and the partitions (simulation.preflight), run in a
    child process for ``spec``'s SuperNodes (deploy/ imports no simulation module but the
    runtime: ARCHITECTURE.md, "Layers"); its warnings go to stderr."""
    argv = [sys.executable, "-m", "simulation", "run", "--check", "--deployment",
            "--num-supernodes", str(spec.num_supernodes), "--node-data-dir", spec.data_dir]
    for key, value in overrides.items():
        argv += ["-c", f"{key}={to_flwr_config({key: value}).partition('=')[2]}"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        sys.stderr.write(done.stderr)
        return
    raise ValueError(done.stderr.strip() or f"{shlex.join(argv)} exited {done.returncode}")


def run(args: argparse.Namespace) -> int:
    """Start everything, run the app once, stop everything; the run's exit code."""
    try:
        spec, overrides = spec_of(args)
        preflight(spec, overrides)
    except ValueError as err:  # a usage error, as argparse reports one
        print(
            f"usage: python -m deploy run [-h] ...\npython -m deploy run: error: {err}",
            file=sys.stderr,
        )
        return 2
    warning = insecure_remote_warning(spec.host, spec.tls, spec.auth)
    if warning:
        print(f"{'!' * 80}\n[deploy] {warning}\n{'!' * 80}", file=sys.stderr, flush=True)
    layout = Layout(args.workdir.resolve())
    with LocalDeployment(spec, layout) as deployment:
        deployment.start()
        fleet = (f"Fleet API only on {deployment.address} (gateway), Control/Runtime on "
                 f"{deployment.admin_address}" if deployment.gateway
                 else f"SuperLink {deployment.address}")
        print(
            f"[deploy] {fleet} ({'TLS' if spec.tls else 'insecure'}"
            f"{' + SuperNode auth' if spec.auth else ''}), {spec.num_supernodes} SuperNodes, "
            f"logs in {layout.logs}",
            flush=True,
        )
        result = run_on_connection(
            spec.connection, deployment.cli_env, overrides, timeout=args.timeout
        )
    print(f"[deploy] run {result.run_id}: {result.status}", flush=True)
    return result.returncode

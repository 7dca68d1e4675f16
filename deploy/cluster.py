"""One SuperLink and N SuperNodes on this machine, optionally with TLS and SuperNode auth.

The SuperLink binds 127.0.0.1 only (its Control and Runtime APIs have no user
authentication in Flower 1.42); a ``host`` other than 127.0.0.1/localhost gets the Fleet API
alone, through :mod:`deploy.fleet_gateway` (:mod:`deploy.bind_policy`).

Every process is our child with its own FLWR_HOME, working directory and log file under
the deployment's work directory; ``stop()`` ends them and their children by PID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from simulation.runtime import (Started, flwr_env, free_port, start_process, stop_processes,
                                wait_for_port)

from .bind_policy import ADMIN_HOST, bind_problem, needs_gateway
from .connection import write_connection
from .layout import Layout, ensure_certs, ensure_keys
from .node_identity import write_partition_map

BIN = Path(sys.executable).parent
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the folder holding this deploy/
JOINED = "SuperNode ID: "  # what flower-supernode 1.41 logs once the SuperLink accepted it
# Flower 1.41's SuperExec asks its SuperLink/SuperNode for a new task (a ServerApp or a
# ClientApp process to start) every FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds (default 1.0,
# allowed 0.01..60; flwr/supercore/superexec/run_superexec.py). Every message a SuperNode
# receives waits for that poll before its flwr-clientapp process starts. 0.1 s: one local
# HTTP request per 0.1 s and SuperExec, as often as the simulation's Grid pulls.
TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
TASK_POLL_SECONDS = "0.1"
# The SuperLink's SuperExec starts one ServerApp per run: 0.5 s adds at most that to a run's
# start, and spares the SuperLink 8 of its ~18 requests a second while idle (measured: an
# idle 4-SuperNode deployment's SuperLink used 0.17 of a core with 0.1 s)
SERVERAPP_TASK_POLL_SECONDS = "0.5"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_supernode(num_supernodes: int, cpus: int | None = None) -> int:
    """torch threads for each of ``num_supernodes`` SuperNodes sharing this machine's cores."""
    cpus = cpus if cpus is not None else usable_cpus()
    return max(1, cpus // max(1, num_supernodes))


@dataclass(frozen=True)
class DeploySpec:
    """What to start. ``port=0`` picks a free port; ``data_dir=''`` uses the app's lookup."""

    num_supernodes: int = 2
    tls: bool = False
    auth: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    data_dir: str = ""
    connection: str = "fedhetero-deploy"
    num_threads: int = 0  # torch threads per ClientApp; 0: cpu_count // num_supernodes
    # SuperNodes with Flower's waits shortened (deploy.supernode) and their ClientApps forked
    # from a warm SuperExec (deploy.warm_superexec); False: Flower's own processes
    warm_clientapps: bool = True
    # the SuperLink's state in state.db (restartable after a crash) or in memory (Flower's
    # default: faster, its runs and nodes lost with it)
    superlink_database: bool = True
    # a non-loopback host without tls + auth is refused unless this is True
    insecure_remote: bool = False
    # extra names/addresses for the server certificate's SANs (e.g. this host's DNS name
    # when host is 0.0.0.0); host itself is added when it is an address to reach
    cert_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.num_supernodes < 1:
            raise ValueError(
                f"num_supernodes={self.num_supernodes} (--num-supernodes): start at least 1 "
                "SuperNode"
            )
        if self.auth and not self.tls:
            raise ValueError(
                "auth (--auth) needs tls (--tls): Flower's SuperNode authentication requires TLS; "
                "add --tls"
            )
        problem = bind_problem(self.host, self.tls, self.auth, self.insecure_remote)
        if problem:
            raise ValueError(problem)
        if not 0 <= self.port <= 65535:
            raise ValueError(
                f"port={self.port} (--port): give a TCP port from 1 to 65535, or 0 for a free one"
            )
        if self.num_threads < 0:
            raise ValueError(
                f"num_threads={self.num_threads} (--num-threads): give an integer >= 1, or 0 "
                "to share this machine's cores among the SuperNodes"
            )
        if self.data_dir and not Path(self.data_dir).is_absolute():
            raise ValueError(
                f"data_dir={self.data_dir!r} (--data-dir) must be an absolute path, e.g. "
                "/usr/share/datasets/fashion-mnist (SuperNodes run in their own working "
                "directories)"
            )


class LocalDeployment:
    """Start/stop a SuperLink, register keys, start SuperNodes; a context manager."""

    def __init__(self, spec: DeploySpec, layout: Layout, start_timeout: float = 60.0) -> None:
        self.spec = spec
        self.layout = layout
        self.start_timeout = start_timeout
        self.port = spec.port or free_port()
        # the SuperLink's own port: the same as port unless a Fleet gateway serves port
        self.admin_port = free_port() if self.gateway else self.port
        self.started: list[Started] = []
        self.cli_env = flwr_env(layout.cli_home)

    @property
    def threads(self) -> int:
        """``num-threads`` in every SuperNode's node config (they share this machine)."""
        return self.spec.num_threads or threads_per_supernode(self.spec.num_supernodes)

    def _env(self, home: Path, task_poll: str = TASK_POLL_SECONDS) -> dict[str, str]:
        """A process's environment: its FLWR_HOME and a short SuperExec task poll."""
        env = flwr_env(home)
        env.setdefault(TASK_POLL_ENV, task_poll)
        return env

    @property
    def gateway(self) -> bool:
        """True when the Fleet API on ``host`` is :mod:`deploy.fleet_gateway`'s."""
        return needs_gateway(self.spec.host)

    @property
    def address(self) -> str:
        """Where SuperNodes reach the Fleet API from this machine."""
        host = "127.0.0.1" if self.spec.host in ("0.0.0.0", "::", "") else self.spec.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def admin_address(self) -> str:
        """Where the ``flwr`` CLI reaches the Control API: the SuperLink's loopback bind."""
        return f"{ADMIN_HOST}:{self.admin_port}" if self.gateway else self.address

    @property
    def cert_hosts(self) -> tuple[str, ...]:
        """Names the server certificate must cover besides 127.0.0.1 and localhost."""
        wildcard = self.spec.host in ("0.0.0.0", "::", "")
        own = () if wildcard or self.spec.host in ("127.0.0.1", "localhost") else (self.spec.host,)
        return tuple(dict.fromkeys((*own, *self.spec.cert_hosts)))

    def __enter__(self) -> "LocalDeployment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def database(self) -> Path:
        """The SuperLink's state file (fresh for every :meth:`start`)."""
        return self.layout.superlink_home / "state.db"

    def start(self, supernodes: Iterable[int] | None = None) -> "LocalDeployment":
        """Credentials, SuperLink (fresh state), CLI connection; then register and start these
        SuperNodes (default: all)."""
        for old in self.database.parent.glob(f"{self.database.name}*"):  # + sqlite's -wal, -shm
            old.unlink()
        if self.spec.tls:
            ensure_certs(self.layout, self.cert_hosts)
        if self.spec.auth:
            ensure_keys(self.layout, self.spec.num_supernodes)
            write_partition_map(self.layout.partition_map,
                                {i: self.layout.public_key(i)
                                 for i in range(self.spec.num_supernodes)})
        self.start_superlink()
        if self.gateway:
            self.start_gateway()
        write_connection(self.layout.cli_home, self.spec.connection, self.admin_address,
                         self.layout.ca_cert if self.spec.tls else None)
        chosen = list(range(self.spec.num_supernodes) if supernodes is None else supernodes)
        for i in chosen:
            if self.spec.auth:
                self.register(self.layout.public_key(i))
            self.start_supernode(i)
        self.wait_for_supernodes(len(chosen))
        return self

    def start_superlink(self) -> Started:
        """The SuperLink, its state (nodes, runs) in ``state.db`` of its home: started again
        after a crash, it knows the SuperNodes, which then carry on (with Flower's default
        in-memory state, ``superlink_database=False``, they are refused and exit). It binds
        127.0.0.1 when a Fleet gateway serves ``host``."""
        host = ADMIN_HOST if self.gateway else self.spec.host
        argv = [str(BIN / "flower-superlink"), "--host", host, "--port", str(self.admin_port),
                "--disable-runtime-dependency-installation", *self._server_tls_args()]
        if self.spec.superlink_database:
            argv += ["--database", str(self.database)]
        if self.spec.auth:
            argv.append("--enable-supernode-auth")
        home = self.layout.superlink_home
        link = start_process(
            "SuperLink", argv, self._env(home, SERVERAPP_TASK_POLL_SECONDS), home,
            self.layout.logs / "superlink.log"
        )
        self.started.append(link)
        host, port = self.admin_address.rsplit(":", 1)
        wait_for_port(host, int(port), self.start_timeout, watch=link)
        return link

    def start_gateway(self) -> Started:
        """:mod:`deploy.fleet_gateway` on ``host:port``: the Fleet API only, forwarded to the
        SuperLink's loopback bind; the Control and Runtime APIs answer 403 there. With auth,
        only Fleet calls signed with one of the SuperNodes' keys (``keys/*.pub``) are read."""
        argv = [sys.executable, "-m", "deploy.fleet_gateway", "--host", self.spec.host,
                "--port", str(self.port), "--superlink", self.admin_address]
        if self.spec.auth:
            argv += ["--authorized-keys", str(self.layout.keys)]
        if self.spec.tls:
            argv += ["--ssl-certfile", str(self.layout.server_cert),
                     "--ssl-keyfile", str(self.layout.server_key),
                     "--ssl-ca-certfile", str(self.layout.ca_cert)]
        else:
            argv.append("--insecure")
        home = self.layout.superlink_home
        env = self._env(home)  # this deploy package's gateway, whatever the venv installed
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PACKAGE_ROOT),
                                                          env.get("PYTHONPATH"))))
        gateway = start_process("Fleet gateway", argv, env, home,
                                self.layout.logs / "fleet-gateway.log")
        self.started.append(gateway)
        host, port = self.address.rsplit(":", 1)
        wait_for_port(host.strip("[]"), int(port), self.start_timeout, watch=gateway)
        return gateway

    def start_supernode(
        self, partition_id: int, private_key: Path | None = None, max_retries: int | None = None,
        data_dir: str | None = None, claimed_partition: int | None = None,
    ) -> Started:
        """SuperNode ``partition_id`` with its node config (``data_dir``: this node's data
        folder instead of the spec's; ``claimed_partition``: another node-config partition-id,
        as an impostor would set); its own key when auth is on."""
        claimed = partition_id if claimed_partition is None else claimed_partition
        node_config = (f"partition-id={claimed} num-partitions={self.spec.num_supernodes}"
                       f" num-threads={self.threads}")
        data_dir = self.spec.data_dir if data_dir is None else data_dir
        if data_dir:
            node_config += f' data-dir="{data_dir}"'
        runtime_port = free_port()
        launcher = ([sys.executable, "-m", "deploy.supernode"] if self.spec.warm_clientapps
                    else [str(BIN / "flower-supernode")])
        argv = [*launcher, "--superlink", self.address, "--host", "127.0.0.1",
                "--port", str(runtime_port), "--node-config", node_config,
                *self._client_tls_args()]
        if self.spec.warm_clientapps:  # no SuperExec of its own: ours, started below
            argv += ["--isolation", "process"]
        key = private_key or (self.layout.private_key(partition_id) if self.spec.auth else None)
        if key is not None:
            argv += ["--auth-supernode-private-key", str(key)]
        if max_retries is not None:
            argv += ["--max-retries", str(max_retries)]
        home = self.layout.supernode_home(partition_id)
        log = self.layout.logs / f"supernode-{partition_id}.log"
        node = start_process(f"SuperNode {partition_id}", argv, self._env(home), home, log)
        self.started.append(node)
        if self.spec.warm_clientapps:
            self.started.append(start_process(
                f"SuperExec {partition_id}",
                [sys.executable, "-m", "deploy.warm_superexec", "--insecure",
                 "--runtime-api-address", f"127.0.0.1:{runtime_port}",
                 "--parent-pid", str(node.proc.pid)],
                self._env(home), home, log))
        return node

    def stop_supernode(self, partition_id: int) -> None:
        """Stop every SuperNode of ``partition_id`` we started, and what it started, by PID."""
        names = (f"SuperNode {partition_id}", f"SuperExec {partition_id}")
        stop_processes([s for s in self.started if s.name in names])

    def register(self, public_key: Path) -> str:
        """``flwr supernode register <key.pub> <connection>``; returns its output."""
        return self.flwr("supernode", "register", str(public_key), self.spec.connection)

    def flwr(self, *args: str, timeout: float = 180.0) -> str:
        """One ``flwr`` CLI command with this deployment's FLWR_HOME; errors name the command."""
        cmd = [str(BIN / "flwr"), *args]
        proc = subprocess.run(
            cmd,
            env=self.cli_env,
            cwd=self.layout.root,
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"`flwr {' '.join(args)}` failed (exit {proc.returncode}):\n"
                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        return proc.stdout

    def node_statuses(self) -> list[str]:
        """Status of every SuperNode the SuperLink knows ('online', 'registered', ...)."""
        listed = json.loads(
            self.flwr("supernode", "list", self.spec.connection, "--format", "json")
        )
        return [node["status"] for node in listed["nodes"]]

    def wait_for_supernodes(self, count: int) -> None:
        """Block until ``count`` SuperNodes have joined; fail fast, with its log, if one exits.

        A SuperNode logs "SuperNode ID: <id>" once the SuperLink accepted it; reading the
        logs costs nothing, unlike polling ``flwr supernode list`` on a busy machine.
        """
        nodes = [s for s in self.started if s.name.startswith("SuperNode")]
        deadline = time.monotonic() + self.start_timeout
        while True:
            for node in nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(
                        f"{node.name} exited with code {node.proc.returncode}; its log "
                        f"({node.log_path}) ends with:\n{node.log_tail()}"
                    )
            joined = sum(JOINED in node.log_tail(100_000) for node in nodes)
            if joined >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{joined} of {count} SuperNodes joined after {self.start_timeout} s; "
                    f"see their logs in {self.layout.logs}"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        """SuperNodes first, then the SuperLink, each with its children, by PID."""
        stop_processes(list(reversed(self.started)))

    def _server_tls_args(self) -> list[str]:
        if not self.spec.tls:
            return ["--insecure"]
        lay = self.layout
        return [
            "--ssl-ca-certfile",
            str(lay.ca_cert),
            "--ssl-certfile",
            str(lay.server_cert),
            "--ssl-keyfile",
            str(lay.server_key),
        ]

    def _client_tls_args(self) -> list[str]:
        return (
            ["--root-certificates", str(self.layout.ca_cert)] if self.spec.tls else ["--insecure"]
        )

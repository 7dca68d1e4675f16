"""Where one local deployment keeps its certificates, keys, logs and FLWR_HOMEs."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from simulation.runtime import PROJECT_ROOT

from .cert_check import RENEW_DAYS, certificate_problem

DEPLOY_DIR = Path(__file__).resolve().parent
DEFAULT_WORKDIR = PROJECT_ROOT / ".flwr" / "deploy"  # git-ignored, never ~/.flwr


@dataclass(frozen=True)
class Layout:
    """Paths below one deployment work directory."""

    root: Path

    @property
    def certs(self) -> Path:
        return self.root / "certificates"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def cli_home(self) -> Path:
        """FLWR_HOME of the ``flwr`` CLI (holds config.toml with our connection)."""
        return self.root / "cli-home"

    @property
    def superlink_home(self) -> Path:
        return self.root / "superlink"

    def supernode_home(self, partition_id: int) -> Path:
        return self.root / f"supernode-{partition_id}"

    @property
    def ca_cert(self) -> Path:
        return self.certs / "ca.crt"

    @property
    def server_cert(self) -> Path:
        return self.certs / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.certs / "server.key"

    def private_key(self, partition_id: int) -> Path:
        return self.keys / f"supernode_credentials_{partition_id}"

    def public_key(self, partition_id: int) -> Path:
        return self.keys / f"supernode_credentials_{partition_id}.pub"

    @property
    def partition_map(self) -> Path:
        """{sha256 of a registered key's PEM: the partition it may serve}
        (:mod:`deploy.node_identity`)."""
        return self.keys / "partitions.json"


def ensure_certs(layout: Layout, hosts: tuple[str, ...] = (),
                 min_days: int = RENEW_DAYS) -> str | None:
    """CA + server certificate (SANs 127.0.0.1, localhost, ``hosts``), made again when one is
    missing, their SANs do not cover ``hosts`` or either expires within ``min_days``; why
    they were made again (None: the existing ones were kept)."""
    files = (layout.ca_cert, layout.server_cert, layout.server_key)
    if not all(p.is_file() for p in files):
        reason = "no certificates yet"
    else:
        reason = certificate_problem(layout.server_cert, layout.ca_cert,
                                     ("127.0.0.1", "localhost", *hosts), min_days,
                                     layout.server_key)
        if reason is None:
            return None
        print(f"[deploy] making new certificates in {layout.certs}: {reason}. Copy the new "
              "ca.crt to every SuperNode and CLI host (the old one no longer verifies)",
              file=sys.stderr, flush=True)
    _script("make_certs.sh", str(layout.certs), *hosts)
    return reason


def ensure_keys(layout: Layout, num_supernodes: int) -> None:
    """Key pairs supernode_credentials_<i>[.pub] for i = 0..N-1 (existing ones are kept)."""
    _script("make_keys.sh", str(layout.keys), str(num_supernodes))


def _script(name: str, *args: str) -> None:
    proc = subprocess.run(
        ["bash", str(DEPLOY_DIR / name), *args], text=True, capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"deploy/{name} {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr}"
        )

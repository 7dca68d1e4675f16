"""Whether a server certificate still fits: the CA signed it, its private key is its own,
its SANs cover the hosts asked for, and it (and its CA) do not expire within ``min_days``.
Read with the ``openssl`` command that deploy/make_certs.sh needs anyway."""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterable
from pathlib import Path

RENEW_DAYS = 30  # certificates expiring sooner than this are made again


def _openssl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", *args], text=True, capture_output=True, timeout=30,
                          check=False)


def _openssl_x509(cert: Path, *args: str) -> subprocess.CompletedProcess:
    return _openssl("x509", "-in", str(cert), "-noout", *args)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or proc.stdout).strip()
    return text.splitlines()[-1] if text else f"openssl exit {proc.returncode}"


def chain_problem(server_cert: Path, ca_cert: Path) -> str | None:
    """Why ``ca_cert`` does not verify ``server_cert`` (None: it signed it)."""
    proc = _openssl("verify", "-CAfile", str(ca_cert), str(server_cert))
    if proc.returncode == 0:
        return None
    return f"{ca_cert.name} does not verify {server_cert.name} ({_last_line(proc)})"


def key_problem(server_cert: Path, server_key: Path) -> str | None:
    """Why ``server_key`` is not the private key of ``server_cert`` (None: it is)."""
    cert_pub = _openssl_x509(server_cert, "-pubkey")
    key_pub = _openssl("pkey", "-in", str(server_key), "-pubout")
    if key_pub.returncode != 0:
        return f"cannot read {server_key.name} ({_last_line(key_pub)})"
    if cert_pub.returncode != 0 or cert_pub.stdout.strip() != key_pub.stdout.strip():
        return f"{server_key.name} is not the private key of {server_cert.name}"
    return None


def certificate_hosts(cert: Path) -> tuple[set[str], set[str]]:
    """(DNS names, IP addresses as text) in ``cert``'s subjectAltName; ValueError if
    ``cert`` is not a readable PEM certificate."""
    proc = _openssl_x509(cert, "-ext", "subjectAltName")
    if proc.returncode != 0:
        raise ValueError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip()
                         else f"openssl exit {proc.returncode}")
    names: set[str] = set()
    ips: set[str] = set()
    for line in proc.stdout.splitlines()[1:]:  # after "X509v3 Subject Alternative Name:"
        for entry in line.split(","):
            kind, _, value = entry.strip().partition(":")
            if kind == "DNS":
                names.add(value.lower())
            elif kind == "IP Address":
                ips.add(str(ipaddress.ip_address(value)))
    return names, ips


def host_covered(host: str, names: set[str], ips: set[str]) -> bool:
    """True if ``host`` (an address or a DNS name) is among the SANs."""
    try:
        return str(ipaddress.ip_address(host.strip("[]"))) in ips
    except ValueError:
        return host.lower() in names


def expiry_problem(cert: Path, min_days: int) -> str | None:
    """Why ``cert`` is too close to its end (None: valid for ``min_days`` more days)."""
    if _openssl_x509(cert, "-checkend", str(min_days * 86400)).returncode == 0:
        return None
    end = _openssl_x509(cert, "-enddate").stdout.strip().removeprefix("notAfter=")
    return f"{cert.name} expires {end}, within {min_days} days"


def certificate_problem(server_cert: Path, ca_cert: Path, hosts: Iterable[str],
                        min_days: int = RENEW_DAYS, server_key: Path | None = None) -> str | None:
    """Why the certificates must be made again (None: they fit): unreadable, not signed by
    the CA, ``server_key`` (when given) not the certificate's, SANs that miss a host, or
    an expiry within ``min_days``."""
    try:
        names, ips = certificate_hosts(server_cert)
        certificate_hosts(ca_cert)  # readable
    except (OSError, ValueError) as err:
        return f"cannot read {server_cert.name} / {ca_cert.name} ({err})"
    problem = chain_problem(server_cert, ca_cert) or (
        key_problem(server_cert, server_key) if server_key is not None else None)
    if problem:
        return problem
    missing = [h for h in hosts if not host_covered(h, names, ips)]
    if missing:
        return (f"{server_cert.name}'s SANs ({', '.join(sorted(names | ips))}) do not cover "
                f"{', '.join(missing)}")
    for cert in (server_cert, ca_cert):
        problem = expiry_problem(cert, min_days)
        if problem:
            return problem
    return None

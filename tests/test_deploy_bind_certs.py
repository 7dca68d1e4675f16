"""``deploy run``'s bind policy and certificate renewal (no processes but openssl)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deploy.__main__ import main
from deploy.bind_policy import bind_problem, insecure_remote_warning, is_loopback, needs_gateway
from deploy.cert_check import certificate_hosts, certificate_problem
from deploy.cluster import DeploySpec, LocalDeployment
from deploy.layout import Layout, ensure_certs

pytestmark = pytest.mark.usefixtures("deployment")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_loopback_hosts_need_nothing(host):
    assert is_loopback(host) and bind_problem(host, False, False, False) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "10.9.9.9", "superlink.example.org", "::"])
def test_non_loopback_host_needs_tls_and_auth(host):
    assert not is_loopback(host)
    for tls, auth in ((False, False), (True, False), (False, True)):
        problem = bind_problem(host, tls, auth, insecure_remote=False)
        assert f"host={host!r} (--host)" in problem and "--tls --auth" in problem
        assert "--insecure-remote" in problem
        assert bind_problem(host, tls, auth, insecure_remote=True) is None
        assert "WARNING (--insecure-remote)" in insecure_remote_warning(host, tls, auth)
    assert bind_problem(host, True, True, False) is None
    assert insecure_remote_warning(host, True, True) is None


def test_only_127_0_0_1_and_localhost_skip_the_fleet_gateway():
    assert not needs_gateway("127.0.0.1") and not needs_gateway("localhost")
    assert needs_gateway("127.0.0.2") and needs_gateway("0.0.0.0")


def test_deploy_run_refuses_a_public_bind_naming_the_flags(capsys, tmp_path):
    assert main(["run", "--host", "0.0.0.0", "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "host='0.0.0.0' (--host) is not a loopback address and --tls and --auth are off" in err
    assert main(["run", "--host", "10.9.9.9", "--tls", "--workdir", str(tmp_path)]) == 2
    assert "--auth is off" in capsys.readouterr().err
    assert not (tmp_path / "certificates").exists()  # refused before anything was made


def test_insecure_remote_is_accepted_by_the_spec():
    spec = DeploySpec(host="0.0.0.0", insecure_remote=True)
    assert LocalDeployment(spec, Layout(Path("/nonexistent"))).gateway
    with pytest.raises(ValueError, match="--insecure-remote"):
        DeploySpec(host="0.0.0.0")


def san_of(layout: Layout) -> set[str]:
    names, ips = certificate_hosts(layout.server_cert)
    return names | ips


@pytest.mark.timeout(300)
def test_certificates_are_made_again_when_their_sans_miss_a_host(tmp_path):
    layout = Layout(tmp_path)
    assert ensure_certs(layout, ("hostA",)) == "no certificates yet"
    first = layout.ca_cert.read_bytes()
    assert ensure_certs(layout, ("hostA",)) is None  # they fit: kept
    assert ensure_certs(layout, ()) is None
    assert layout.ca_cert.read_bytes() == first
    reason = ensure_certs(layout, ("10.9.9.9",))
    assert "do not cover 10.9.9.9" in reason
    assert "10.9.9.9" in san_of(layout) and layout.ca_cert.read_bytes() != first


def write_short_lived(layout: Layout, days: int) -> None:
    """A CA and a server certificate (SANs 127.0.0.1, localhost) valid for ``days`` more."""
    layout.certs.mkdir(parents=True)
    c = layout.certs

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(c / "ca.key"), "-out", str(layout.ca_cert), "-days", str(days),
            "-subj", "/CN=short-lived-ca")
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(layout.server_key), "-out", str(c / "server.csr"),
            "-subj", "/CN=localhost")
    (c / "ext.cnf").write_text("subjectAltName = DNS:localhost, IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", str(c / "server.csr"), "-CA", str(layout.ca_cert),
            "-CAkey", str(c / "ca.key"), "-CAcreateserial", "-days", str(days),
            "-extfile", str(c / "ext.cnf"), "-out", str(layout.server_cert))


@pytest.mark.timeout(300)
def test_certificates_are_made_again_when_near_expiry(tmp_path):
    layout = Layout(tmp_path)
    write_short_lived(layout, days=10)
    assert certificate_problem(layout.server_cert, layout.ca_cert, ["localhost"],
                               min_days=5) is None
    reason = ensure_certs(layout)
    assert "server.pem expires" in reason and "within 30 days" in reason
    assert certificate_problem(layout.server_cert, layout.ca_cert, ["127.0.0.1"],
                               min_days=300) is None  # make_certs.sh: 365 days


def test_an_unreadable_certificate_is_made_again(tmp_path):
    layout = Layout(tmp_path)
    layout.certs.mkdir()
    for path in (layout.ca_cert, layout.server_cert, layout.server_key):
        path.write_text("not a certificate")
    assert "cannot read" in certificate_problem(layout.server_cert, layout.ca_cert, [])


@pytest.mark.timeout(300)
def test_a_ca_that_did_not_sign_the_certificate_or_a_foreign_key_is_caught(tmp_path):
    """A ca.crt or server.key swapped for another deployment's passes the SAN and expiry
    checks; the chain and key checks catch it and ensure_certs makes the set again."""
    ours, theirs = Layout(tmp_path / "ours"), Layout(tmp_path / "theirs")
    write_short_lived(ours, days=100)
    write_short_lived(theirs, days=100)
    hosts = ["localhost"]
    assert certificate_problem(ours.server_cert, ours.ca_cert, hosts, 5, ours.server_key) is None
    problem = certificate_problem(ours.server_cert, theirs.ca_cert, hosts, 5, ours.server_key)
    assert problem.startswith("ca.crt does not verify server.pem")
    problem = certificate_problem(ours.server_cert, ours.ca_cert, hosts, 5, theirs.server_key)
    assert problem == "server.key is not the private key of server.pem"
    ours.server_key.write_bytes(theirs.server_key.read_bytes())
    assert ensure_certs(ours, (), min_days=5) == problem  # made again
    assert certificate_problem(ours.server_cert, ours.ca_cert, hosts, 5, ours.server_key) is None

"""The Fleet gateway checks before it reads (issue 57, item 3): a Fleet call without a valid
SuperNode signature, or with a body over the cap, is refused from its headers; connections
are bounded in number and in idle time.

Each gateway is ``python -m deploy.fleet_gateway`` with TLS, the deployment's certificates
and keys (``deploy/make_certs.sh``, ``deploy/make_keys.sh``), forwarding to a fake SuperLink
(an HTTPS server in this process that answers 200 with the sha256 of the body it got), all
on 127.0.0.1 with free ports; the auth headers come from Flower's own SuperNode code
(``NodeAuthHttpInterceptor``). Memory and threads are the gateway process's
``/proc/<pid>/status`` VmRSS and Threads.
"""

from __future__ import annotations

import datetime
import hashlib
import http.client
import os
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
from base64 import b64encode
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common import constant as flwr_constant
from flwr.proto.fleet_pb2 import PushMessagesRequest  # pylint: disable=E0611
from flwr.supercore import constant as flwr_supercore_constant
from flwr.supercore.primitives.asymmetric import public_key_to_bytes, sign_message
from flwr.supercore.protobuf.client import ProtobufRequestContext
from flwr.supercore.protobuf.translation import PROTOBUF_REQUEST_TYPES
from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

from deploy import fleet_auth as auth
from deploy import fleet_gateway as gw
from deploy.layout import Layout, ensure_certs, ensure_keys
from simulation.runtime import PROJECT_ROOT, free_port

PUSH = "/v1/fleet/push-messages"
MiB = 2**20


# --- what a Flower 1.42 SuperNode sends ------------------------------------------------------

def flower_headers(private_key: ec.EllipticCurvePrivateKey) -> dict[str, str]:
    """The auth headers Flower's SuperNode puts on a Fleet call (its own interceptor)."""
    request = httpx.Request("POST", f"https://gateway{PUSH}")
    context = ProtobufRequestContext("/flwr.proto.Fleet/PushMessages", PushMessagesRequest(),
                                     request)
    NodeAuthHttpInterceptor(private_key, private_key.public_key()).intercept(
        context, lambda ctx: ctx.request)
    return {name: request.headers[name]
            for name in (auth.PUBLIC_KEY_HEADER, auth.TIMESTAMP_HEADER, auth.SIGNATURE_HEADER)}


def signed_at(private_key: ec.EllipticCurvePrivateKey, seconds_ago: float) -> dict[str, str]:
    """Flower's headers, but for a timestamp ``seconds_ago`` (negative: in the future)."""
    stamp = (datetime.datetime.now(datetime.UTC)
             - datetime.timedelta(seconds=seconds_ago)).isoformat()
    return {auth.PUBLIC_KEY_HEADER: b64encode(public_key_to_bytes(private_key.public_key()))
            .decode(), auth.TIMESTAMP_HEADER: stamp,
            auth.SIGNATURE_HEADER: b64encode(sign_message(private_key, stamp.encode())).decode()}


def as_message(headers: dict[str, str]) -> Message:
    message = Message()
    for name, value in headers.items():
        message[name] = value
    return message


# --- unit: the gateway's check is Flower's ----------------------------------------------------

def test_header_names_window_and_calls_are_flowers():
    assert auth.PUBLIC_KEY_HEADER == flwr_supercore_constant.FLEET_HTTP_PUBLIC_KEY_HEADER
    assert auth.SIGNATURE_HEADER == flwr_supercore_constant.FLEET_HTTP_SIGNATURE_HEADER
    assert auth.TIMESTAMP_HEADER == flwr_constant.TIMESTAMP_HEADER
    assert auth.MIN_AGE_S == flwr_supercore_constant.MIN_TIMESTAMP_DIFF_SECONDS
    assert auth.MAX_AGE_S == flwr_supercore_constant.MAX_TIMESTAMP_DIFF_SECONDS
    assert gw.FLEET_CALLS == {path for method, path in PROTOBUF_REQUEST_TYPES
                              if method == "POST" and path.startswith(gw.FLEET_PREFIX)}


def test_flowers_signature_is_accepted_and_every_tampering_refused(tmp_path):
    key = ec.generate_private_key(ec.SECP384R1())
    (tmp_path / "node.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    authorized = auth.AuthorizedKeys([tmp_path])
    good = flower_headers(key)
    assert auth.auth_problem(as_message(good), authorized) is None
    assert auth.auth_problem(as_message(good), None) is None
    stranger = flower_headers(ec.generate_private_key(ec.SECP384R1()))
    assert "not one of the authorised" in auth.auth_problem(as_message(stranger), authorized)
    assert auth.auth_problem(as_message(stranger), None) is None  # any key without --auth
    forged = {**good, auth.SIGNATURE_HEADER: signed_at(key, 60)[auth.SIGNATURE_HEADER]}
    assert "not the key's signature" in auth.auth_problem(as_message(forged), authorized)
    for seconds_ago in (306, -6):
        problem = auth.auth_problem(as_message(signed_at(key, seconds_ago)), authorized)
        assert "outside (-5, 305)" in problem, problem
    assert auth.auth_problem(as_message(signed_at(key, 290)), authorized) is None
    for name in good:
        problem = auth.auth_problem(as_message({k: v for k, v in good.items() if k != name}),
                                  authorized)
        assert f"send one {name} header (got 0)" == problem
    doubled = as_message(good)
    doubled[auth.PUBLIC_KEY_HEADER] = stranger[auth.PUBLIC_KEY_HEADER]
    assert "(got 2)" in auth.auth_problem(doubled, authorized)
    assert "malformed" in auth.auth_problem(
        as_message({**good, auth.PUBLIC_KEY_HEADER: "not base64!"}), authorized)


# --- the gateway process, a fake SuperLink, the deployment's certificates and keys -----------

@pytest.fixture(scope="module")
def pki(processes, tmp_path_factory) -> Layout:
    """CA, server certificate (127.0.0.1) and one SuperNode key pair, made as deploy does."""
    layout = Layout(tmp_path_factory.mktemp("gateway-limits"))
    ensure_certs(layout)
    ensure_keys(layout, 1)
    return layout


def node_key(layout: Layout) -> ec.EllipticCurvePrivateKey:
    """SuperNode 0's private key (OpenSSH, as make_keys.sh writes it)."""
    return serialization.load_ssh_private_key(layout.private_key(0).read_bytes(), None)


class FakeSuperLink(BaseHTTPRequestHandler):
    """Answers every POST with 200 and the sha256 of its body; records what it got."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, dict[str, str], str]] = []

    def do_POST(self) -> None:  # noqa: N802
        digest = hashlib.sha256(self.rfile.read(int(self.headers["Content-Length"]))).hexdigest()
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, digest))
        self.send_response(200)
        self.send_header("Content-Length", str(len(digest)))
        self.end_headers()
        self.wfile.write(digest.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def superlink(pki) -> Iterator[list]:
    """The fake SuperLink on 127.0.0.1 with the deployment's server certificate; yields the
    list of requests it received."""
    handler = type("Handler", (FakeSuperLink,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.port = server.server_address[1]
    yield handler
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@dataclass
class Gateway:
    proc: subprocess.Popen
    port: int
    ca: Path

    def status(self, field: str) -> int:
        """VmRSS (kB) or Threads of the gateway process."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    def tls(self, timeout: float = 5.0) -> ssl.SSLSocket:
        """A TLS connection to the gateway, as a SuperNode holding ca.crt opens one."""
        context = ssl.create_default_context(cafile=str(self.ca))
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return context.wrap_socket(raw, server_hostname="127.0.0.1")

    def https(self, timeout: float = 5.0) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=str(self.ca))
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=context,
                                           timeout=timeout)


@pytest.fixture
def gateway(pki, superlink, tmp_path) -> Iterator[Callable[..., Gateway]]:
    """Starts ``python -m deploy.fleet_gateway`` with TLS and the given extra flags; stops
    each by PID."""
    started: list[subprocess.Popen] = []

    def start(*flags: str) -> Gateway:
        port = free_port()
        argv = [sys.executable, "-m", "deploy.fleet_gateway", "--host", "127.0.0.1",
                "--port", str(port), "--superlink", f"127.0.0.1:{superlink.port}",
                "--ssl-certfile", str(pki.server_cert), "--ssl-keyfile", str(pki.server_key),
                "--ssl-ca-certfile", str(pki.ca_cert), *flags]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, (str(PROJECT_ROOT), os.environ.get("PYTHONPATH"))))}
        log = open(tmp_path / f"gateway-{port}.log", "wb")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen(argv, cwd=PROJECT_ROOT, env=env, stdout=log, stderr=log)
        log.close()
        started.append(proc)
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, (tmp_path / f"gateway-{port}.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return Gateway(proc, port, pki.ca_cert)
            except OSError:
                assert time.monotonic() < deadline, "the gateway did not listen within 20 s"
                time.sleep(0.05)

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def head_only(gateway: Gateway, headers: dict[str, str], length: int,
              path: str = PUSH) -> tuple[int, bytes, float]:
    """Send a POST's line and headers (Content-Length ``length``) but none of its body; the
    status and text of the reply, and how long it took. A gateway that waits for the body
    answers nothing: the read times out (3 s)."""
    conn = gateway.https(timeout=3)
    try:
        start = time.monotonic()
        conn.putrequest("POST", path)
        for name, value in {"Content-Type": "application/protobuf", **headers}.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        reply = conn.getresponse()
        return reply.status, reply.read(), time.monotonic() - start
    finally:
        conn.close()


def post(gateway: Gateway, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    conn = gateway.https(timeout=10)
    try:
        conn.request("POST", PUSH, body=body,
                     headers={"Content-Type": "application/protobuf", **headers})
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


# --- (a) memory: a 2 GB body claimed, no key --------------------------------------------------

@pytest.mark.timeout(60)
def test_an_unauthenticated_2_gb_post_is_refused_without_reading_it(gateway, pki):
    gate = gateway("--authorized-keys", str(pki.keys))
    warm = gate.https()  # the first connection's thread and imports: before the baseline
    warm.request("GET", "/docs")
    assert warm.getresponse().status == 403
    warm.close()
    before = gate.status("VmRSS")
    sock = gate.tls(timeout=5)
    start = time.monotonic()
    sent, chunk = 0, b"\0" * MiB
    try:
        sock.sendall(f"POST {PUSH} HTTP/1.1\r\nHost: gateway\r\n"
                     "Content-Length: 2000000000\r\n\r\n".encode())
        while sent < 64 * MiB:
            sock.sendall(chunk)
            sent += len(chunk)
    except OSError:  # the gateway closed the connection: expected, long before 64 MiB
        pass
    try:
        status_line = sock.recv(100).split(b"\r\n")[0]
    except OSError as err:  # a gateway still waiting for the 2 GB: the read times out
        status_line = repr(err).encode()
    finally:
        sock.close()
    elapsed = time.monotonic() - start
    time.sleep(0.3)
    grown_kb = gate.status("VmRSS") - before
    assert grown_kb < 8 * 1024, f"the gateway's RSS grew by {grown_kb} kB ({sent} bytes sent)"
    assert status_line == b"HTTP/1.1 401 Unauthorized", status_line
    assert elapsed < 5 and sent < 32 * MiB, (elapsed, sent)


# --- (b) threads: idle connections that never start TLS ---------------------------------------

def closed_by_peer(sock: socket.socket) -> bool:
    """True when the gateway closed ``sock`` (EOF or reset), without waiting."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except OSError:
        return True


@pytest.mark.timeout(60)
def test_idle_connections_are_bounded_and_closed_while_a_supernode_gets_through(
        gateway, pki, superlink):
    limit, idle_timeout = 16, 1.0
    gate = gateway("--authorized-keys", str(pki.keys), "--max-connections", str(limit),
                   "--idle-timeout", str(idle_timeout))
    idle = [socket.create_connection(("127.0.0.1", gate.port), timeout=5) for _ in range(100)]
    try:
        time.sleep(0.3)
        threads = gate.status("Threads")
        assert threads <= limit + 2, f"{threads} threads for 100 idle connections"
        assert sum(map(closed_by_peer, idle)) >= 100 - limit  # the excess: closed at once
        body = b"fleet call"
        start, outcome = time.monotonic(), None
        while outcome is None or outcome[0] != 200:  # a SuperNode retrying, as Flower's does
            assert time.monotonic() - start < idle_timeout + 4, f"never got through: {outcome}"
            try:
                outcome = post(gate, flower_headers(node_key(pki)), body)
            except (OSError, http.client.HTTPException) as err:
                outcome = (0, repr(err).encode())
                time.sleep(0.1)
        assert outcome == (200, hashlib.sha256(body).hexdigest().encode())
        deadline = time.monotonic() + idle_timeout + 3
        while not all(map(closed_by_peer, idle)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(map(closed_by_peer, idle)), "idle connections outlived the idle timeout"
        assert gate.status("Threads") <= 2
    finally:
        for sock in idle:
            sock.close()


# --- (c) SuperNode signatures, checked before the body ---------------------------------------

@pytest.mark.timeout(60)
def test_signed_calls_are_forwarded_and_bad_ones_refused_before_their_body(
        gateway, pki, superlink):
    gate = gateway("--authorized-keys", str(pki.keys), "--max-body-bytes", str(4 * MiB))
    key = node_key(pki)
    body, signed = os.urandom(3 * MiB), flower_headers(key)  # read in 1 MiB chunks
    assert post(gate, signed, body) == (200, hashlib.sha256(body).hexdigest().encode())
    path, headers, _ = superlink.seen[-1]
    assert path == PUSH and {name: headers[name] for name in signed} == signed  # as sent

    stranger = ec.generate_private_key(ec.SECP384R1())
    forged = {**flower_headers(key), auth.SIGNATURE_HEADER: signed_at(key, 30)[
        auth.SIGNATURE_HEADER]}
    refused = {
        "no headers": ({}, 401, b"send one flwr-public-key header"),
        "unknown key": (flower_headers(stranger), 401, b"not one of the authorised"),
        "bad signature": (forged, 401, b"not the key's signature"),
        "stale timestamp": (signed_at(key, 400), 401, b"outside (-5, 305)"),
        "over the cap": (flower_headers(key), 413, b"--max-body-bytes"),
    }
    forwarded = len(superlink.seen)
    for case, (headers, status, text) in refused.items():
        length = 4 * MiB + 1 if case == "over the cap" else 2 * MiB
        got, reply, seconds = head_only(gate, headers, length)
        assert (got, text in reply) == (status, True), (case, got, reply)
        assert seconds < 2, (case, seconds)
    assert head_only(gate, flower_headers(key), 0, "/v1/fleet/list-runs")[0] == 404
    assert len(superlink.seen) == forwarded  # none of them reached the SuperLink

"""``python -m deploy.fleet_gateway``: the Fleet API of a SuperLink, and nothing else, on a
public address.

Flower 1.42's SuperLink serves its Fleet API (SuperNodes), Control API (``flwr run``,
``flwr ls``, ``flwr supernode register``) and Runtime API (the ServerApp's SuperExec) on one
``--host``/``--port`` (``flwr/superlink/main.py``, ``create_app``: one FastAPI app with the
three routers; ``--fleet-api-address`` and ``--control-api-address`` are deprecated), and its
open-source build has no account authentication for the Control API
(``flwr/superlink/config_loader.py``, ``load_control_authn_plugin``: OIDC only with Flower
Enterprise). Whoever reaches that port can list runs, register SuperNode keys and start runs.

So the SuperLink binds 127.0.0.1 only, and this gateway listens on the public address with
the same TLS certificate. It forwards ``POST /v1/fleet/<call>`` for Flower's twelve Fleet
calls (every request a stock SuperNode makes: ``flwr/supernode/fleet_http_client.py``) with
their headers, and answers everything else, the Control and Runtime APIs included, with 403.

It checks before it reads. From the headers alone, a Fleet call must carry Flower's
SuperNode signature (a public key, a timestamp within Flower's window and the key's ECDSA
signature of it: what the SuperLink's ``NodeAuthMiddleware`` demands of every Fleet call,
with or without ``--enable-supernode-auth``), made with one of the ``--authorized-keys``
when given (``deploy run --auth`` gives the SuperNodes' ``*.pub``), else 401; its
Content-Length must be at most ``--max-body-bytes``, else 413. Only then is the body read,
in bounded chunks, within the request timeout. At most ``--max-connections`` connections
are served at once (more are closed at once), and a connection that has not finished its
TLS handshake or a request's headers within ``--idle-timeout`` seconds is closed.
Standard library, and ``cryptography`` (Flower's own dependency) for the signatures.
docs/deployment.md, "Threat model", says what it closes and what it does not.
"""

from __future__ import annotations

import argparse
import http.client
import io
import logging
import math
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from .fleet_auth import AuthorizedKeys, auth_problem

FLEET_PREFIX = "/v1/fleet/"  # Flower 1.42's Fleet router (flwr/superlink/routers/fleet/router.py)
# the Fleet calls the SuperLink parses and authenticates (flwr/supercore/protobuf/
# translation.py, PROTOBUF_REQUEST_TYPES); any other /v1/fleet/ path is a 404 there
FLEET_CALLS = frozenset(FLEET_PREFIX + call for call in (
    "register-node", "activate-node", "deactivate-node", "unregister-node",
    "send-node-heartbeat", "pull-messages", "push-messages", "get-run", "get-fab",
    "push-object", "pull-object", "confirm-message-received",
))
# headers that describe one hop, not the request: never forwarded in either direction
HOP_HEADERS = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
})
TIMEOUT = 300.0  # seconds for one request, either side (the largest: a model's arrays)
LOG = logging.getLogger("fleet_gateway")

# Defaults of the limits (flags of the same names). Flower 1.42 sends a model's arrays in
# chunks of at most FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE = 5 MiB, one push-object call each
# (flwr/app/message/array.py), so a Fleet call's body is a few MiB whatever the model's
# size; 64 MiB leaves room for a large ConfigRecord and bounds what one connection may make
# the gateway hold (at most MAX_CONNECTIONS x MAX_BODY_BYTES in all).
MAX_BODY_BYTES = 64 * 2**20
MAX_CONNECTIONS = 64
IDLE_TIMEOUT = 10.0  # TLS handshake, and a request's line and headers (httpx keeps idle 5 s)
MAX_HEADER_BYTES = 64 * 1024  # a request line and headers (a SuperNode's: under 2 KiB)
BODY_CHUNK = 2**20  # the body is read this much at a time
DRAIN_BYTES = 2**20  # after a refusal, at most this much of what the client sent is discarded
DRAIN_SECONDS = 1.0  # ... for at most this long, so it reads the refusal rather than a reset


@dataclass(frozen=True)
class Limits:
    """What one client may make the gateway hold, and for how long."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_connections: int = MAX_CONNECTIONS
    idle_timeout: float = IDLE_TIMEOUT


def is_fleet_request(method: str, target: str) -> bool:
    """True for the requests a SuperNode makes (``POST /v1/fleet/<call>``), False otherwise."""
    path = urlsplit(target).path
    return method == "POST" and path.startswith(FLEET_PREFIX) and ".." not in path


def refusal(method: str, target: str) -> str:
    """The 403 body: what was refused and where the refused APIs are."""
    return (f"{method} {target} refused: this address serves Flower's Fleet API (SuperNodes) "
            "only. The Control API (flwr run / ls / supernode register) and the Runtime API "
            "are on the SuperLink host's loopback address; use the flwr CLI there (or through "
            "an SSH tunnel).\n")


def kept_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` without the hop-by-hop ones (:data:`HOP_HEADERS`)."""
    return [(k, v) for k, v in headers if k.lower() not in HOP_HEADERS]


def declared_length(headers: Message) -> int | None:
    """The request's Content-Length (0 when absent); None when it is not one whole number."""
    values = headers.get_all("Content-Length") or ["0"]
    text = values[0].strip()
    if len(values) != 1 or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


class HeadersTooLarge(OSError):
    """A request line and headers longer than :data:`MAX_HEADER_BYTES`."""


class DeadlineReader(io.RawIOBase):
    """A socket's reads, each limited to the time left until ``deadline`` and, while a
    request's headers are read, to ``budget`` bytes in all."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self.deadline = math.inf
        self.budget = math.inf

    def expect_headers(self, seconds: float, max_bytes: int) -> None:
        """The next request's line and headers: within ``seconds``, ``max_bytes``."""
        self.deadline = time.monotonic() + seconds
        self.budget = max_bytes + io.DEFAULT_BUFFER_SIZE  # + what the buffer reads ahead

    def expect_body(self, seconds: float) -> None:
        """An accepted request's body: within ``seconds``, no byte budget (its length is)."""
        self.deadline = time.monotonic() + seconds
        self.budget = math.inf

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client took too long")
        if self.budget <= 0:
            raise HeadersTooLarge(f"request line and headers over {MAX_HEADER_BYTES} bytes")
        self.sock.settimeout(left)
        view = memoryview(buffer)
        got = self.sock.recv_into(view[:int(min(len(view), self.budget))])
        self.budget -= got
        return got


class FleetHandler(BaseHTTPRequestHandler):
    """One client connection: Fleet calls forwarded over one kept upstream connection."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Flower's httpx client expects
    timeout = IDLE_TIMEOUT  # the socket's until the handshake is done (serve sets it)
    limits = Limits()
    authorized: AuthorizedKeys | None = None
    upstream_host = "127.0.0.1"
    upstream_port = 0
    upstream_tls: ssl.SSLContext | None = None
    _upstream: http.client.HTTPConnection | None = None

    def setup(self) -> None:
        super().setup()
        self.reader = DeadlineReader(self.connection)
        self.rfile.close()  # the socket's own reader: replaced by a deadline-bound one
        self.rfile = io.BufferedReader(self.reader)

    def handle(self) -> None:
        """The TLS handshake, then requests until one closes the connection; a client that
        is too slow, sends too much or drops the connection is only logged (debug)."""
        try:
            if isinstance(self.connection, ssl.SSLSocket):
                self.connection.do_handshake()  # bounded by the idle timeout
            super().handle()
        except OSError as err:  # TimeoutError, ssl.SSLError, resets, HeadersTooLarge
            LOG.debug("closed the connection from %s: %r", self.client_address[0], err)
            self.close_connection = True

    def handle_one_request(self) -> None:
        self.reader.expect_headers(self.limits.idle_timeout, MAX_HEADER_BYTES)
        super().handle_one_request()

    def _connection(self) -> http.client.HTTPConnection:
        if self._upstream is None:
            if self.upstream_tls is None:
                self._upstream = http.client.HTTPConnection(
                    self.upstream_host, self.upstream_port, timeout=TIMEOUT)
            else:
                self._upstream = http.client.HTTPSConnection(
                    self.upstream_host, self.upstream_port, timeout=TIMEOUT,
                    context=self.upstream_tls)
        return self._upstream

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _refuse(self, status: int, text: str) -> None:
        LOG.warning("refused %s %s from %s (%d): %s", self.command, self.path[:200],
                    self.client_address[0], status, text.strip()[:200])
        self.close_connection = True
        self.connection.settimeout(self.limits.idle_timeout)
        self._reply(status, [("Content-Type", "text/plain; charset=utf-8")], text.encode())
        self._close_gently()

    def handle_expect_100(self) -> bool:
        """``Expect: 100-continue``: "continue" only for a request that is not refused."""
        problem = self._problem()
        if problem:
            self._refuse(*problem)
            return False
        return super().handle_expect_100()

    def _close_gently(self) -> None:
        """Half-close, then discard what the client had already sent (at most DRAIN_BYTES
        within DRAIN_SECONDS, nothing kept): it reads the refusal rather than a reset."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            deadline, drained = time.monotonic() + DRAIN_SECONDS, 0
            while drained < DRAIN_BYTES and (left := deadline - time.monotonic()) > 0:
                self.connection.settimeout(left)
                chunk = self.connection.recv(64 * 1024)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass

    def _problem(self) -> tuple[int, str] | None:
        """The status and text that refuse this request, from its line and headers; None
        when it is a Fleet call to forward."""
        if not is_fleet_request(self.command, self.path):
            return 403, refusal(self.command, self.path)
        path = urlsplit(self.path).path
        if path not in FLEET_CALLS:
            return 404, f"{path} is not a Fleet call of Flower 1.42\n"
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return 411, "send a Content-Length (chunked requests are not forwarded)\n"
        length = declared_length(self.headers)
        if length is None:
            return 400, "send one Content-Length: a whole number of bytes\n"
        problem = auth_problem(self.headers, self.authorized)
        if problem:
            return 401, f"SuperNode authentication failed: {problem}\n"
        if length > self.limits.max_body_bytes:
            return 413, (f"a body of {length} bytes is over this gateway's limit of "
                         f"{self.limits.max_body_bytes} bytes (its --max-body-bytes)\n")
        return None

    def _read_body(self, length: int) -> bytearray:
        """``length`` bytes of body, BODY_CHUNK at a time, within the request timeout."""
        self.reader.expect_body(TIMEOUT)
        body = bytearray(length)
        view, done = memoryview(body), 0
        while done < length:
            got = self.rfile.readinto(view[done:done + BODY_CHUNK])
            if not got:
                raise ConnectionError(f"the client closed after {done} of {length} body bytes")
            done += got
        return body

    def _forward(self) -> None:
        problem = self._problem()
        if problem:
            self._refuse(*problem)
            return
        body = self._read_body(declared_length(self.headers) or 0)
        headers = dict(kept_headers(list(self.headers.items())))
        for attempt in (1, 2):  # a kept connection the SuperLink closed: once more, fresh
            conn = self._connection()
            try:
                conn.request("POST", self.path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                break
            except (http.client.HTTPException, OSError) as err:
                conn.close()
                self._upstream = None
                if attempt == 2:
                    LOG.error("SuperLink %s:%s unreachable for %s (%s)", self.upstream_host,
                              self.upstream_port, self.path, err)
                    self._reply(502, [("Content-Type", "text/plain")],
                                b"the SuperLink behind this gateway does not answer\n")
                    return
        self.connection.settimeout(TIMEOUT)
        self._reply(reply.status, kept_headers(reply.getheaders()), data)

    do_POST = _forward

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._refuse(403, refusal(self.command, self.path))

    do_HEAD = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_GET

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """No access log (one line per SuperNode call); refusals and errors are logged."""

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:  # the client is gone: nothing left to flush to it
            pass
        if self._upstream is not None:
            self._upstream.close()


class FleetServer(ThreadingHTTPServer):
    """One thread per connection, at most ``max_connections`` of them: a connection beyond
    is closed as soon as it is accepted (counted, and logged at most every 10 s)."""

    request_queue_size = 128  # a burst of SuperNodes (re)connecting waits, is not dropped
    max_connections = MAX_CONNECTIONS

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._turned_away, self._logged_at = 0, -math.inf

    def process_request(self, request, client_address) -> None:  # noqa: ANN001 (socketserver's)
        if not self._slots.acquire(blocking=False):
            self._turn_away()
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:  # noqa: ANN001
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _turn_away(self) -> None:
        self._turned_away += 1
        if time.monotonic() - self._logged_at >= 10.0:
            LOG.warning("%d connection(s) closed at once: %d already open (--max-connections)",
                        self._turned_away, self.max_connections)
            self._turned_away, self._logged_at = 0, time.monotonic()

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        """A connection's unexpected error: one line, with its traceback at debug level."""
        LOG.error("connection from %s failed: %r", client_address[0], sys.exc_info()[1])
        LOG.debug("traceback", exc_info=True)


def serve(host: str, port: int, superlink: str, tls: tuple[str, str, str] | None,
          limits: Limits = Limits(), authorized: AuthorizedKeys | None = None,
          ) -> ThreadingHTTPServer:
    """The gateway's server, bound and ready for ``serve_forever`` (``tls``: cert, key, CA;
    ``authorized``: the SuperNode keys accepted, None for any correctly signed one)."""
    upstream_host, upstream_port = superlink.rsplit(":", 1)
    handler = type("Handler", (FleetHandler,), {
        "upstream_host": upstream_host.strip("[]"), "upstream_port": int(upstream_port),
        "upstream_tls": None if tls is None else ssl.create_default_context(cafile=tls[2]),
        "timeout": limits.idle_timeout, "limits": limits, "authorized": authorized,
    })
    attributes: dict[str, object] = {"max_connections": limits.max_connections}
    if ":" in host:
        attributes["address_family"] = socket.AF_INET6
    server = type("Server", (FleetServer,), attributes)((host.strip("[]"), port), handler)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(tls[0], tls[1])
        # the handshake happens in each connection's thread, not in the accepting one
        server.socket = context.wrap_socket(server.socket, server_side=True,
                                            do_handshake_on_connect=False)
    return server


def positive(kind: type) -> object:
    """An argparse type: ``kind`` of the text, refused unless > 0."""
    def parse(text: str) -> object:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r}: give a number > 0")
        return value
    parse.__name__ = kind.__name__
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The gateway's options (``--insecure`` or all three TLS files)."""
    parser = argparse.ArgumentParser(prog="python -m deploy.fleet_gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", required=True, help="public address to listen on")
    parser.add_argument("--port", type=int, required=True, help="public port (SuperNodes')")
    parser.add_argument("--superlink", required=True,
                        help="the SuperLink's loopback HOST:PORT, e.g. 127.0.0.1:9093")
    parser.add_argument("--insecure", action="store_true", help="plain HTTP both ways")
    parser.add_argument("--ssl-certfile", help="server certificate (the SuperLink's)")
    parser.add_argument("--ssl-keyfile", help="its private key")
    parser.add_argument("--ssl-ca-certfile", help="CA that signed the SuperLink's certificate")
    parser.add_argument("--authorized-keys", action="append", default=[], metavar="PATH",
                        help="a SuperNode public key (OpenSSH .pub or PEM) or a folder of "
                             "*.pub, repeatable: Fleet calls signed with another key get 401 "
                             "(the ones the SuperLink's --enable-supernode-auth registers; "
                             "default: any key, correctly signed)")
    parser.add_argument("--max-body-bytes", type=positive(int), default=MAX_BODY_BYTES,
                        help="largest request body; a larger Content-Length gets 413 unread "
                             f"(default {MAX_BODY_BYTES}: Flower sends arrays in 5 MiB chunks)")
    parser.add_argument("--max-connections", type=positive(int), default=MAX_CONNECTIONS,
                        help="connections served at once; more are closed at once "
                             f"(default {MAX_CONNECTIONS})")
    parser.add_argument("--idle-timeout", type=positive(float), default=IDLE_TIMEOUT,
                        help="seconds for the TLS handshake and for a request's line and "
                             "headers, kept-alive waits included; forwarding a request has "
                             f"{TIMEOUT:g} s (default {IDLE_TIMEOUT:g})")
    args = parser.parse_args(argv)
    tls_files = (args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certfile)
    if not args.insecure and not all(tls_files):
        parser.error("give --ssl-certfile, --ssl-keyfile and --ssl-ca-certfile (the "
                     "SuperLink's), or --insecure for plain HTTP")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    tls = None if args.insecure else (args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certfile)
    try:
        authorized = AuthorizedKeys(args.authorized_keys) if args.authorized_keys else None
    except ValueError as err:
        print(f"--authorized-keys: {err}", file=sys.stderr)
        return 2
    limits = Limits(args.max_body_bytes, args.max_connections, args.idle_timeout)
    server = serve(args.host, args.port, args.superlink, tls, limits, authorized)
    LOG.info("Fleet API only on %s:%s -> %s (%s; %s; bodies <= %d bytes, <= %d connections, "
             "%g s idle)", args.host, args.port, args.superlink,
             "plain HTTP" if tls is None else "TLS",
             "any signed SuperNode key" if authorized is None
             else f"{len(authorized)} authorised SuperNode keys",
             limits.max_body_bytes, limits.max_connections, limits.idle_timeout)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

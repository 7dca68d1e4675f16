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
the same TLS certificate. It forwards ``POST /v1/fleet/*`` (every request a stock SuperNode
makes: ``flwr/supernode/fleet_http_client.py``) with its headers, so Flower's SuperNode
authentication (a signed timestamp in the headers) works unchanged, and answers everything
else, the Control and Runtime APIs included, with 403. Standard library only.
docs/deployment.md, "Threat model", says what it closes and what it does not.
"""

from __future__ import annotations

import argparse
import http.client
import logging
import socket
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FLEET_PREFIX = "/v1/fleet/"  # Flower 1.42's Fleet router (flwr/superlink/routers/fleet/router.py)
# headers that describe one hop, not the request: never forwarded in either direction
HOP_HEADERS = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
})
TIMEOUT = 300.0  # seconds for one request, either side (the largest: a model's arrays)
LOG = logging.getLogger("fleet_gateway")


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


class FleetHandler(BaseHTTPRequestHandler):
    """One client connection: Fleet calls forwarded over one kept upstream connection."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Flower's httpx client expects
    timeout = TIMEOUT
    upstream_host = "127.0.0.1"
    upstream_port = 0
    upstream_tls: ssl.SSLContext | None = None
    _upstream: http.client.HTTPConnection | None = None

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
        LOG.warning("refused %s %s from %s (%d)", self.command, self.path,
                    self.client_address[0], status)
        self.close_connection = True
        self._reply(status, [("Content-Type", "text/plain; charset=utf-8")], text.encode())

    def _forward(self) -> None:
        if not is_fleet_request(self.command, self.path):
            self._refuse(403, refusal(self.command, self.path))
            return
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._refuse(411, "send a Content-Length (chunked requests are not forwarded)\n")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
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
        self._reply(reply.status, kept_headers(reply.getheaders()), data)

    do_POST = _forward

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._refuse(403, refusal(self.command, self.path))

    do_HEAD = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_GET

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """No access log (one line per SuperNode call); refusals and errors are logged."""

    def finish(self) -> None:
        super().finish()
        if self._upstream is not None:
            self._upstream.close()


def serve(host: str, port: int, superlink: str, tls: tuple[str, str, str] | None
          ) -> ThreadingHTTPServer:
    """The gateway's server, bound and ready for ``serve_forever`` (``tls``: cert, key, CA)."""
    upstream_host, upstream_port = superlink.rsplit(":", 1)
    handler = type("Handler", (FleetHandler,), {
        "upstream_host": upstream_host.strip("[]"), "upstream_port": int(upstream_port),
        "upstream_tls": None if tls is None else ssl.create_default_context(cafile=tls[2]),
    })
    server_class = ThreadingHTTPServer
    if ":" in host:
        server_class = type("Server6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
    server = server_class((host.strip("[]"), port), handler)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(tls[0], tls[1])
        # the handshake happens in each connection's thread, not in the accepting one
        server.socket = context.wrap_socket(server.socket, server_side=True,
                                            do_handshake_on_connect=False)
    return server


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
    server = serve(args.host, args.port, args.superlink, tls)
    LOG.info("Fleet API only on %s:%s -> %s (%s)", args.host, args.port, args.superlink,
             "plain HTTP" if tls is None else "TLS")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which SuperLink addresses ``deploy`` serves, and on what conditions.

Flower 1.42's SuperLink serves its Fleet, Control and Runtime APIs on one port, and the
Control API has no user authentication in the open-source build (deploy/fleet_gateway.py).
So the SuperLink itself always binds :data:`ADMIN_HOST`; any other ``--host`` gets the Fleet
API only, through the gateway, and only with TLS and SuperNode authentication unless the user
says ``--insecure-remote``.
"""

from __future__ import annotations

import ipaddress

ADMIN_HOST = "127.0.0.1"  # the SuperLink's own bind: Control + Runtime + Fleet
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})  # served by the SuperLink directly


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and every loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def needs_gateway(host: str) -> bool:
    """True when SuperNodes reach the SuperLink on ``host`` through the Fleet-only gateway."""
    return host not in LOCAL_HOSTS


def _missing(tls: bool, auth: bool, names: tuple[str, str]) -> str:
    return " and ".join(name for name, on in zip(names, (tls, auth)) if not on)


def bind_problem(host: str, tls: bool, auth: bool, insecure_remote: bool) -> str | None:
    """Why binding ``host`` is refused (None: allowed). A non-loopback address needs TLS and
    SuperNode authentication, or ``insecure_remote``."""
    if is_loopback(host) or (tls and auth) or insecure_remote:
        return None
    missing = _missing(tls, auth, ("--tls", "--auth"))
    return (f"host={host!r} (--host) is not a loopback address and {missing} "
            f"{'are' if ' and ' in missing else 'is'} off: anyone who reaches it could "
            "join as a SuperNode, receive the global model and send updates. Add --tls --auth "
            "(certificates and SuperNode keys are made in --workdir), or --insecure-remote to "
            "accept that on a network you trust")


def insecure_remote_warning(host: str, tls: bool, auth: bool) -> str | None:
    """The banner for a non-loopback bind without TLS + auth (None when there is no risk)."""
    if is_loopback(host) or (tls and auth):
        return None
    return (f"WARNING (--insecure-remote): the Fleet API on {host} runs without "
            f"{_missing(tls, auth, ('TLS', 'SuperNode authentication'))}: any host that "
            "reaches it can join as a SuperNode, receive the global model and send updates"
            f"{'' if tls else ', and anyone on the path can read and change the traffic'}")

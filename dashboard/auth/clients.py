"""Who is asking, and by what name: the Host a request names, the client's address, https.

- `host_answered`: in the open loopback mode the dashboard answers only a request whose Host
  header is a loopback name (`localhost`, `127.x.x.x`, `[::1]`, any port), the name it was
  told to listen on, or the host of TRAINDECK_PUBLIC_URL. A page on another site that makes its
  own name resolve to 127.0.0.1 (DNS rebinding) sends its own name as the Host, and is refused.
- `client_address`: the address that sent the request; behind a reverse proxy listed in
  TRAINDECK_TRUSTED_PROXIES, the one that proxy names in X-Forwarded-For (the right-most
  address there that is not itself a trusted proxy). A header from anyone else is ignored.
- `over_https`: the request reached the dashboard over https (its own TLS), a trusted proxy's
  X-Forwarded-Proto says so, or TRAINDECK_PUBLIC_URL is https.

`python -m dashboard` hands the same proxies to uvicorn (FORWARDED_ALLOW_IPS), which would
otherwise believe X-Forwarded-For from any process on the machine (127.0.0.1 and ::1).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from common.settings import IPNetwork

LOOPBACK_NAMES = frozenset({"localhost"})


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def host_name(host_header: str | None) -> str | None:
    """The host name in a Host header (`name`, `name:port`, `[v6]:port`), lower case without
    a trailing dot; None for a missing or malformed one."""
    if not host_header:
        return None
    try:
        parts = urlsplit(f"//{host_header}")
        name = parts.hostname
        parts.port  # noqa: B018 (a port that is no number raises here)
    except ValueError:
        return None
    if not name or parts.username is not None or parts.password is not None:
        return None
    if parts.path or parts.query or parts.fragment:
        return None
    return name.lower().rstrip(".") or None


def is_loopback_name(name: str) -> bool:
    ip = _ip(name)
    return ip.is_loopback if ip is not None else name in LOOPBACK_NAMES


def answered_names(address: str | None, public_host: str | None) -> list[str]:
    """The host names the open mode answers besides any loopback IP address: `localhost`, the
    address it listens on, the public URL's host (for Streamlit's `server.allowedHosts`)."""
    names = ["localhost", "127.0.0.1", "::1"]
    for extra in (address, public_host):
        name = (extra or "").strip().strip("[]").lower().rstrip(".")
        if name and name not in names:
            names.append(name)
    return names


def host_answered(host_header: str | None, address: str | None, public_host: str | None) -> bool:
    """Whether the open loopback mode answers a request that names this Host."""
    name = host_name(host_header)
    if name is None:
        return False
    return is_loopback_name(name) or name in answered_names(address, public_host)


def _trusted(address: str | None, proxies: Iterable[IPNetwork]) -> bool:
    ip = _ip(address) if address else None
    return ip is not None and any(ip in network for network in proxies)


def client_address(connection: HTTPConnection, proxies: tuple[IPNetwork, ...]) -> str:
    """The client's address: the peer's, or, when the peer is a trusted proxy, the right-most
    address in X-Forwarded-For that is not a trusted proxy."""
    peer = connection.client.host if connection.client else "unknown"
    if not proxies or not _trusted(peer, proxies):
        return peer
    forwarded = [
        entry.strip()
        for value in connection.headers.getlist("x-forwarded-for")
        for entry in value.split(",")
        if entry.strip()
    ]
    for entry in reversed(forwarded):
        if not _trusted(entry, proxies):
            ip = _ip(entry)
            return str(ip) if ip is not None else entry
    return str(_ip(forwarded[0])) if forwarded and _ip(forwarded[0]) else peer


def over_https(
    connection: HTTPConnection, proxies: tuple[IPNetwork, ...], public_https: bool
) -> bool:
    """Whether the person's browser reaches the dashboard over https."""
    if public_https or connection.url.scheme in ("https", "wss"):
        return True
    peer = connection.client.host if connection.client else None
    if not _trusted(peer, proxies):
        return False
    # The nearest proxy's word: the last value, when proxies append to the header.
    values = ",".join(connection.headers.getlist("x-forwarded-proto")).split(",")
    return values[-1].strip().lower() in ("https", "wss")

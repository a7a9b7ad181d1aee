"""Which URLs a `url` dataset may come from: http(s) to public addresses, or an allowed mirror.

An address is refused when it is, or an IPv4 address inside it is: the cloud metadata address
(169.254.169.254 and its kin), unspecified (0.0.0.0, ::), loopback, link-local, multicast,
unique-local (fc00::/7), private, reserved, or any other range that is not global (such as
100.64.0.0/10). The message names the rule. So a URL cannot make a worker read this machine's
services, its cloud's metadata server, or the private network, nor tell open ports from closed.

`TRAINDECK_URL_ALLOW` lets an admin fetch from an internal mirror: host names (exact, any
case), IP addresses and CIDR ranges, separated by commas or spaces. An allowed name is fetched
whatever it resolves to; an allowed address or range admits the addresses inside it.

Registration (`check_url`) judges the URL as written, a literal address or a name that is this
machine by definition (`localhost`), without asking DNS, since the worker that downloads may see
other names than the dashboard. The worker (`datasets.download`) resolves the name once per
request, checks every address it got, and connects only to those, on every redirect too.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from common.errors import mask_passwords
from common.settings import settings
from datasets.labelling import DatasetError

ALLOW_ENV = "TRAINDECK_URL_ALLOW"
SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_SHOWN_URL = 300

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud metadata servers: AWS, GCP, Azure, OpenStack (link-local anyway), AWS over IPv6,
# Alibaba Cloud (inside 100.64.0.0/10, not global anyway). Named so the message says what it is.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(text) for text in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
METADATA_NAMES = frozenset({"metadata.google.internal", "metadata"})
# RFC 6761: localhost and every name under it are this machine, whatever DNS says.
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain"})
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_UNIQUE_LOCAL = ipaddress.IPv6Network("fc00::/7")


class UrlRefused(DatasetError):
    """A URL traindeck does not fetch; the message names the rule and the setting."""


def shown_url(url: str) -> str:
    """`url` as a message shows it: its password (if any) replaced by `***`, and cut short
    when it is long (a redirect's Location is the server's to choose)."""
    shown = mask_passwords(url)
    return shown if len(shown) <= MAX_SHOWN_URL else shown[:MAX_SHOWN_URL] + "…"


def host_name(host: str) -> str:
    """A host as compared with the allow-list: lower case, without a final dot."""
    return host.strip().lower().rstrip(".")


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped ::ffff:a.b.c.d, NAT64, 6to4), if any."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def address_rule(address: IPAddress) -> str | None:
    """Why `address` is refused, in words ('a loopback address'), or None for a public one."""
    inner = _embedded_ipv4(address)
    if inner is not None:
        rule = address_rule(inner)
        if rule is not None:
            return f"{rule} ({inner}) inside an IPv6 address"
    if address in METADATA_ADDRESSES:
        return "the cloud metadata address"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv6Address) and address in _UNIQUE_LOCAL:
        return "a unique-local address"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "not a public address"
    return None


@dataclass(frozen=True)
class AllowList:
    """The hosts and networks an admin allowed (`TRAINDECK_URL_ALLOW`)."""

    names: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        names: set[str] = set()
        networks: list[Network] = []
        for entry in entries:
            text = entry.strip().strip("[]")
            if not text:
                continue
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                names.add(host_name(text))
        return cls(frozenset(names), tuple(networks))

    @classmethod
    def from_settings(cls) -> AllowList:
        return cls.parse(settings().url_allow)

    def allows_name(self, host: str) -> bool:
        return host_name(host) in self.names

    def allows_address(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)


def _refusal(url: str, host: str, address: IPAddress | None, rule: str) -> UrlRefused:
    what = (
        f"{host} is {rule}"
        if address is None or str(address) == host
        else (f"{host} resolves to {address}, {rule}")
    )
    return UrlRefused(
        f"{shown_url(url)} is refused: {what}. Only public addresses are fetched; an admin can "
        f"allow an internal mirror with {ALLOW_ENV}"
    )


def split_url(url: str) -> tuple[SplitResult, str, int]:
    """The parts of an http(s) URL, its host (lower case, no brackets) and its port, or an
    UrlRefused naming what is wrong."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UrlRefused(f"{shown_url(url)} is not a usable URL (its host or port)") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES or not parts.hostname:
        raise UrlRefused(f"{shown_url(url)} is not an http(s) URL with a host")
    return parts, host_name(parts.hostname), port or DEFAULT_PORTS[scheme]


def literal_address(host: str) -> IPAddress | None:
    """The address `host` spells (`127.0.0.1`, `::1`, also `2130706433` or `0x7f.1`, which the
    resolver reads as numbers), or None for a name. Never asks DNS."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError, ValueError):
        return None
    return ipaddress.ip_address(found[0][4][0]) if found else None


def check_url(url: str, allow: AllowList | None = None) -> None:
    """Refuse (UrlRefused) an http(s) URL that is not allowed as written: a literal address
    that is not public, or a name that means this machine or the metadata server. Names that
    need DNS are judged by the worker when it fetches (`resolve_checked`)."""
    allow = allow if allow is not None else AllowList.from_settings()
    _, host, _ = split_url(url)
    if allow.allows_name(host):
        return
    address = literal_address(host)
    if address is not None:
        rule = None if allow.allows_address(address) else address_rule(address)
        if rule is not None:
            raise _refusal(url, host, address, rule)
        return
    if host in LOCAL_NAMES or host.endswith(".localhost"):
        raise _refusal(url, host, None, "this machine (a loopback name)")
    if host in METADATA_NAMES:
        raise _refusal(url, host, None, "the cloud metadata server")


def resolve_checked(url: str, allow: AllowList | None = None) -> list[str]:
    """The addresses to connect to for `url`: its host resolved once, every address checked.

    An allowed name keeps all its addresses; otherwise any address that is not public (and not
    in an allowed range) refuses the whole URL, so a name cannot mix a public address with an
    internal one. socket.gaierror passes through (the caller words an unknown name)."""
    allow = allow if allow is not None else AllowList.from_settings()
    _, host, port = split_url(url)
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[str] = []
    for *_, sockaddr in found:
        text = str(sockaddr[0])
        if text not in addresses:
            addresses.append(text)
    if allow.allows_name(host):
        return addresses
    for text in addresses:
        address = ipaddress.ip_address(text)
        rule = None if allow.allows_address(address) else address_rule(address)
        if rule is not None:
            raise _refusal(url, host, address, rule)
    return addresses

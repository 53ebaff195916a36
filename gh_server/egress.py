"""Where gh-server may send a request of its own (webhooks): public addresses, or a lab's allow-list.

A webhook URL is set through the API, so it must not turn gh-server into a way to reach what only
gh-server can reach: its own loopback services (the Evals API itself, PostgreSQL, libvirt's TCP
socket), the lab's private network, or a cloud metadata service (169.254.169.254, fd00:ec2::254).
The name is resolved at send time, not when the URL is set (DNS answers change), and the request is
then sent to the very address that was checked (the Host header and TLS SNI keep the name), so a
second lookup cannot answer differently (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from gh_common import timeouts

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
RESOLVE_TIMEOUT_S = 10.0


class Refused(Exception):
    """The URL's host is not a public address and not on the allow-list; the message says which."""


@dataclass(frozen=True)
class Target:
    url: str  # the URL with the checked address as its host
    name: str  # the URL's host name: TLS SNI and certificate check
    host_header: str  # name[:port]
    address: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Host": self.host_header}

    @property
    def extensions(self) -> dict[str, str]:
        return {"sni_hostname": self.name}


def _why_not_public(ip: IP) -> str | None:
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (cloud metadata services live there)"
    if ip == ipaddress.ip_address("fd00:ec2::254"):
        return "a cloud metadata address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global or ip.is_multicast:
        return "not a public address"
    return None


def _allowed(host: str, ip: IP, allow: Sequence[str]) -> bool:
    for entry in allow:
        e = entry.strip().lower()
        if not e:
            continue
        if e == host.lower():
            return True
        try:
            if ip in ipaddress.ip_network(e, strict=False):
                return True
        except ValueError:
            continue  # a name that is not this host
    return False


async def resolve(url: str, allow: Sequence[str] = (), timeout: float = RESOLVE_TIMEOUT_S) -> Target:
    """The address to send `url`'s request to. Raises Refused (not public, unresolvable, not http(s))."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused(f"{url!r} is not an http(s) URL with a host")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        literal: IP | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        loop = asyncio.get_running_loop()
        try:
            async with timeouts.timeout(timeout):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as e:
            raise Refused(f"{host} could not be resolved: {e}") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        if not addresses:
            raise Refused(f"{host} has no address")
    # Every address must pass: otherwise the name could pick a bad one on the next connection.
    for ip in addresses:
        why = _why_not_public(ip)
        if why is not None and not _allowed(host, ip, allow):
            raise Refused(f"{host} resolves to {ip}, {why}: webhooks go to public addresses only "
                          "(list a lab's own receiver in the webhook_allow setting)")
    chosen = addresses[0]
    netloc = f"[{chosen}]" if chosen.version == 6 else str(chosen)
    if parts.port is not None:
        netloc += f":{parts.port}"
    return Target(urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), host,
                  host if parts.port is None else f"{host}:{parts.port}", str(chosen))

"""Which webhook URLs may be called: http(s) only, and every address the host resolves to
public, unless an allowed network (`PARLEY_WEBHOOK_ALLOW_NETWORKS`) holds it. Checked at
registration and again before each send (a name may resolve elsewhere by then)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class RefusedUrl(Exception):
    """The URL may not be called; the message says why."""


async def resolve(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise RefusedUrl(f"host {host!r} does not resolve") from exc
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


async def check_url(url: str, allowed: Sequence[Network]) -> None:
    """Raise `RefusedUrl` unless `url` is http(s) and resolves only to public addresses
    (or to allowed networks)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RefusedUrl("the URL must be http or https with a host")
    if parts.username or parts.password:
        raise RefusedUrl("the URL must not carry credentials")
    for address in await resolve(parts.hostname):
        if any(address in net for net in allowed):
            continue
        mapped = getattr(address, "ipv4_mapped", None)
        if not address.is_global or (mapped is not None and not mapped.is_global):
            raise RefusedUrl(
                f"{parts.hostname} resolves to {address}, a loopback, private or link-local "
                "address (allow its network with PARLEY_WEBHOOK_ALLOW_NETWORKS)"
            )

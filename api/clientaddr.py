"""The client address a request came from: the TCP peer, or the `X-Forwarded-For` hop a trusted proxy saw.

One source of truth for the buckets, `source_ip` and the logs: uvicorn's own proxy-header handling is turned off
wherever we serve (cli/dev.py `server_config`), and this middleware rewrites `scope["client"]` from
`SWITCHBOARD_FORWARDED_ALLOW_IPS` only. Each proxy appends the peer it saw to `X-Forwarded-For`, so the hops are
read right to left and the first one that is not a trusted proxy is the client; everything left of it was
written by the client and is never believed. With no trusted proxies (the default) the header is ignored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from switchboard.settings import Network


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address, networks: Iterable[Network]) -> bool:
    return any(address.version == net.version and address in net for net in networks)


def is_trusted_proxy(peer: str, trusted: tuple[Network, ...]) -> bool:
    """Whether a TCP peer is one of the trusted proxies (SWITCHBOARD_FORWARDED_ALLOW_IPS)."""
    address = _address(peer) if trusted else None
    return address is not None and _trusted(address, trusted)


def client_address(peer: str | None, forwarded_for: list[str], trusted: tuple[Network, ...]) -> str | None:
    """The client's address: the peer unless it is a trusted proxy that forwarded a usable hop."""
    if not trusted or peer is None or not forwarded_for:
        return peer
    peer_address = _address(peer)
    if peer_address is None or not _trusted(peer_address, trusted):
        return peer
    hops = [hop for value in forwarded_for for hop in value.split(",")]
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            # Our own proxy wrote the hops right of here; a hop that is not an address means the chain cannot
            # be read, so fall back to the proxy itself (a shared bucket, never a spoofed one).
            return peer
        if not _trusted(address, trusted):
            return str(address)
    # Every hop is a trusted proxy: the request started inside the trusted network.
    first = _address(hops[0]) if hops else None
    return str(first) if first is not None else peer


class ClientAddressMiddleware:
    """Rewrites scope["client"] to the real client address when the peer is a trusted proxy."""

    def __init__(self, app: ASGIApp, trusted: tuple[Network, ...]) -> None:
        self.app = app
        self.trusted = trusted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.trusted and scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            forwarded = [v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"x-forwarded-for"]
            if client and forwarded:
                host = client_address(client[0], forwarded, self.trusted)
                if host != client[0]:
                    scope = dict(scope, client=(host, 0))
        await self.app(scope, receive, send)

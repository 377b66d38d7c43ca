"""The client address a request came from: the TCP peer, or the `X-Forwarded-For` hop a trusted proxy saw.

One source of truth for the buckets, `source_ip` and the logs: uvicorn's own proxy-header handling is turned off
wherever we serve (cli/dev.py `server_config`), and the app runs uvicorn's `ProxyHeadersMiddleware` trusting the
proxies of `SWITCHBOARD_FORWARDED_ALLOW_IPS` only. When the peer is one of them it reads `X-Forwarded-For` right to
left (each proxy appends the peer it saw) and takes the first hop that is not a trusted proxy as the client:
everything left of it was written by the client and is never believed. It takes the scheme from
`X-Forwarded-Proto` too. With no trusted proxies (the default) the headers are ignored.

Two things around it: an IPv4 proxy seen through a dual-stack socket is `::ffff:a.b.c.d`, so each IPv4 network is
trusted in that spelling too; and a hop that is not an address (the chain cannot be read) leaves the proxy itself
as the client, a shared bucket, never a spoofed one.
"""

from __future__ import annotations

import ipaddress
from typing import Any, cast

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from switchboard.settings import Network


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_trusted_proxy(peer: str, trusted: tuple[Network, ...]) -> bool:
    """Whether a TCP peer is one of the trusted proxies (SWITCHBOARD_FORWARDED_ALLOW_IPS)."""
    address = _address(peer) if trusted else None
    return address is not None and any(address.version == net.version and address in net for net in trusted)


def proxy_hosts(trusted: tuple[Network, ...]) -> list[str]:
    """The trusted networks as uvicorn's `trusted_hosts`, each IPv4 network also in its IPv4-mapped IPv6 spelling."""
    hosts = []
    for net in trusted:
        hosts.append(str(net))
        if isinstance(net, ipaddress.IPv4Network):
            hosts.append(f"::ffff:{net.network_address}/{96 + net.prefixlen}")
    return hosts


class ClientAddressMiddleware:
    """Rewrites scope["client"] to the real client address when the peer is a trusted proxy."""

    def __init__(self, app: ASGIApp, trusted: tuple[Network, ...]) -> None:
        self.app = app
        self.forwarded: ASGIApp | None = None
        if trusted:
            # uvicorn types ASGI with TypedDicts of its own; Starlette's (this app's) are plain mappings.
            proxy = ProxyHeadersMiddleware(cast(Any, self._readable), trusted_hosts=proxy_hosts(trusted))
            self.forwarded = cast(ASGIApp, proxy)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.forwarded is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["peer"] = scope.get("client")
        await self.forwarded(scope, receive, send)

    async def _readable(self, scope: Scope, receive: Receive, send: Send) -> None:
        peer, client = scope["state"]["peer"], scope.get("client")
        if client is not None and client != peer:  # a trusted proxy named the client
            address = _address(client[0])
            scope["client"] = peer if address is None else (str(address), client[1])
        await self.app(scope, receive, send)

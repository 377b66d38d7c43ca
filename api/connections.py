"""Bounded clients, at the connection: uvicorn's httptools protocol with read deadlines, a capped request head,
and connection caps per client address and in all.

uvicorn bounds none of these: a connection that sends nothing, or one byte a second, is held forever (its
keep-alive timeout runs only between requests), headers are unlimited in count and size, and connections are
accepted until the process runs out of descriptors (then `accept()` fails in a loop, the API stops answering and
its own database connections cannot be replaced). Its `limit_concurrency` refuses only once a request head has
arrived, so it cannot stop a connection that never sends one. The bounds need the moments a connection opens, a
request's head is complete and its body is, which only the protocol sees, so they live in a subclass of
uvicorn's `HttpToolsProtocol`: the one workaround for a missing public API, kept here and tested by the
behaviour it relies on, on real sockets against a served app (tests/api/test_connections.py). The subclass
uses the httptools parser callbacks (`on_message_begin`, `on_header`, `on_headers_complete`, `on_body`,
`on_message_complete`), asyncio's protocol methods, and the protocol's `cycle` (whether an answer has begun).

- **Read deadlines.** A request's line and headers must arrive within `head_seconds` of the connection opening,
  or of the request's first byte on a kept-alive connection (uvicorn's keep-alive timeout bounds the idle gap
  between requests); its body within `body_seconds` of its head. Past either, the connection is answered 408
  (unless an answer has begun) and closed; the application sees a disconnect.
- **Request head.** More than MAX_HEADERS headers or MAX_HEAD_BYTES bytes of head is answered 431 and closed
  before any application code runs.
- **Connections.** At most `per_address` open connections per client address (the TCP peer; a trusted proxy,
  SWITCHBOARD_FORWARDED_ALLOW_IPS, counts only in all) and `total` in all, `total` kept FD_RESERVE descriptors
  under the process's limit (the listen backlog, BACKLOG, bounds how many accepts can be in flight). Past the per-address cap a new connection is answered 429 and closed at once. At
  the global cap the oldest connection still waiting for its request head is closed to make room (it had at
  most `head_seconds` to live anyway); only when none is waiting is the new one refused (503). So slow
  connections from one address never keep health checks or producers at another address out, and the process
  always has descriptors for PostgreSQL, Temporal and its sandbox children.

Every cut is counted (`switchboard_http_connections_cut_total{reason}`) and logged, at most one line per reason
every LOG_EVERY_SECONDS with the count it stands for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.clientaddr import is_trusted_proxy
from api.errors import error_body
from switchboard.metrics import HTTP_CONNECTIONS, record_connection_cut
from switchboard.settings import Network, Settings

log = logging.getLogger("switchboard.http")

MAX_HEADERS = 100
MAX_HEAD_BYTES = 32 * 1024
BACKLOG = 256
"""The listen backlog. asyncio accepts up to this many connections in one loop tick before any of them reaches
`connection_made` (where a refusal closes it), so that many descriptors can be taken before a cap is checked."""
FD_RESERVE = 256 + 2 * BACKLOG
"""Descriptors kept from client connections: the process's own (pools, Temporal, sandbox pipes, logs), one
tick's accepts, and the previous tick's refusals still closing."""
LOG_EVERY_SECONDS = 10.0


@dataclass(frozen=True)
class ClientBounds:
    """What one server holds its clients to (docs/api.md "Limits")."""

    head_seconds: float
    body_seconds: float
    total: int
    per_address: int
    exempt: tuple[Network, ...] = ()
    """Peers counted only in all: trusted proxies carry many clients on one address."""

    @classmethod
    def from_settings(cls, settings: Settings) -> ClientBounds:
        """The settings' bounds, the global cap kept under the process's descriptor limit."""
        return cls(
            head_seconds=settings.http_head_timeout_seconds,
            body_seconds=settings.http_body_timeout_seconds,
            total=descriptor_bounded(settings.http_max_connections),
            per_address=settings.http_max_connections_per_address,
            exempt=settings.trusted_proxies(),
        )


def descriptor_bounded(total: int) -> int:
    """`total`, or fewer when the descriptor limit leaves less after FD_RESERVE (the soft limit is first raised
    to the hard one, as servers do: the low default soft limit exists for programs that never asked)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, total + FD_RESERVE)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return total
    return max(1, min(total, soft - FD_RESERVE))


def _answer(status: int, code: str, message: str, headers: tuple[str, ...] = ()) -> bytes:
    """A whole HTTP answer with the API's error body, closing the connection."""
    body = json.dumps(error_body(code, message)).encode()
    head = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *headers,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Gate:
    """The open connections of one server: counts per address and in all, and those waiting for a request head."""

    def __init__(self, bounds: ClientBounds) -> None:
        self.bounds = bounds
        self.members: dict[GuardedProtocol, str | None] = {}
        """Admitted connections → their per-address key (None: counted only in all)."""
        self.by_address: dict[str, int] = {}
        self.waiting: dict[GuardedProtocol, None] = {}
        """Connections waiting for a request head, oldest first: the ones evicted at the global cap."""
        self._noted: dict[str, tuple[float, int]] = {}

    def admit(self, conn: GuardedProtocol, address: str | None) -> str | None:
        """Count the connection in, or say why not: "per_address" or "global" (evicting to make room first)."""
        key = address if address is not None and not is_trusted_proxy(address, self.bounds.exempt) else None
        if key is not None and self.by_address.get(key, 0) >= self.bounds.per_address:
            return "per_address"
        if len(self.members) >= self.bounds.total:
            oldest = next(iter(self.waiting), None)
            if oldest is None:
                return "global"
            oldest.cut("evicted", None)
        self.members[conn] = key
        if key is not None:
            self.by_address[key] = self.by_address.get(key, 0) + 1
        HTTP_CONNECTIONS.set(len(self.members))
        return None

    def release(self, conn: GuardedProtocol) -> None:
        """Count the connection out (once, however often called)."""
        if conn not in self.members:
            return
        key = self.members.pop(conn)
        self.waiting.pop(conn, None)
        if key is not None:
            left = self.by_address[key] - 1
            if left:
                self.by_address[key] = left
            else:
                del self.by_address[key]
        HTTP_CONNECTIONS.set(len(self.members))

    def note(self, reason: str, address: str | None) -> None:
        """Count a cut, and log it unless a line for the same reason went out within LOG_EVERY_SECONDS."""
        record_connection_cut(reason)
        now = time.monotonic()
        last, quiet = self._noted.get(reason, (float("-inf"), 0))
        if now - last < LOG_EVERY_SECONDS:
            self._noted[reason] = (last, quiet + 1)
            return
        self._noted[reason] = (now, 0)
        log.warning(
            "connection cut: %s",
            _WHY[reason].format(b=self.bounds, headers=MAX_HEADERS, head_bytes=MAX_HEAD_BYTES),
            extra={"reason": reason, "client": address, "cut_since_last_line": quiet},
        )


_WHY = {
    "per_address": "a client address already holds {b.per_address} connections; refused (429)",
    "global": "{b.total} connections are open and none is waiting for its request head; refused (503)",
    "evicted": "{b.total} connections are open; closed the oldest one still waiting for its request head",
    "head_timeout": "a request head did not arrive within {b.head_seconds:g} s",
    "body_timeout": "a request body did not arrive within {b.body_seconds:g} s of its head",
    "head_too_large": "a request head of more than {headers} headers or {head_bytes} bytes (431)",
}


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol held to a gate's bounds; `guarded_protocol` makes one class per server."""

    gate: ClassVar[Gate]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._address: str | None = None
        self._admitted = False
        self._cut = False
        self._deadline: asyncio.TimerHandle | None = None
        self._in_head = False
        self._head_bytes = 0
        self._headers = 0
        self._header_bytes = 0
        self._too_large = False

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        """Admit the connection under the caps, or answer and close it at once."""
        peer = transport.get_extra_info("peername")
        self._address = str(peer[0]) if isinstance(peer, tuple) and peer else None
        refused = self.gate.admit(self, self._address)
        if refused is not None:
            bounds = self.gate.bounds
            if refused == "per_address":
                message = f"this address holds {bounds.per_address} connections already; retry later"
                answer = _answer(429, "rate_limited", message, ("retry-after: 1",))
            else:
                answer = _answer(503, "unavailable", "too many connections; retry later", ("retry-after: 1",))
            assert isinstance(transport, asyncio.Transport)
            transport.write(answer)
            transport.close()
            self.gate.note(refused, self._address)
            return
        self._admitted = True
        assert isinstance(transport, asyncio.Transport)
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        """Count the connection out; uvicorn's own bookkeeping only for an admitted one."""
        if not self._admitted:
            return
        self._disarm()
        self.gate.release(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser, counting the bytes of a request head; a head past the caps is answered 431."""
        if self._cut or not self._admitted:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if (self._too_large or (self._in_head and self._head_bytes > MAX_HEAD_BYTES)) and not self._cut:
            message = f"the request head is over {MAX_HEADERS} headers or {MAX_HEAD_BYTES} bytes"
            self.cut("head_too_large", _answer(431, "headers_too_large", message))

    # -- httptools parser callbacks

    def on_message_begin(self) -> None:
        """A request's first byte: on a kept-alive connection its head's deadline starts now."""
        super().on_message_begin()
        if not self._in_head:
            self._await_head()

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count the header; past the caps the rest of the request is ignored and answered 431."""
        self._headers += 1
        self._header_bytes += len(name) + len(value)
        if self._headers > MAX_HEADERS or self._header_bytes > MAX_HEAD_BYTES:
            self._too_large = True
        if not self._too_large:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        """The head is whole: the body's deadline starts, and the application runs (never for a refused head)."""
        if self._too_large:
            return
        self._in_head = False
        self.gate.waiting.pop(self, None)
        self._arm(self.gate.bounds.body_seconds, "body_timeout")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        """Body bytes for the application (none for a refused head)."""
        if not self._too_large:
            super().on_body(body)

    def on_message_complete(self) -> None:
        """The body is whole: no deadline until the next request begins."""
        if self._too_large:
            return
        self._disarm()
        super().on_message_complete()

    # -- the bounds

    def _await_head(self) -> None:
        self._in_head = True
        self._head_bytes = self._headers = self._header_bytes = 0
        self.gate.waiting[self] = None
        self._arm(self.gate.bounds.head_seconds, "head_timeout")

    def _arm(self, seconds: float, reason: str) -> None:
        self._disarm()
        self._deadline = asyncio.get_running_loop().call_later(seconds, self._expired, reason)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, reason: str) -> None:
        self._deadline = None
        bounds = self.gate.bounds
        cycle = self.cycle
        # A 408 only where it can be the answer to the request that timed out: none of its bytes are on the
        # wire yet, and no earlier answer on this connection is still going out.
        if reason == "head_timeout":
            message = f"the request head was not received within {bounds.head_seconds:g} s"
            unanswered = cycle is None or cycle.response_complete
        else:
            message = f"the request body was not received within {bounds.body_seconds:g} s of its head"
            unanswered = cycle is not None and not cycle.response_started
        self.cut(reason, _answer(408, "request_timeout", message) if unanswered else None)

    def cut(self, reason: str, answer: bytes | None) -> None:
        """Close the connection for `reason`, with `answer` first when given; counted and logged once."""
        if self._cut:
            return
        self._cut = True
        self._disarm()
        self.gate.release(self)
        self.gate.note(reason, self._address)
        if not self.transport.is_closing():
            if answer is not None:
                self.transport.write(answer)
            self.transport.close()


def guarded_protocol(bounds: ClientBounds) -> type[GuardedProtocol]:
    """A protocol class for one server, its connections counted by one gate under `bounds`."""
    cls: type[GuardedProtocol] = type("GuardedProtocol", (GuardedProtocol,), {"gate": Gate(bounds)})
    return cls

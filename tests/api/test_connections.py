"""Bounded clients (api/connections.py), on real sockets against the app served by uvicorn as in production.

Issue 29, finding 3: a connection that sent nothing or one byte a second was never cut off, heads were
unlimited, and enough slow connections from one address took the process's descriptors, so the API stopped
answering anyone. Finding 4: a producer that disconnected mid-body was an ingest 500 with a traceback. These
tests hold the bounds the protocol subclass relies on uvicorn's httptools protocol to let it keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from api.connections import MAX_HEAD_BYTES, MAX_HEADERS
from tests.conftest import Stack, serving
from tests.helpers import eventually, issue_payload, post_github
from tests.signing import sign_github


@contextlib.asynccontextmanager
async def bounded(stack: Stack, **bounds: Any) -> AsyncIterator[str]:
    """The stack's app served with these client bounds (settings fields), on a real port."""
    for name, value in bounds.items():
        setattr(stack.settings, name, value)
    async with serving(stack.app) as base:
        yield base


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def _open(base: str, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", _port(base), local_addr=(source, 0))


async def _until_closed(reader: asyncio.StreamReader, within: float) -> bytes:
    """Everything the server sends until it closes the connection; fails if it is still open after `within`."""
    data = b""
    async with asyncio.timeout(within):
        while chunk := await reader.read(65536):
            data += chunk
    return data


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _error(answer: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    return body


def _client(base: str, source: str) -> httpx.AsyncClient:
    """An HTTP client whose connections come from `source` (any 127.0.0.0/8 address reaches loopback)."""
    return httpx.AsyncClient(base_url=base, transport=httpx.AsyncHTTPTransport(local_address=source), timeout=30)


async def test_a_silent_or_dribbling_client_is_cut_off_at_the_head_deadline(stack: Stack) -> None:
    async with bounded(stack, http_head_timeout_seconds=1.0) as base:
        silent = await _open(base)
        dribbling = await _open(base)
        started = time.monotonic()

        async def dribble() -> None:
            writer = dribbling[1]
            with contextlib.suppress(ConnectionError):
                for byte in b"POST /webhooks/w/0123456789abcdef0123456789abcdef HTTP/1.1\r\nHost: x\r\n":
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.1)

        task = asyncio.create_task(dribble())
        answers = await asyncio.gather(_until_closed(silent[0], 15), _until_closed(dribbling[0], 15))
        took = time.monotonic() - started
        task.cancel()
        for answer in answers:
            assert _status(answer) == 408, answer
            assert _error(answer) == {
                "code": "request_timeout",
                "message": "the request head was not received within 1 s",
            }
        # One byte every 0.1 s never extends the deadline: both go at about 1 s, not after the dribble's 7 s.
        assert 0.9 <= took < 6.0, took
        # A well-behaved client on the same server is unaffected, and so is a kept-alive connection between
        # requests (uvicorn's keep-alive timeout, not the head deadline, bounds that gap).
        async with _client(base, "127.0.0.1") as http:
            assert (await http.get("/healthz")).status_code == 200
            await asyncio.sleep(1.5)
            assert (await http.get("/healthz")).status_code == 200


async def _signed_head(stack: Stack, delivery: str) -> tuple[bytes, bytes]:
    """A signed GitHub delivery to a fresh webhook, as raw request head and body."""
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    path = f"/webhooks/w/{webhook['ingest_url'].rsplit('/', 1)[-1]}"
    body = json.dumps(issue_payload()).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"X-GitHub-Event: issues\r\nX-GitHub-Delivery: {delivery}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in sign_github(webhook["secret"].encode(), body).items())
        + "\r\n"
    ).encode()
    return head, body


def _ingest_count(status: str) -> float:
    return (
        REGISTRY.get_sample_value("switchboard_ingest_requests_total", {"source": "unknown", "status": status}) or 0.0
    )


async def test_a_producer_that_hangs_up_mid_body_is_a_disconnect_not_a_500(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    head, body = await _signed_head(stack, "hangs-up-1")
    before = {status: _ingest_count(status) for status in ("499", "500")}
    caplog.set_level(logging.INFO)
    async with bounded(stack) as base:
        _, writer = await _open(base)
        writer.write(head + body[:100])
        await writer.drain()
        writer.close()
        await eventually(lambda: _ingest_count("499") > before["499"], timeout=15)
    # Nothing accepted; no 500, no ERROR line, no traceback of ours or uvicorn's (its lines are JSON now too).
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 0
    assert _ingest_count("500") == before["500"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    (line,) = [r for r in caplog.records if r.getMessage().startswith("producer disconnected")]
    assert line.levelno == logging.WARNING and line.exc_info is None
    assert any(r.getMessage() == "request" and getattr(r, "status", None) == 499 for r in caplog.records)


async def test_a_body_not_sent_in_time_is_cut_off_at_the_body_deadline(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    head, body = await _signed_head(stack, "slow-1")
    before = _ingest_count("499")
    caplog.set_level(logging.INFO)
    async with bounded(stack, http_body_timeout_seconds=1.0) as base:
        reader, writer = await _open(base)
        writer.write(head + body[:100])
        await writer.drain()
        started = time.monotonic()
        answer = await _until_closed(reader, 15)
        assert 0.9 <= time.monotonic() - started < 6.0
        assert _status(answer) == 408 and _error(answer) == {
            "code": "request_timeout",
            "message": "the request body was not received within 1 s of its head",
        }, answer
        # The receiver saw the producer go: counted as a disconnect, like one that hung up by itself.
        await eventually(lambda: _ingest_count("499") > before, timeout=15)
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_head_over_the_caps_is_431_before_any_application_code_runs(stack: Stack) -> None:
    async with bounded(stack) as base:
        many = "".join(f"X-Filler-{i}: v\r\n" for i in range(MAX_HEADERS + 1))
        huge = "X-Huge: " + "v" * MAX_HEAD_BYTES + "\r\n"
        for extra in (many, huge):
            reader, writer = await _open(base)
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
            await writer.drain()
            answer = await _until_closed(reader, 10)
            assert _status(answer) == 431, answer[:200]
            assert _error(answer) == {
                "code": "headers_too_large",
                "message": f"the request head is over {MAX_HEADERS} headers or {MAX_HEAD_BYTES} bytes",
            }
            writer.close()
        # One huge value that never ends is cut as soon as it passes the cap, not buffered on.
        reader, writer = await _open(base)
        writer.write(b"GET /healthz HTTP/1.1\r\nX-Endless: " + b"v" * (2 * MAX_HEAD_BYTES))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        assert _status(await _until_closed(reader, 10)) == 431
        # Up to the caps is fine.
        async with _client(base, "127.0.0.1") as http:
            fine = {f"X-Filler-{i}": "v" for i in range(MAX_HEADERS - 10)}
            assert (await http.get("/healthz", headers=fine)).status_code == 200


async def test_slow_connections_from_one_address_keep_no_one_else_out(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    async with bounded(stack, http_max_connections_per_address=20, http_head_timeout_seconds=30.0) as base:
        flood = []
        for _ in range(20):
            reader, writer = await _open(base, "127.0.0.1")
            writer.write(b"POST /webhooks/w/0123456789abcdef0123456789abcdef HTTP/1.1\r\n")
            await writer.drain()
            flood.append((reader, writer))
        # The address is at its cap: its next connections are answered 429 at once, not held.
        for _ in range(5):
            reader, writer = await _open(base, "127.0.0.1")
            answer = await _until_closed(reader, 5)
            assert _status(answer) == 429 and b"retry-after: 1" in answer, answer
            assert _error(answer)["code"] == "rate_limited"
        # Health checks and producers at other addresses are answered as usual.
        async with _client(base, "127.0.0.2") as probe:
            health = await probe.get("/healthz")
            assert health.status_code == 200 and health.json()["status"] == "ok"
        async with _client(base, "127.0.0.3") as producer:
            delivered = await post_github(producer, webhook, issue_payload())
            assert delivered.status_code == 202 and delivered.json()["created"] == 1
        # The slow ones are still held (only new connections were refused); once they go, the address is back.
        for reader, writer in flood:
            assert not reader.at_eof()
            writer.close()

        async def answered() -> bool:
            async with _client(base, "127.0.0.1") as http:
                return (await http.get("/healthz")).status_code == 200

        assert await eventually(answered, timeout=15)


async def test_at_the_global_cap_the_oldest_connection_waiting_for_a_head_makes_room(stack: Stack) -> None:
    agent = await stack.agent()
    async with bounded(stack, http_max_connections=6, http_head_timeout_seconds=30.0) as base:
        idle = [await _open(base, f"127.0.0.{10 + i}") for i in range(6)]
        # Full: a health check still gets in, in place of the oldest idle connection.
        async with _client(base, "127.0.0.30") as probe:
            assert (await probe.get("/healthz")).status_code == 200
        assert await _until_closed(idle[0][0], 5) == b""
        for _, writer in idle[1:]:
            writer.close()
        # Full of connections that are all being served (event streams): a new one is refused, 503.
        auth = f"Authorization: Bearer {agent.credential}\r\n"
        streams = []
        for i in range(6):
            reader, writer = await _open(base, f"127.0.0.{40 + i}")
            writer.write(f"GET /v1/stream HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
            await writer.drain()
            assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 200")
            streams.append((reader, writer))
        reader, _ = await _open(base, "127.0.0.60")
        answer = await _until_closed(reader, 5)
        assert _status(answer) == 503 and _error(answer) == {
            "code": "unavailable",
            "message": "too many connections; retry later",
        }
        for _, writer in streams:
            writer.close()


async def test_healthz_mends_its_own_connection_and_logs_why_it_failed(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    stack.settings.health_timeout_seconds = 0.5
    assert (await stack.http.get("/healthz")).status_code == 200
    (pid,) = stack.sql(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = 'SELECT 1'"
        " AND pid <> pg_backend_pid()"
    )[0]
    caplog.set_level(logging.WARNING)
    # Its server process hangs (stopped): the answer still comes within the bound, and the log says why.
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        hung = await stack.http.get("/healthz")
        assert time.monotonic() - started < 3.0
        assert hung.status_code == 503 and hung.json()["postgres"] == "unavailable"
        assert "health check: postgres unavailable: no answer within 0.5 s" in caplog.messages
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (await eventually(lambda: _healthy(stack), timeout=20)) is True
    # Its connection is killed: the next checks connect afresh, without anyone's help.
    (pid,) = stack.sql(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = 'SELECT 1'"
        " AND pid <> pg_backend_pid()"
    )[0]
    stack.sql("SELECT pg_terminate_backend(%s)", pid)
    assert (await eventually(lambda: _healthy(stack), timeout=20)) is True


async def _healthy(stack: Stack) -> bool:
    return (await stack.http.get("/healthz")).status_code == 200

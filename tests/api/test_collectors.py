"""Generic collectors fed by real curl against a uvicorn-served app: kind rules, CloudEvents, HMAC, token trust."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import shutil
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from psycopg.types.json import Jsonb

from api.app import create_app
from tests.conftest import Agent, Stack
from tests.helpers import token_of

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def served(stack: Stack) -> AsyncIterator[str]:
    """A second API process image on the stack's database and task queue, served over real HTTP."""
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(stack.settings), host="127.0.0.1", port=port, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


class Curl:
    """POSTs with the curl binary, the way an operator pastes a collector URL into any producer."""

    def __init__(self, base: str) -> None:
        self.base = base

    async def post(self, url_path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        args = ["curl", "-sS", "-X", "POST", "--data-binary", "@-", "-o", "-", "-w", "\n%{http_code}"]
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            args += ["-H", f"{name}: {value}"]
        proc = await asyncio.create_subprocess_exec(
            *args, self.base + url_path, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate(body)
        assert proc.returncode == 0
        text, _, code = out.decode().rpartition("\n")
        return int(code), json.loads(text) if text else None


@pytest.fixture
async def curl(stack: Stack) -> AsyncIterator[Curl]:
    async with served(stack) as base:
        yield Curl(base)


async def _collector(agent: Agent, collector: dict[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    webhook = await agent.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    if collector is not None:
        await agent.ok("configure_webhook", {"webhook_id": webhook["webhook_id"], "collector": collector})
    return webhook, f"/webhooks/w/{token_of(webhook['ingest_url'])}"


def _event(stack: Stack, event_id: str) -> tuple[Any, ...]:
    [row] = stack.sql(
        "SELECT kind, external_id, verified, trust_mode, headers, routing_trace FROM events WHERE id = %s", event_id
    )
    return row


async def test_kind_by_fixed_default_header_and_json_path_with_fallback(stack: Stack, curl: Curl) -> None:
    agent = await stack.agent()
    _, fixed = await _collector(agent, {"kind": {"mode": "fixed", "value": "sentry.alert"}})
    wh_header, by_header = await _collector(
        agent, {"kind": {"mode": "header", "value": "X-Event-Type", "default": "unknown"}}
    )
    _, by_path = await _collector(agent, {"kind": {"mode": "json_path", "value": "data.action", "default": "other"}})
    _, plain = await _collector(agent)

    cases = [
        (fixed, {"alert": 1}, {}, "sentry.alert"),
        (by_header, {"a": 1}, {"X-Event-Type": "ticket.created"}, "ticket.created"),
        (by_header, {"a": 2}, {}, "unknown"),  # header absent: falls back to the default, never drops
        (by_path, {"data": {"action": "closed"}}, {}, "closed"),
        (by_path, {"data": {"action": {"nested": True}}}, {}, "other"),  # not a scalar: default
        (by_path, b"not json", {}, "other"),
        (plain, {"a": 1}, {"X-GitHub-Event": "push"}, "push"),  # no config: the forge header order
        (plain, {"a": 2}, {}, None),
    ]
    for path, payload, headers, kind in cases:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        code, resp = await curl.post(path, body, headers)
        assert code == 202, resp
        assert resp["created"] == 1 and resp["verified"] is False and resp["trust_mode"] == "token"
        assert _event(stack, resp["event_id"])[0] == kind, (path, payload, headers)

    # Rules see the collector's kind as .kind.
    stack.sql(
        "UPDATE endpoint_webhooks SET routing_rules = %s WHERE id = %s",
        Jsonb([{"id": "tickets", "expr": '.kind == "ticket.created"', "action": {"drop": True}}]),
        wh_header["webhook_id"],
    )
    code, resp = await curl.post(by_header, b'{"b": 1}', {"X-Event-Type": "ticket.created"})
    assert code == 202 and resp["dropped"] is True


async def test_cloudevents_binary_and_structured_modes(stack: Stack, curl: Curl) -> None:
    agent = await stack.agent(queues=["work", "orders"])
    webhook, path = await _collector(agent)
    wid = webhook["webhook_id"]
    stack.sql(
        "UPDATE endpoint_webhooks SET routing_rules = %s WHERE id = %s",
        Jsonb([{"id": "orders", "expr": '.kind == "com.example.order.created"', "action": {"queue": "orders"}}]),
        wid,
    )

    binary = {
        "ce-specversion": "1.0",
        "ce-type": "com.example.order.created",
        "ce-id": "ce-bin-1",
        "ce-source": "/shop/orders",
    }
    code, resp = await curl.post(path, json.dumps({"order": 42}).encode(), binary)
    assert code == 202 and resp["todos"][0]["queue"] == "orders", resp
    kind, ext, _, _, headers, trace = _event(stack, resp["event_id"])
    assert kind == "com.example.order.created" and ext == f"{wid}:ce-bin-1"
    assert headers["ce-source"] == "/shop/orders" and headers["ce-id"] == "ce-bin-1"
    assert trace["rule_id"] == "orders"

    structured = {
        "specversion": "1.0",
        "type": "com.example.order.created",
        "id": "ce-str-1",
        "source": "/shop/orders",
        "datacontenttype": "application/json",
        "data": {"order": 43},
    }
    ce_json = {"Content-Type": "application/cloudevents+json; charset=utf-8"}
    code, resp = await curl.post(path, json.dumps(structured).encode(), ce_json)
    assert code == 202 and resp["todos"][0]["queue"] == "orders", resp
    kind, ext, *_ = _event(stack, resp["event_id"])
    assert kind == "com.example.order.created" and ext == f"{wid}:ce-str-1"

    # The CloudEvents id is the delivery id: a redelivery is a duplicate.
    code, again = await curl.post(path, json.dumps(structured).encode(), ce_json)
    assert code == 202 and again["duplicate"] is True and again["event_id"] == resp["event_id"]


async def test_delivery_ids_from_x_delivery_id_and_webhook_id(stack: Stack, curl: Curl) -> None:
    agent = await stack.agent()
    webhook, path = await _collector(agent)
    for header in ("X-Delivery-Id", "Webhook-Id"):
        code, first = await curl.post(path, b'{"n": 1}', {header: f"{header}-1"})
        assert code == 202 and first["created"] == 1
        code, dup = await curl.post(path, b'{"n": 2}', {header: f"{header}-1"})
        assert dup["duplicate"] is True
        assert _event(stack, first["event_id"])[1] == f"{webhook['webhook_id']}:{header}-1"


async def test_unknown_and_wrong_tokens_are_404(stack: Stack, curl: Curl) -> None:
    agent = await stack.agent()
    webhook, _ = await _collector(agent)
    token = token_of(webhook["ingest_url"])
    wrong = token[:-1] + ("0" if token[-1] != "0" else "1")
    for candidate in (uuid.uuid4().hex, wrong, token.upper(), "short"):
        code, resp = await curl.post(f"/webhooks/w/{candidate}", b"{}")
        assert code == 404 and resp == {"error": "unknown webhook"}
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 0


@pytest.mark.parametrize("fmt", ["sha256=hex", "hex", "base64"])
async def test_optional_hmac_makes_deliveries_verified(stack: Stack, curl: Curl, fmt: str) -> None:
    agent = await stack.agent()
    webhook, path = await _collector(agent)
    configured = await agent.ok(
        "configure_webhook",
        {"webhook_id": webhook["webhook_id"], "collector": {"hmac": {"header": "X-Signature", "format": fmt}}},
    )
    secret = configured["hmac_secret"]
    assert secret.startswith("whsec_") and configured["collector"]["hmac"] == {"header": "x-signature", "format": fmt}
    body = b'{"alert": "cpu"}'
    digest = hmac.new(secret.encode(), body, hashlib.sha256)
    value = {"sha256=hex": "sha256=" + digest.hexdigest(), "hex": digest.hexdigest()}.get(fmt)
    if value is None:
        import base64

        value = base64.b64encode(digest.digest()).decode()

    code, _ = await curl.post(path, body)
    assert code == 401  # unsigned
    # One character inside the digest (index 10 is past "sha256="): a full base64 or hex digit, never padding.
    mismatched = value[:10] + ("0" if value[10] != "0" else "1") + value[11:]
    code, _ = await curl.post(path, body, {"X-Signature": mismatched})
    assert code == 401  # mismatched
    code, resp = await curl.post(path, body, {"X-Signature": value})
    assert code == 202 and resp["verified"] is True and resp["trust_mode"] == "token"
    assert _event(stack, resp["event_id"])[4]["x-signature"] == "«redacted»"

    # Reconfiguring keeps the secret (shown once); rotating mints a new one; dropping hmac returns to token trust.
    again = await agent.ok(
        "configure_webhook",
        {"webhook_id": webhook["webhook_id"], "collector": {"hmac": {"header": "X-Signature", "format": fmt}}},
    )
    assert again["hmac_secret"] is None
    rotated = await agent.ok(
        "configure_webhook",
        {
            "webhook_id": webhook["webhook_id"],
            "collector": {"hmac": {"header": "X-Signature", "format": fmt}},
            "rotate_hmac_secret": True,
        },
    )
    assert rotated["hmac_secret"] not in (None, secret)
    code, _ = await curl.post(path, b'{"alert": "mem"}', {"X-Signature": value})
    assert code == 401
    await agent.ok("configure_webhook", {"webhook_id": webhook["webhook_id"], "collector": {}})
    code, resp = await curl.post(path, b'{"alert": "disk"}')
    assert code == 202 and resp["verified"] is False
    [(sealed, config)] = stack.sql(
        "SELECT collector_secret_ciphertext, config FROM endpoint_webhooks WHERE id = %s", webhook["webhook_id"]
    )
    assert sealed is None and config == {"collector": {}}


async def test_configure_webhook_validation_and_ownership(stack: Stack) -> None:
    agent = await stack.agent()
    other = await stack.agent()
    generic = await agent.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    github = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wid = generic["webhook_id"]
    bad = [
        {"kind": {"mode": "json_path", "value": "data[0].type"}},
        {"kind": {"mode": "json_path", "value": "a..b"}},
        {"kind": {"mode": "header", "value": "bad header"}},
        {"kind": {"mode": "regex", "value": "x"}},
        {"hmac": {"header": "X-Sig", "format": "md5"}},
        {"subject_path": ".payload | keys"},
        {"unknown": True},
    ]
    for collector in bad:
        resp = await agent.call("configure_webhook", {"webhook_id": wid, "collector": collector})
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument", collector

    signed = await agent.call(
        "configure_webhook",
        {"webhook_id": github["webhook_id"], "collector": {"kind": {"mode": "fixed", "value": "x"}}},
    )
    assert signed.status_code == 422
    # A subject path is fine on any source: it keys coalescing.
    ok = await agent.ok("configure_webhook", {"webhook_id": github["webhook_id"], "collector": {"subject_path": "a.b"}})
    assert ok["collector"] == {"subject_path": "a.b"} and ok["hmac_secret"] is None

    foreign = await other.call("configure_webhook", {"webhook_id": wid, "collector": {}})
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "not_found"

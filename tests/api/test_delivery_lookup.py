"""list_webhook_events {delivery_id}: a producer's delivery found by its own id, for every source type."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.conftest import Agent, Stack
from tests.helpers import token_of
from tests.signing import sign_cairn, sign_gitea, sign_github, sign_slack, sign_stripe

# One delivery per call: (body, headers) carrying the given delivery id the way the producer sends it.
Build = Callable[[str, dict[str, Any]], tuple[bytes, dict[str, str]]]


def _secret(webhook: dict[str, Any]) -> bytes:
    return str(webhook["secret"]).encode()


def _github(delivery: str, webhook: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"action": "opened", "n": delivery}).encode()
    return body, {"X-GitHub-Event": "issues", "X-GitHub-Delivery": delivery, **sign_github(_secret(webhook), body)}


def _gitea(delivery: str, webhook: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"action": "opened", "n": delivery}).encode()
    return body, {"X-Gitea-Event": "issues", "X-Gitea-Delivery": delivery, **sign_gitea(_secret(webhook), body)}


def _stripe(delivery: str, webhook: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"id": delivery, "type": "invoice.paid", "data": {"object": {"id": "in_1"}}}).encode()
    return body, sign_stripe(_secret(webhook), body, int(time.time()))


def _slack(delivery: str, webhook: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"type": "event_callback", "event_id": delivery, "event": {"type": "message"}}).encode()
    return body, sign_slack(_secret(webhook), body, int(time.time()))


def _cairn(delivery: str, webhook: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    created = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    doc = {"event_id": delivery, "kind": "artifact.created", "created_at": created, "data": {"id": "art_1"}}
    body = json.dumps(doc).encode()
    return body, {**sign_cairn(_secret(webhook), body), "X-Cairn-Event-Id": delivery}


def _generic_header(name: str) -> Build:
    def build(delivery: str, webhook: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        return json.dumps({"n": delivery}).encode(), {name: delivery}

    return build


def _cloudevent_structured(delivery: str, webhook: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    doc = {"specversion": "1.0", "id": delivery, "source": "/ci", "type": "build.done"}
    return json.dumps(doc).encode(), {"Content-Type": "application/cloudevents+json"}


CASES: list[tuple[str, str, Build]] = [
    ("github", "github", _github),
    ("gitea", "gitea", _gitea),
    ("stripe", "stripe", _stripe),
    ("slack", "slack", _slack),
    ("cairn", "cairn", _cairn),
    ("generic X-Delivery-Id", "generic", _generic_header("X-Delivery-Id")),
    ("generic Webhook-Id", "generic", _generic_header("Webhook-Id")),
    ("generic CloudEvents ce-id", "generic", _generic_header("ce-id")),
    ("generic CloudEvents structured id", "generic", _cloudevent_structured),
]


async def _post(stack: Stack, webhook: dict[str, Any], body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    resp = await stack.http.post(
        f"/webhooks/w/{token_of(webhook['ingest_url'])}",
        content=body,
        headers={"Content-Type": "application/json", **headers},
    )
    assert resp.status_code == 202, resp.text
    out: dict[str, Any] = resp.json()
    return out


async def _lookup(agent: Agent, delivery_id: str, **filters: Any) -> list[str]:
    page = await agent.ok("list_webhook_events", {"delivery_id": delivery_id, **filters})
    return [e["id"] for e in page["events"]]


@pytest.mark.parametrize(("label", "source", "build"), CASES, ids=[c[0] for c in CASES])
async def test_lookup_by_the_producers_delivery_id(stack: Stack, label: str, source: str, build: Build) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": source, "target_queue": "work"})
    wanted, other = f"d-{uuid.uuid4().hex[:12]}", f"d-{uuid.uuid4().hex[:12]}"
    first = await _post(stack, webhook, *build(wanted, webhook))
    second = await _post(stack, webhook, *build(other, webhook))
    assert first["event_id"] != second["event_id"]
    assert await _lookup(agent, wanted) == [first["event_id"]]
    assert await _lookup(agent, other, webhook_id=webhook["webhook_id"]) == [second["event_id"]]
    assert await _lookup(agent, f"  {wanted} ") == [first["event_id"]]  # stripped, as the receiver strips it
    assert await _lookup(agent, "never-sent") == []
    # The id is matched whole, never as a prefix or a pattern.
    assert await _lookup(agent, wanted[:-1]) == []
    assert await _lookup(agent, "d-%") == []


async def test_a_delivery_with_no_producer_id_is_found_by_its_body_hash(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    body = json.dumps({"anonymous": uuid.uuid4().hex}).encode()
    out = await _post(stack, webhook, body, {})
    assert await _lookup(agent, "sha256:" + hashlib.sha256(body).hexdigest()) == [out["event_id"]]


async def test_lookup_returns_the_original_and_its_reroutes_and_nothing_of_another_human(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    original = (await _post(stack, webhook, *_github("gh-42", webhook)))["event_id"]
    # A re-route is a new row naming its original (its own dedup slot, the same delivery).
    reroute = f"ev_{uuid.uuid4().hex[:24]}"
    stack.sql(
        "INSERT INTO events (id, webhook_id, endpoint_id, source, kind, external_id, trust_mode, verified, payload,"
        " payload_size, received_at, routing_trace, disposition, reroute_of)"
        " SELECT %s, webhook_id, endpoint_id, source, kind, external_id || '#reroute:x', trust_mode, verified,"
        " payload, payload_size, received_at, '{}'::jsonb, 'dropped', id FROM events WHERE id = %s",
        reroute,
        original,
    )
    page = await agent.ok("list_webhook_events", {"delivery_id": "gh-42"})
    assert {e["id"] for e in page["events"]} == {original, reroute}
    assert {e["id"]: e["reroute_of"] for e in page["events"]} == {original: None, reroute: original}
    # Other filters still apply; the same id on the human's second webhook is that webhook's delivery.
    assert await _lookup(agent, "gh-42", disposition="dropped") == [reroute]
    second = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    twin = (await _post(stack, second, *_github("gh-42", second)))["event_id"]
    assert set(await _lookup(agent, "gh-42")) == {original, reroute, twin}
    assert await _lookup(agent, "gh-42", webhook_id=second["webhook_id"]) == [twin]
    # Another human's delivery with the same id stays invisible, and their webhook filter is not_found.
    stranger = await stack.agent()
    theirs = await stranger.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    mine = (await _post(stack, theirs, *_github("gh-42", theirs)))["event_id"]
    assert await _lookup(stranger, "gh-42") == [mine]
    assert set(await _lookup(agent, "gh-42")) == {original, reroute, twin}
    resp = await agent.call("list_webhook_events", {"delivery_id": "gh-42", "webhook_id": theirs["webhook_id"]})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


async def test_lookup_pages_by_cursor(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    original = (await _post(stack, webhook, *_github("gh-paged", webhook)))["event_id"]
    for i in range(3):
        stack.sql(
            "INSERT INTO events (id, webhook_id, endpoint_id, source, kind, external_id, trust_mode, verified,"
            " payload, payload_size, received_at, routing_trace, disposition, reroute_of)"
            " SELECT %s, webhook_id, endpoint_id, source, kind, external_id || %s, trust_mode, verified, payload,"
            " payload_size, received_at, '{}'::jsonb, 'routed', id FROM events WHERE id = %s",
            f"ev_r{i}",
            f"#reroute:{i}",
            original,
        )
    first = await agent.ok("list_webhook_events", {"delivery_id": "gh-paged", "limit": 3})
    rest = await agent.ok(
        "list_webhook_events", {"delivery_id": "gh-paged", "limit": 3, "cursor": first["next_cursor"]}
    )
    seen = [e["id"] for e in first["events"] + rest["events"]]
    assert sorted(seen) == sorted([original, "ev_r0", "ev_r1", "ev_r2"]) and rest.get("next_cursor") is None

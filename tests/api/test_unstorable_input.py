"""Hostile text through the real receiver: NUL, lone surrogates and oversized values end decided, never pending.

Each delivery must answer 202 with a decided outcome (a todo minted, or dropped per the rules) inside the
producer's window; on a build without routing.text these answered `202 pending` and retried forever.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from routing.text import MAX_HEADER_VALUE_CHARS, MAX_HEADERS_TOTAL_CHARS, MAX_KIND_CHARS, REPLACEMENT, TRUNCATED
from tests.conftest import Agent, Stack
from tests.helpers import issue_payload, token_of
from tests.signing import sign_cairn, sign_github

FFFD = REPLACEMENT


async def _post(
    stack: Stack, webhook: dict[str, Any], body: bytes, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    resp = await stack.http.post(f"/webhooks/w/{token_of(webhook['ingest_url'])}", content=body, headers=all_headers)
    assert resp.status_code == 202, resp.text
    out: dict[str, Any] = resp.json()
    assert "pending" not in out, out  # decided inside the window, not wedged in retries
    return out


def _github_headers(webhook: dict[str, Any], body: bytes, **extra: str) -> dict[str, str]:
    return {
        "X-GitHub-Event": "issues",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        **sign_github(webhook["secret"].encode(), body),
        **extra,
    }


def _event(stack: Stack, event_id: str) -> dict[str, Any]:
    [row] = stack.sql(
        "SELECT kind, external_id, headers, payload, disposition, routing_trace, content_type FROM events WHERE id = %s",
        event_id,
    )
    return dict(zip(("kind", "external_id", "headers", "payload", "disposition", "trace", "content_type"), row))


def _todo(stack: Stack, todo_id: str) -> dict[str, Any]:
    [row] = stack.sql("SELECT title, kind, payload, work_order, subject_key FROM todos WHERE id = %s", todo_id)
    return dict(zip(("title", "kind", "payload", "work_order", "subject_key"), row))


async def _generic(agent: Agent, collector: dict[str, Any] | None = None) -> dict[str, Any]:
    webhook = await agent.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    if collector is not None:
        await agent.ok("configure_webhook", {"webhook_id": webhook["webhook_id"], "collector": collector})
    return webhook


# --- NUL ------------------------------------------------------------------------------------------------------


async def test_nul_in_a_generic_title_mints_a_todo_with_a_cleaned_title(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _generic(agent)
    body = json.dumps({"title": "a\u0000b"}).encode()
    out = await _post(stack, webhook, body)
    assert out["created"] == 1
    todo = _todo(stack, out["todos"][0]["id"])
    assert todo["title"] == f"generic: a{FFFD}b"
    assert todo["payload"] is None  # jsonb cannot hold NUL: the event's raw bytes are the copy
    assert bytes(_event(stack, out["event_id"])["payload"]) == body


async def test_nul_in_a_kind_from_a_header_or_a_json_path_is_replaced(stack: Stack) -> None:
    agent = await stack.agent()
    by_header = await _generic(agent, {"kind": {"mode": "header", "value": "X-Kind"}})
    out = await _post(stack, by_header, b'{"x": 1}', {"X-Kind": "deploy\x00ed"})
    assert out["created"] == 1
    event = _event(stack, out["event_id"])
    assert event["kind"] == f"deploy{FFFD}ed"
    assert event["headers"]["x-kind"] == f"deploy{FFFD}ed"
    assert _todo(stack, out["todos"][0]["id"])["kind"] == f"deploy{FFFD}ed"

    by_path = await _generic(agent, {"kind": {"mode": "json_path", "value": "event.kind"}})
    out = await _post(stack, by_path, json.dumps({"event": {"kind": "push\u0000x"}}).encode())
    assert out["created"] == 1
    assert _event(stack, out["event_id"])["kind"] == f"push{FFFD}x"


async def test_nul_in_cloudevents_type_and_id_structured_and_binary(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _generic(agent)
    doc = {"specversion": "1.0", "id": "ce\u00001", "source": "/s", "type": "com.example\u0000.built"}
    out = await _post(
        stack, webhook, json.dumps(doc).encode(), {"Content-Type": "application/cloudevents+json; charset=utf-8"}
    )
    assert out["created"] == 1
    event = _event(stack, out["event_id"])
    assert event["kind"] == f"com.example{FFFD}.built"
    assert event["external_id"] == f"{webhook['webhook_id']}:ce{FFFD}1"

    binary = await _post(stack, webhook, b'{"x": 1}', {"ce-id": "b\x001", "ce-type": "t\x00y", "ce-source": "/s"})
    assert binary["created"] == 1
    event = _event(stack, binary["event_id"])
    assert event["kind"] == f"t{FFFD}y"
    assert event["external_id"] == f"{webhook['webhook_id']}:b{FFFD}1"


async def test_nul_in_cairn_fields_reaches_a_work_order_cleaned(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "cairn", "target_queue": "work"})
    await agent.ok(
        "set_webhook_rules",
        {
            "webhook_id": webhook["webhook_id"],
            "rules": [{"id": "art", "expr": '.artifact.title | startswith("Hand")', "action": {"queue": "work"}}],
            "default_action": {"queue": "work", "work_order": True, "coalesce": True},
        },
    )
    created_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    doc = {
        "event_id": "ev\u00001",
        "kind": "artifact\u0000.created",
        "created_at": created_at,
        "data": {"id": "art\u00001", "title": "Hand\u0000off", "tags": ["a\u0000b"], "url": "https://c/\u0000"},
    }
    body = json.dumps(doc).encode()
    out = await _post(stack, webhook, body, sign_cairn(webhook["secret"].encode(), body))
    assert out["created"] == 1
    event = _event(stack, out["event_id"])
    assert event["kind"] == f"artifact{FFFD}.created"
    assert event["external_id"] == f"{webhook['webhook_id']}:ev{FFFD}1"
    assert event["trace"]["rule_id"] == "art"  # the rule read the cleaned projection: "Hand\ufffdoff"

    # A second delivery falls to the default: a work order and a coalescing subject, both cleaned.
    doc2 = {**doc, "event_id": "ev2", "data": {**doc["data"], "title": "Other\u0000"}}  # type: ignore[dict-item]
    body2 = json.dumps(doc2).encode()
    out2 = await _post(stack, webhook, body2, sign_cairn(webhook["secret"].encode(), body2))
    assert out2["created"] == 1
    todo = _todo(stack, out2["todos"][0]["id"])
    subject = todo["work_order"]["subject"]
    assert subject["id"] == f"art{FFFD}1" and subject["title"] == f"Other{FFFD}" and subject["tags"] == [f"a{FFFD}b"]
    assert subject["handle"] == f"mcp://cairn/art{FFFD}1"
    assert todo["subject_key"] == f"cairn:art{FFFD}1"


async def test_nul_and_overlong_header_values_are_cleaned_capped_and_bounded(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _generic(agent)
    headers = {
        "X-Nul": "a\x00b",
        "X-Long": "v" * (MAX_HEADER_VALUE_CHARS * 3),
        "X-Delivery-Id": "n\x00ul",
    }
    headers.update({f"X-Fill-{i}": "f" * 8000 for i in range(12)})  # about 96 KB in all
    out = await _post(stack, webhook, b'{"title": "headers"}', headers)
    assert out["created"] == 1
    event = _event(stack, out["event_id"])
    stored = event["headers"]
    assert stored["x-nul"] == f"a{FFFD}b"
    assert len(stored["x-long"]) == MAX_HEADER_VALUE_CHARS and stored["x-long"].endswith(TRUNCATED)
    assert sum(len(k) + len(v) for k, v in stored.items()) <= MAX_HEADERS_TOTAL_CHARS
    assert "x-fill-11" not in stored  # past the budget: left out, in arrival order
    assert event["external_id"] == f"{webhook['webhook_id']}:n{FFFD}ul"


# --- lone surrogates ------------------------------------------------------------------------------------------


async def test_a_lone_surrogate_in_a_github_issue_routes_on_the_other_fields(stack: Stack) -> None:
    agent = await stack.agent(queues=["work", "lane"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok(
        "set_webhook_rules",
        {
            "webhook_id": webhook["webhook_id"],
            "rules": [
                {
                    "id": "lane",
                    "expr": f'.issue.state == "open" and .issue.title == "{FFFD} fix" and .payload.x == "{FFFD}"',
                    "action": {"queue": "lane", "work_order": True},
                }
            ],
        },
    )
    payload = issue_payload(title="\ud800 fix", x="\udfff")
    body = json.dumps(payload).encode()  # ASCII escapes: the body carries the literal \ud800 escape
    assert b"\\ud800" in body
    out = await _post(stack, webhook, body, _github_headers(webhook, body))
    assert out["created"] == 1 and out["todos"][0]["queue"] == "lane"
    event = _event(stack, out["event_id"])
    assert bytes(event["payload"]) == body  # kept raw, as sent
    assert event["trace"]["rule_id"] == "lane"
    todo = _todo(stack, out["todos"][0]["id"])
    assert todo["payload"] is None  # jsonb could not hold what was sent
    assert todo["title"] == f"github issues opened: acme/app#7 {FFFD} fix"
    assert todo["work_order"]["subject"]["title"] == f"{FFFD} fix"

    # The dry-run of the stored event sees the live delivery's envelope: the same rule matches.
    dry = await agent.ok("test_webhook_rules", {"webhook_id": webhook["webhook_id"], "event_id": out["event_id"]})
    assert dry["trace"]["rule_id"] == "lane"
    assert dry["envelope"]["issue"]["title"] == f"{FFFD} fix" and dry["envelope"]["payload"]["x"] == FFFD
    backtest = await agent.ok("backtest_webhook_rules", {"webhook_id": webhook["webhook_id"]})
    assert json.dumps(backtest).count('"lane"') >= 2  # stored and replayed outcome both name the lane


async def test_a_lone_surrogate_anywhere_in_a_generic_body_is_decided(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _generic(agent, {"subject_path": "ref"})
    await agent.ok(
        "set_webhook_rules",
        {
            "webhook_id": webhook["webhook_id"],
            "rules": [{"id": "drop-noise", "expr": '.payload.title == "noise"', "action": {"drop": True}}],
            "default_action": {"queue": "work", "coalesce": True},
        },
    )
    body = b'{"k\\udc00": ["\\ud83d"], "title": "ok \\ud800", "ref": "r\\udbff"}'
    out = await _post(stack, webhook, body)
    assert out["created"] == 1
    todo = _todo(stack, out["todos"][0]["id"])
    assert todo["title"] == f"generic: ok {FFFD}" and todo["payload"] is None
    assert todo["subject_key"] == f"generic:{webhook['webhook_id']}:r{FFFD}"

    dropped = await _post(stack, webhook, b'{"title": "noise", "junk": "\\udead"}')
    assert dropped["dropped"] is True
    # A valid surrogate pair is one code point, kept as is, and the jsonb copy stays.
    pair = await _post(stack, webhook, b'{"title": "smile \\ud83d\\ude00"}')
    assert _todo(stack, pair["todos"][0]["id"])["payload"] == {"title": "smile \U0001f600"}


# --- oversized headers ----------------------------------------------------------------------------------------


async def test_an_8000_byte_event_header_and_a_long_delivery_id_are_capped_and_ignored(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    body = json.dumps(issue_payload()).encode()
    headers = _github_headers(webhook, body, **{"X-GitHub-Event": "a" * 8000, "X-GitHub-Delivery": "d" * 300})
    out = await _post(stack, webhook, body, headers)
    assert out["created"] == 1
    event = _event(stack, out["event_id"])
    assert len(event["kind"]) == MAX_KIND_CHARS and event["kind"].endswith(TRUNCATED)
    # Over 256 bytes, the delivery id is ignored: the body's hash is the id (SURROUNDING-FACTS).
    assert event["external_id"].startswith(f"{webhook['webhook_id']}:sha256:")
    assert len(event["headers"]["x-github-event"]) == 8000  # under the 8 KiB value cap: stored whole
    todo = _todo(stack, out["todos"][0]["id"])
    assert todo["kind"] == event["kind"] and len(todo["title"]) <= 200

    generic = await _generic(agent)
    out = await _post(stack, generic, b'{"title": "t"}', {"X-Delivery-Id": "x" * 257, "Webhook-Id": "w-1"})
    assert _event(stack, out["event_id"])["external_id"] == f"{generic['webhook_id']}:w-1"


async def test_the_stack_keeps_answering_after_a_burst_of_hostile_deliveries(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _generic(agent)
    bodies = [b'{"title": "\\ud800"}', b'{"title": "a\\u0000"}', b'{"t\\u0000": "\\udc00\\u0000"}'] * 5
    for body in bodies:
        await _post(stack, webhook, body, {"X-Delivery-Id": str(uuid.uuid4())})
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == len(bodies)
    resp = await stack.http.get("/healthz")
    assert resp.status_code == 200


async def test_content_type_is_capped(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _generic(agent)
    resp = await stack.http.post(
        f"/webhooks/w/{token_of(webhook['ingest_url'])}",
        content=b"plain text",
        headers={"Content-Type": "text/plain; x=" + "y" * 20000 + "\x00"},
    )
    assert resp.status_code == 202 and "pending" not in resp.json(), resp.text
    event = _event(stack, resp.json()["event_id"])
    assert len(event["content_type"]) == MAX_HEADER_VALUE_CHARS and event["content_type"].endswith(TRUNCATED)

"""Event history: filters, keyset pagination, confinement to the owner's human, traces and sanitized headers."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Agent, Stack
from tests.helpers import issue_payload, post_github, token_of


async def _webhook(agent: Agent, source_type: str = "github") -> dict[str, Any]:
    return await agent.ok("create_webhook", {"source_type": source_type, "target_queue": "work"})


def _insert_event(
    stack: Stack,
    webhook: dict[str, Any],
    endpoint_id: str,
    received_at: datetime,
    *,
    kind: str = "issues",
    disposition: str = "routed",
) -> str:
    event_id = f"ev_{uuid.uuid4().hex[:24]}"
    stack.sql(
        "INSERT INTO events (id, webhook_id, endpoint_id, source, kind, external_id, trust_mode, verified,"
        " payload, payload_size, received_at, routing_trace, disposition)"
        " VALUES (%s, %s, %s, 'github', %s, %s, 'signed', true, %s, 2, %s, %s, %s)",
        event_id,
        webhook["webhook_id"],
        endpoint_id,
        kind,
        f"{webhook['webhook_id']}:{event_id}",
        b"{}",
        received_at,
        Jsonb({"stage": "default"}),
        disposition,
    )
    return event_id


async def test_a_delivery_is_listed_with_its_trace_and_read_back_sanitized(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent)
    resp = await post_github(
        stack.http,
        webhook,
        issue_payload(),
        delivery="d-1",
        extra_headers={
            "Authorization": "Bearer sekrit-bearer",
            "X-Custom-Token": "sekrit-token",
            "Referer": "https://example.test/hook?access_token=sekrit-query&page=2",
        },
    )
    assert resp.status_code == 202
    delivered = resp.json()

    listed = await agent.ok("list_webhook_events", {})
    assert listed.get("next_cursor") is None
    [summary] = listed["events"]
    assert set(summary) == {
        "id",
        "source",
        "kind",
        "trust_mode",
        "verified",
        "payload_size",
        "received_at",
        "webhook_id",
        "disposition",
        "routing",
        "todo_ids",
        "reroute_of",
        "quarantine",
        "release",
    }
    assert summary["reroute_of"] is None
    assert summary["id"] == delivered["event_id"] and summary["webhook_id"] == webhook["webhook_id"]
    assert (summary["source"], summary["kind"], summary["trust_mode"], summary["verified"]) == (
        "github",
        "issues",
        "signed",
        True,
    )
    assert summary["disposition"] == "routed"
    assert summary["routing"] == {"stage": "default", "cause": "no_match_default", "action": {"queue": "work"}}
    assert summary["todo_ids"] == [t["id"] for t in delivered["todos"]]
    assert summary["payload_size"] == len(json.dumps(issue_payload()).encode())

    event = await agent.ok("get_webhook_event", {"event_id": summary["id"]})
    assert {k: event[k] for k in summary} == summary
    assert event["external_id"] == f"{webhook['webhook_id']}:d-1"
    assert event["content_type"] == "application/json"
    assert event["payload"] == issue_payload() and event["payload_encoding"] == "json"
    headers = event["headers"]
    assert headers["authorization"] == "«redacted»"
    assert headers["x-custom-token"] == "«redacted»"
    assert headers["x-hub-signature-256"] == "«redacted»"
    assert "sekrit-query" not in headers["referer"] and "page=2" in headers["referer"]
    assert headers["x-github-event"] == "issues"
    text = json.dumps(event)
    assert "sekrit" not in text and webhook["secret"] not in text


async def test_payloads_that_are_not_json_come_back_as_text_or_base64(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, "generic")
    url = f"/webhooks/w/{token_of(webhook['ingest_url'])}"
    text = await stack.http.post(url, content=b"plain words", headers={"Content-Type": "text/plain"})
    binary = await stack.http.post(url, content=b"\xff\xfe\x00bin", headers={"X-Delivery-Id": "bin"})
    assert text.status_code == binary.status_code == 202
    got_text = await agent.ok("get_webhook_event", {"event_id": text.json()["event_id"]})
    assert (got_text["payload"], got_text["payload_encoding"]) == ("plain words", "text")
    got_bin = await agent.ok("get_webhook_event", {"event_id": binary.json()["event_id"]})
    assert got_bin["payload_encoding"] == "base64"
    assert base64.b64decode(got_bin["payload"]) == b"\xff\xfe\x00bin"
    assert got_text["trust_mode"] == "token" and got_text["verified"] is False


async def test_filters_by_webhook_kind_disposition_and_since(stack: Stack) -> None:
    human = await stack.human()
    first, second = await stack.agent(human), await stack.agent(human)
    hook_a, hook_b = await _webhook(first), await _webhook(second)
    # Pushes on hook_a are dropped by a rule; the disposition and trace say so.
    stack.sql(
        "UPDATE endpoint_webhooks SET routing_rules = %s WHERE id = %s",
        Jsonb([{"id": "no-pushes", "expr": '.kind == "push"', "action": {"drop": True}}]),
        hook_a["webhook_id"],
    )
    assert (await post_github(stack.http, hook_a, issue_payload(), delivery="a-1")).status_code == 202
    dropped = await post_github(stack.http, hook_a, {"ref": "refs/heads/main"}, delivery="a-2", event="push")
    assert dropped.status_code == 202 and dropped.json()["dropped"] is True
    assert (await post_github(stack.http, hook_b, issue_payload(), delivery="b-1")).status_code == 202

    async def ids(**filters: Any) -> list[str]:
        page = await first.ok("list_webhook_events", filters)
        return [e["external_id"].split(":", 1)[1] for e in [await _detail(first, e["id"]) for e in page["events"]]]

    assert await ids() == ["b-1", "a-2", "a-1"]
    assert await ids(webhook_id=hook_a["webhook_id"]) == ["a-2", "a-1"]
    assert await ids(kind="push") == ["a-2"]
    assert await ids(disposition="dropped") == ["a-2"]
    assert await ids(disposition="routed", webhook_id=hook_b["webhook_id"]) == ["b-1"]
    assert await ids(kind="nothing-like-this") == []

    [dropped_event] = (await first.ok("list_webhook_events", {"disposition": "dropped"}))["events"]
    assert dropped_event["routing"]["rule_id"] == "no-pushes" and dropped_event["todo_ids"] == []

    # since: only events received at or after the instant (an old row inserted directly sits before it).
    old = _insert_event(stack, hook_a, first.endpoint_id, datetime.now(UTC) - timedelta(days=3))
    everything = await first.ok("list_webhook_events", {})
    assert everything["events"][-1]["id"] == old
    cutoff = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    recent = await first.ok("list_webhook_events", {"since": cutoff})
    assert old not in [e["id"] for e in recent["events"]] and len(recent["events"]) == 3


async def _detail(agent: Agent, event_id: str) -> dict[str, Any]:
    return await agent.ok("get_webhook_event", {"event_id": event_id})


async def test_pages_cover_every_event_once_newest_first(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent)
    base = datetime(2030, 1, 1, tzinfo=UTC)
    inserted = []
    for i in range(23):
        # Every third pair shares a timestamp: ties are broken by id, so no page repeats or skips one.
        inserted.append(_insert_event(stack, webhook, agent.endpoint_id, base + timedelta(seconds=i // 2)))
    expected = [r[0] for r in stack.sql("SELECT id FROM events ORDER BY received_at DESC, id DESC")]
    assert sorted(expected) == sorted(inserted)

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        body: dict[str, Any] = {"limit": 5}
        if cursor:
            body["cursor"] = cursor
        page = await agent.ok("list_webhook_events", body)
        pages += 1
        seen.extend(e["id"] for e in page["events"])
        cursor = page.get("next_cursor")
        if not cursor:
            break
        assert len(page["events"]) == 5
        assert "=" not in cursor and "+" not in cursor and "/" not in cursor
        # A row arriving mid-pagination (newer than the cursor) never shifts later pages.
        if pages == 2:
            _insert_event(stack, webhook, agent.endpoint_id, base + timedelta(days=1))
    assert seen == expected and pages == 5

    default = await agent.ok("list_webhook_events", {})
    assert len(default["events"]) == 24 and default.get("next_cursor") is None
    exact = await agent.ok("list_webhook_events", {"limit": 24})
    assert exact.get("next_cursor") is None


@pytest.mark.parametrize(
    "body",
    [
        {"cursor": "!!!not-base64!!!"},
        {"cursor": base64.urlsafe_b64encode(b"garbage").decode()},
        {"cursor": base64.urlsafe_b64encode(b'["not a time", "ev_1"]').decode()},
        {"cursor": base64.urlsafe_b64encode(b'{"a": 1}').decode()},
        {"limit": 0},
        {"limit": 201},
        {"disposition": "lost"},
        {"unknown": 1},
    ],
)
async def test_bad_arguments_are_invalid_argument(stack: Stack, body: dict[str, Any]) -> None:
    agent = await stack.agent()
    resp = await agent.call("list_webhook_events", body)
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument"


async def test_limit_bounds(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent)
    for i in range(3):
        _insert_event(stack, webhook, agent.endpoint_id, datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=i))
    one = await agent.ok("list_webhook_events", {"limit": 1})
    assert len(one["events"]) == 1 and one["next_cursor"]
    assert len((await agent.ok("list_webhook_events", {"limit": 200}))["events"]) == 3


async def test_history_is_confined_to_the_owners_human(stack: Stack) -> None:
    mine = await stack.agent()
    sibling = await stack.agent(mine.human_id)
    theirs = await stack.agent()
    # Friendship grants delivery, never a view of the other human's history.
    for a, b in ((mine, theirs), (theirs, mine)):
        await stack.admin(
            "set_friend_edge", {"from_human_id": a.human_id, "to_human_id": b.human_id, "state": "approved"}
        )
    my_hook, their_hook = await _webhook(mine), await _webhook(theirs)
    # Their webhook routes into my endpoint: I get the todo, not the event history.
    await theirs.ok(
        "add_webhook_route", {"webhook_id": their_hook["webhook_id"], "target_endpoint_id": mine.endpoint_id}
    )
    mine_resp = await post_github(stack.http, my_hook, issue_payload(), delivery="m-1")
    theirs_resp = await post_github(stack.http, their_hook, issue_payload(), delivery="t-1")
    assert mine_resp.status_code == theirs_resp.status_code == 202
    assert mine.endpoint_id in [t["endpoint_id"] for t in theirs_resp.json()["todos"]]

    for viewer in (mine, sibling):
        listed = await viewer.ok("list_webhook_events", {})
        assert [e["id"] for e in listed["events"]] == [mine_resp.json()["event_id"]]
    their_list = await theirs.ok("list_webhook_events", {})
    assert [e["id"] for e in their_list["events"]] == [theirs_resp.json()["event_id"]]

    foreign = await mine.call("get_webhook_event", {"event_id": theirs_resp.json()["event_id"]})
    unknown = await mine.call("get_webhook_event", {"event_id": "ev_000000000000000000000000"})
    assert foreign.status_code == unknown.status_code == 404 and foreign.json() == unknown.json()
    assert foreign.json()["error"]["code"] == "not_found"

    foreign_filter = await mine.call("list_webhook_events", {"webhook_id": their_hook["webhook_id"]})
    unknown_filter = await mine.call("list_webhook_events", {"webhook_id": "wh_000000000000000000000000"})
    assert foreign_filter.status_code == unknown_filter.status_code == 404
    assert foreign_filter.json() == unknown_filter.json()


async def test_a_deleted_webhooks_history_stays_readable_by_its_human(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent)
    resp = await post_github(stack.http, webhook, issue_payload(), delivery="d-1")
    await agent.ok("delete_webhook", {"webhook_id": webhook["webhook_id"]})
    listed = await agent.ok("list_webhook_events", {"webhook_id": webhook["webhook_id"]})
    assert [e["id"] for e in listed["events"]] == [resp.json()["event_id"]]

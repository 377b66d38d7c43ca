"""Evaluation time is the rules' time: a producer-sized parse is never charged to a rule (issue 8, item 1)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from tests.conftest import Stack
from tests.helpers import issue_payload, post_github

CLOSED_DROP = {"id": "closed", "expr": '.issue.state == "closed"', "action": {"drop": True}}


def big_closed_issue(number: int) -> bytes:
    """A closed GitHub issue whose body is about 0.96 MB of 4-byte characters, sent as UTF-8 as GitHub does."""
    payload = issue_payload(number=number, action="closed")
    payload["issue"]["state"] = "closed"
    payload["issue"]["body"] = "😀" * 240_000
    return json.dumps(payload, ensure_ascii=False).encode()


async def test_a_1_mb_closed_issue_is_dropped_without_fault_20_times_under_concurrent_load(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": [CLOSED_DROP]})
    other = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok(
        "set_webhook_rules",
        {"webhook_id": other["webhook_id"], "rules": [{"id": "all", "expr": ".verified", "action": {"queue": "work"}}]},
    )

    async def background(n: int) -> dict[str, Any]:
        resp = await post_github(stack.http, other, issue_payload(number=1000 + n), delivery=str(uuid.uuid4()))
        assert resp.status_code == 202, resp.text
        body: dict[str, Any] = resp.json()
        return body

    event_ids: list[str] = []
    for i in range(20):
        big = post_github(stack.http, webhook, big_closed_issue(i + 1), delivery=f"big-{i}-{uuid.uuid4()}")
        resp, *others = await asyncio.gather(big, *(background(i * 8 + n) for n in range(8)))
        assert resp.status_code == 202, resp.text
        body = resp.json()
        trace = stack.sql("SELECT routing_trace FROM events WHERE id = %s", body["event_id"])
        assert body.get("dropped") is True and body["created"] == 0, (i, body, trace)
        assert all(o["created"] == 1 for o in others), others
        event_ids.append(body["event_id"])
    for event_id in event_ids:
        [(disposition, trace)] = stack.sql("SELECT disposition, routing_trace FROM events WHERE id = %s", event_id)
        assert disposition == "dropped"
        assert trace["stage"] == "rule" and trace["rule_id"] == "closed"
        assert "faults" not in trace, trace

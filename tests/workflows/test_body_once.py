"""The body travels once in a RouteDelivery history, readable when it is JSON, and comes back byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from tests.conftest import Stack
from tests.helpers import issue_payload, post_github
from tests.workflows.replay import replayer
from workflows.route_delivery import workflow_id_for

MARK = "body-once-marker"
RULES = [{"id": "seven", "expr": ".payload.issue.number == 7", "action": {"queue": "work"}}]


def _big_body() -> bytes:
    """About 1 MB of GitHub-shaped JSON, the marker once at its start."""
    payload = issue_payload(title=MARK)
    payload["issue"]["body"] = "lorem ipsum dolor sit amet " * 38_000
    return json.dumps(payload).encode()


async def _history(stack: Stack, webhook: dict[str, Any], delivery: str) -> WorkflowHistory:
    workflow_id = workflow_id_for(webhook["webhook_id"], f"{webhook['webhook_id']}:{delivery}")
    return await stack.temporal.get_workflow_handle(workflow_id).fetch_history()


def _started_input(history: WorkflowHistory) -> dict[str, Any]:
    started = history.events[0].workflow_execution_started_event_attributes
    [payload] = started.input.payloads
    value: dict[str, Any] = json.loads(payload.data)
    return value


def _recorded(history: WorkflowHistory) -> bytes:
    """The history as Temporal stores it (its events' protobuf encoding)."""
    return b"".join(e.SerializeToString() for e in history.events)


@pytest.mark.parametrize("path", ["queue", "auto"])
async def test_a_1mb_json_body_is_recorded_once_readable_and_stored_exactly(stack: Stack, path: str) -> None:
    stack.settings.ingest_wait_seconds = 30.0
    stack.settings.evaluate = path  # type: ignore[assignment]
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": RULES})
    body = _big_body()
    resp = await post_github(stack.http, webhook, body, delivery="big-1")
    assert resp.status_code == 202 and resp.json()["created"] == 1, resp.text
    history = await _history(stack, webhook, "big-1")
    recorded_bytes = _recorded(history)
    size = len(recorded_bytes)
    print(f"\nbody {len(body)} bytes, history {size} bytes ({size / len(body):.2f}x)")
    # Once: the workflow's input holds the body; the regular evaluate activity's recorded input does not.
    assert recorded_bytes.count(MARK.encode()) == 1
    assert size < 1.2 * len(body)
    scheduled = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    if path == "queue":
        [evaluate] = scheduled
        [rules_payload] = evaluate.activity_task_scheduled_event_attributes.input.payloads
        assert len(rules_payload.data) < 2_000 and json.loads(rules_payload.data)["envelope"] is None
    else:
        # The fast path (an idle worker): a local activity, whose input (the envelope) is never recorded; its
        # marker holds only the small verdict.
        assert scheduled == []
        markers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
        [here] = [m for m in markers if b"evaluate_rules_if_free" in m.SerializeToString()]
        assert len(here.SerializeToString()) < 2_000
    # Readable: the input is the body's JSON value, not an opaque string.
    recorded = _started_input(history)
    assert recorded["body_json"]["issue"]["title"] == MARK and recorded.get("body_b64") is None
    # The rule read .payload (the activity rebuilt the envelope from the run's input), and the event keeps the
    # producer's exact bytes.
    [(stored, rule_id)] = stack.sql(
        "SELECT payload, routing_trace->>'rule_id' FROM events WHERE id = %s", resp.json()["event_id"]
    )
    assert bytes(stored) == body and rule_id == "seven"
    await replayer().replay_workflow(history)


async def test_a_body_that_is_not_json_still_routes_and_is_stored_exactly(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    rules = [{"id": "opaque", "expr": ".payload == null and .size > 0", "action": {"queue": "work"}}]
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": rules})
    for delivery, body, form in (
        ("text-1", b"action=opened&number=7", "body_text"),
        ("binary-1", b"\xff\xfe\x00binary", "body_b64"),
        ("loose-json-1", b'{"number": 7.50}', "body_text"),  # JSON whose bytes a dump would not give back
    ):
        resp = await post_github(stack.http, webhook, body, delivery=delivery)
        assert resp.status_code == 202 and resp.json()["created"] == 1, resp.text
        history = await _history(stack, webhook, delivery)
        recorded = _started_input(history)
        assert recorded[form] is not None and recorded.get("body_json") is None, delivery
        [(stored, rule_id)] = stack.sql(
            "SELECT payload, routing_trace->>'rule_id' FROM events WHERE id = %s", resp.json()["event_id"]
        )
        assert bytes(stored) == body
        # The loose JSON body parses: .payload is not null there, so it takes the default.
        assert rule_id == (None if delivery == "loose-json-1" else "opaque"), delivery
        await replayer().replay_workflow(history)

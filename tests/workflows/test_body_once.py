"""What the receiver accepts is routable: any body up to the ingest cap travels to its run bounded, once, exactly.

Issue 29, finding 1: a text body once travelled escaped (control characters six-fold), so 350 KB of them failed
the start with Temporal's blob size limit and 700 KB stalled the inbox relay for every tenant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from routing.delivery import max_input_bytes, workflow_id_for
from tests.conftest import Stack, running_stack
from tests.helpers import NoFreeChild, issue_payload, post_github
from tests.workflows.replay import replayer

MARK = "body-once-marker"
CAP = 1024 * 1024
RULES = [{"id": "seven", "expr": ".payload.issue.number == 7", "action": {"queue": "work"}}]
OPAQUE = [{"id": "opaque", "expr": ".payload == null and .size > 0", "action": {"queue": "work"}}]


def _big_json() -> bytes:
    """About 1 MB of GitHub-shaped JSON, the marker once at its start."""
    payload = issue_payload(title=MARK)
    payload["issue"]["body"] = "lorem ipsum dolor sit amet " * 38_000
    return json.dumps(payload).encode()


async def _history(stack: Stack, webhook: dict[str, Any], delivery: str) -> WorkflowHistory:
    workflow_id = workflow_id_for(webhook["webhook_id"], f"{webhook['webhook_id']}:{delivery}")
    return await stack.temporal.get_workflow_handle(workflow_id).fetch_history()


def _input_size(history: WorkflowHistory) -> int:
    [payload] = history.events[0].workflow_execution_started_event_attributes.input.payloads
    return len(payload.data)


def _recorded(history: WorkflowHistory) -> bytes:
    """The history as Temporal stores it (its events' protobuf encoding)."""
    return b"".join(e.SerializeToString() for e in history.events)


async def _webhook(stack: Stack, rules: list[dict[str, Any]]) -> dict[str, Any]:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": rules})
    return webhook


def _stored(stack: Stack, event_id: str) -> tuple[bytes, str | None]:
    [(stored, rule_id)] = stack.sql("SELECT payload, routing_trace->>'rule_id' FROM events WHERE id = %s", event_id)
    return bytes(stored), rule_id


async def test_a_1mb_json_body_is_recorded_once_and_stored_exactly(stack: Stack) -> None:
    stack.settings.ingest_wait_seconds = 30.0
    webhook = await _webhook(stack, RULES)
    body = _big_json()
    resp = await post_github(stack.http, webhook, body, delivery="big-1")
    assert resp.status_code == 202 and resp.json()["created"] == 1, resp.text
    history = await _history(stack, webhook, "big-1")
    # Once: in the workflow's input. The fast path is a local activity, whose input (the envelope) is never
    # recorded; its marker holds only the small verdict.
    recorded = _recorded(history)
    assert len(recorded) < 1.45 * len(body)
    assert [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED] == []
    markers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    [here] = [m for m in markers if b"evaluate_rules_if_free" in m.SerializeToString()]
    assert len(here.SerializeToString()) < 2_000
    assert _stored(stack, resp.json()["event_id"]) == (body, "seven")
    await replayer().replay_workflow(history)


@pytest.mark.parametrize(
    ("delivery", "body", "content_type"),
    [
        ("ctl-1", b"\x01" * CAP, "text/plain"),  # the finding's reproduction: six bytes each as JSON text
        ("quotes-1", b'"' * CAP, "text/plain"),
        ("binary-1", b"\xff\xfe\x00binary" * 1000, "application/octet-stream"),
        ("loose-json-1", b'{"number": 7.50}', "application/json"),  # JSON whose value dumps to other bytes
    ],
)
async def test_a_hostile_body_up_to_the_cap_routes_and_is_stored_exactly(
    stack: Stack, delivery: str, body: bytes, content_type: str
) -> None:
    stack.settings.ingest_wait_seconds = 30.0
    webhook = await _webhook(stack, OPAQUE)
    resp = await post_github(stack.http, webhook, body, delivery=delivery, extra_headers={"Content-Type": content_type})
    assert resp.status_code == 202, resp.text
    answer = resp.json()
    assert answer.get("pending") is not True and answer["created"] == 1, answer
    history = await _history(stack, webhook, delivery)
    assert _input_size(history) <= max_input_bytes(len(body))
    stored, rule_id = _stored(stack, answer["event_id"])
    assert stored == body
    # The loose JSON body parses: .payload is not null there, so it takes the default.
    assert rule_id == (None if delivery == "loose-json-1" else "opaque")
    assert stack.sql("SELECT count(*) FROM delivery_inbox")[0][0] == 0
    await replayer().replay_workflow(history)


async def test_a_body_whose_envelope_outgrows_it_routes_on_the_fair_queue(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    # 1e999 is 5 bytes of body and 23 once parsed and written again (1.7976931348623157e+308): the queued
    # evaluation gets the delivery (bounded), never an envelope re-serialized from it.
    body = b"[" + b",".join([b"1e999"] * (CAP // 6 - 1)) + b"]"
    assert len(body) <= CAP
    rules = [{"id": "floats", "expr": ".payload | length > 1000", "action": {"queue": "work"}}]
    busy = cast(Any, NoFreeChild(sandbox))
    async with running_stack(tmp_path, database_url, temporal_env.client, busy) as stack:
        stack.settings.ingest_wait_seconds = 30.0
        webhook = await _webhook(stack, rules)
        resp = await post_github(stack.http, webhook, body, delivery="floats-1")
        assert resp.status_code == 202 and resp.json()["created"] == 1, resp.text
        history = await _history(stack, webhook, "floats-1")
        [scheduled] = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
        [queued] = scheduled.activity_task_scheduled_event_attributes.input.payloads
        assert len(queued.data) <= max_input_bytes(len(body)) + 4096
        assert _stored(stack, resp.json()["event_id"]) == (body, "floats")
        await replayer().replay_workflow(history)

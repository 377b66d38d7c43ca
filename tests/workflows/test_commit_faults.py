"""A deterministic commit failure ends the delivery as faulted; a lost connection is retried until it commits."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import psycopg
import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from tests.conftest import Stack
from tests.helpers import issue_payload, post_github, token_of
from tests.workflows.replay import handle_for, replay_and_keep


async def decision_of(handle: WorkflowHandle[Any, Any]) -> tuple[WorkflowExecutionStatus | None, Any]:
    desc = await handle.describe()
    attrs = {k.name: v for k, v in desc.typed_search_attributes}
    return desc.status, attrs.get("SwitchboardDecision")


async def test_a_refused_commit_ends_as_faulted_with_the_error_on_the_trace(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wid = webhook["webhook_id"]
    # A constraint PostgreSQL enforces on every retry: minting this todo can never succeed.
    stack.sql("ALTER TABLE todos ADD CONSTRAINT test_refuses_poison CHECK (title NOT LIKE '%%poison%%')")
    payload = issue_payload(title="poison pill")
    started = time.monotonic()
    resp = await post_github(stack.http, webhook, payload, delivery="refused-1")
    elapsed = time.monotonic() - started
    assert resp.status_code == 202
    body = resp.json()
    assert body["faulted"] is True and body["todos"] == [] and body["created"] == 0, body
    assert "pending" not in body and elapsed < 15, elapsed  # decided inside the producer's window

    [(disposition, trace, kind, headers, payload_size)] = stack.sql(
        "SELECT disposition, routing_trace, kind, headers, payload_size FROM events WHERE id = %s", body["event_id"]
    )
    assert disposition == "faulted" and kind == "issues" and headers["x-github-event"] == "issues"
    assert payload_size == len(json.dumps(payload).encode())
    assert trace["stage"] == "fault" and trace["cause"] == "commit_failed"
    assert trace["error"]["type"] == "CheckViolation"
    assert trace["error"]["message"].startswith("23514 ") and "test_refuses_poison" in trace["error"]["message"]
    assert "poison pill" not in json.dumps(trace)  # the error names the refusal, never the delivery's content
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 0

    handle = handle_for(stack, wid, "refused-1")
    assert await decision_of(handle) == (WorkflowExecutionStatus.COMPLETED, "faulted")
    await replay_and_keep(handle, "route_delivery_commit_faulted.json")

    # A redelivery (a new run of the same workflow id) stays faulted: one event, no todo.
    again = await post_github(stack.http, webhook, payload, delivery="refused-1")
    assert again.json() == {**body, "duplicate": True}
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 1
    listed = await agent.ok("list_webhook_events", {"disposition": "faulted"})
    assert [e["id"] for e in listed["events"]] == [body["event_id"]]


async def test_when_even_the_faulted_row_is_refused_the_workflow_still_ends(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    stack.sql("ALTER TABLE events ADD CONSTRAINT test_refuses_doomed CHECK (external_id NOT LIKE '%%doomed%%')")
    with caplog.at_level(logging.WARNING):
        resp = await post_github(stack.http, webhook, issue_payload(), delivery="doomed-1")
    assert resp.status_code == 202
    body = resp.json()
    assert body["faulted"] is True and body["event_id"] is None and body["todos"] == [], body
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 0
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 0
    handle = handle_for(stack, webhook["webhook_id"], "doomed-1")
    assert await decision_of(handle) == (WorkflowExecutionStatus.COMPLETED, "faulted")
    assert any("could not be stored even as faulted" in r.getMessage() for r in caplog.records)
    await replay_and_keep(handle, "route_delivery_commit_refused_twice.json")


async def test_a_nul_in_a_generic_title_is_decided_in_bounded_time(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    started = time.monotonic()
    resp = await stack.http.post(
        f"/webhooks/w/{token_of(webhook['ingest_url'])}",
        content=b'{"title": "a\\u0000b"}',
        headers={"Content-Type": "application/json", "X-Delivery-Id": "nul-1"},
    )
    assert resp.status_code == 202
    body = resp.json()
    # Once text is sanitized at the boundary this routes; until then the refused commit ends as faulted.
    assert "pending" not in body and time.monotonic() - started < 15, body
    assert body.get("faulted") is True or body["created"] == 1, body
    [(disposition,)] = stack.sql("SELECT disposition FROM events WHERE id = %s", body["event_id"])
    assert disposition == ("faulted" if body.get("faulted") else "routed")


async def test_a_connection_lost_mid_commit_is_retried_and_mints_exactly_one_todo(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    stack.settings.ingest_wait_seconds = 0.5
    with psycopg.connect(stack.database_url, autocommit=True) as blocker:
        # Hold the todos table so the commit stops inside its transaction (event row written, todo pending).
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE todos IN ACCESS EXCLUSIVE MODE")
        resp = await post_github(stack.http, webhook, issue_payload(), delivery="cut-1")
        assert resp.status_code == 202 and resp.json()["pending"] is True
        waiting: list[Any] = []
        for _ in range(200):
            waiting = blocker.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                " AND pid <> pg_backend_pid()"
            ).fetchall()
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting, "the commit never reached the locked table"
        # Cut every other connection to this database: the waiting commit and the pools' idle ones.
        blocker.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        blocker.execute("ROLLBACK")
    result = await asyncio.wait_for(handle_for(stack, webhook["webhook_id"], "cut-1").result(), timeout=60)
    assert result.created == 1 and not result.faulted and result.disposition == "routed"
    assert stack.sql("SELECT count(*), min(disposition) FROM events") == [(1, "routed")]
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1

"""Exactly one answer says created: joiners are duplicates, a retried commit reports its original outcome."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from routing.decision import decide
from routing.delivery import CommitInput, CommitResult, DeliveryInput
from routing.models import Evaluation
from store.crypto import SecretBox
from store.deliveries import DeliveryStore
from store.schedules import ScheduleStore
from store.webhooks import WebhookStore
from tests.conftest import Stack
from tests.helpers import issue_payload, post_github


async def test_twenty_concurrent_redeliveries_exactly_one_answer_says_created(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    payload = issue_payload(number=21)
    answers = await asyncio.gather(*(post_github(stack.http, webhook, payload, delivery="storm") for _ in range(20)))
    assert all(a.status_code == 202 for a in answers), [a.text for a in answers]
    bodies = [a.json() for a in answers]
    created = [b for b in bodies if b["created"] == 1]
    assert len(created) == 1, bodies
    [first] = created
    assert "duplicate" not in first and first["todos"][0]["created"] is True
    joiners = [b for b in bodies if b is not first]
    assert all(b["duplicate"] is True and b["created"] == 0 for b in joiners), joiners
    assert all(b["todos"] == [{**first["todos"][0], "created": False}] for b in joiners)
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 1
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1


def _delivery(webhook: dict[str, Any], endpoint_id: str, delivery_id: str) -> DeliveryInput:
    body = json.dumps(issue_payload()).encode()
    return DeliveryInput(
        webhook_id=webhook["webhook_id"],
        endpoint_id=endpoint_id,
        source="github",
        kind="issues",
        external_id=f"{webhook['webhook_id']}:{delivery_id}",
        trust_mode="signed",
        verified=True,
        verify_detail="ok",
        content_type="application/json",
        headers={},
        body_b64=base64.b64encode(body).decode(),
        source_ip=None,
        received_at=datetime.now(UTC).isoformat(),
    )


async def test_a_commit_retried_after_it_committed_reports_the_original_outcome(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    pool = stack.app.state.services.pool
    grant = await WebhookStore(pool, SecretBox(stack.settings.secret_key or "")).load_grant(webhook["webhook_id"])
    delivery = _delivery(webhook, agent.endpoint_id, "retried")
    decision = decide(grant, Evaluation(), None)
    store = DeliveryStore(pool)

    def commit(run_id: str) -> CommitInput:
        return CommitInput(delivery=delivery, decision=decision, workflow_id="delivery-x", run_id=run_id)

    first = await store.commit(commit("run-1"))
    assert first.created == 1 and not first.duplicate and first.todos[0].created
    retried = await store.commit(commit("run-1"))
    assert retried == first  # the same run: what it made the first time, created counts included
    other = await store.commit(commit("run-2"))
    assert other.duplicate and other.created == 0 and not other.todos[0].created
    assert other.todos[0].id == first.todos[0].id and other.event_id == first.event_id
    [(run_id, workflow_id)] = stack.sql("SELECT workflow_run_id, workflow_id FROM events")
    assert run_id == "run-1" and workflow_id == "delivery-x"
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1


async def test_a_commit_activity_retried_after_commit_answers_created_end_to_end(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = DeliveryStore.commit
    failed: list[str] = []

    async def commit_then_lose_the_answer(self: DeliveryStore, data: CommitInput) -> CommitResult:
        result = await real(self, data)
        if not failed:
            # The transaction committed; the activity's completion is lost (a crash, a timeout): Temporal retries.
            failed.append(data.run_id or "")
            raise ConnectionError("lost after commit")
        return result

    monkeypatch.setattr(DeliveryStore, "commit", commit_then_lose_the_answer)
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    resp = await post_github(stack.http, webhook, issue_payload(), delivery="lost-answer")
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert failed and failed[0]  # the retry happened, inside one run
    assert body["created"] == 1 and "duplicate" not in body and body["todos"][0]["created"] is True
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1


async def test_schedule_fire_counts_are_exact_under_a_retried_commit_and_record(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = DeliveryStore.commit
    failed: list[str] = []

    async def commit_then_lose_the_answer(self: DeliveryStore, data: CommitInput) -> CommitResult:
        result = await real(self, data)
        if not failed:
            failed.append(data.delivery.external_id)
            raise ConnectionError("lost after commit")
        return result

    monkeypatch.setattr(DeliveryStore, "commit", commit_then_lose_the_answer)
    agent = await stack.agent(queues=["work", "cron"])
    made = await agent.ok("create_schedule", {"cron": "0 0 1 1 *", "title": "Nightly", "queue": "cron"})
    await stack.temporal.get_schedule_handle(made["temporal_schedule_id"]).trigger()
    deadline = time.monotonic() + 30
    while True:
        [row] = (await agent.ok("list_schedules", {}))["schedules"]
        if row["fire_count"]:
            break
        assert time.monotonic() < deadline, "the fire was never counted"
        await asyncio.sleep(0.1)
    assert failed, "the commit was not retried"
    assert row["fire_count"] == 1
    [(event_id,)] = stack.sql("SELECT id FROM events WHERE source = 'schedule'")
    assert row["last_event_id"] == event_id
    # record_fire itself retried after it had recorded (its completion lost) counts nothing more.
    schedules = ScheduleStore(stack.app.state.services.pool)
    await schedules.record_fire(made["schedule_id"], event_id, datetime.now(UTC))
    [(count,)] = stack.sql("SELECT fire_count FROM schedules WHERE id = %s", made["schedule_id"])
    assert count == 1

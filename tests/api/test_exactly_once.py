"""Exactly one answer says created: joiners are duplicates, a retried commit reports its original outcome."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from routing.delivery import CommitInput, CommitResult
from store.commits import CommitStore
from store.schedules import ScheduleStore
from tests.conftest import Stack
from tests.helpers import eventually, issue_payload, post_github


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


async def test_a_commit_activity_retried_after_commit_answers_created_end_to_end(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = CommitStore.commit
    failed: list[str] = []

    async def commit_then_lose_the_answer(self: CommitStore, data: CommitInput) -> CommitResult:
        result = await real(self, data)
        if not failed:
            # The transaction committed; the activity's completion is lost (a crash, a timeout): Temporal retries.
            failed.append(data.run_id or "")
            raise ConnectionError("lost after commit")
        return result

    monkeypatch.setattr(CommitStore, "commit", commit_then_lose_the_answer)
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
    real = CommitStore.commit
    failed: list[str] = []

    async def commit_then_lose_the_answer(self: CommitStore, data: CommitInput) -> CommitResult:
        result = await real(self, data)
        if not failed:
            failed.append(data.delivery.external_id)
            raise ConnectionError("lost after commit")
        return result

    monkeypatch.setattr(CommitStore, "commit", commit_then_lose_the_answer)
    agent = await stack.agent(queues=["work", "cron"])
    made = await agent.ok("create_schedule", {"cron": "0 0 1 1 *", "title": "Nightly", "queue": "cron"})
    await stack.temporal.get_schedule_handle(made["temporal_schedule_id"]).trigger()

    async def counted() -> dict[str, Any] | None:
        [row] = (await agent.ok("list_schedules", {}))["schedules"]
        return row if row["fire_count"] else None

    row = await eventually(counted)  # the fire is counted
    assert failed, "the commit was not retried"
    assert row["fire_count"] == 1
    [(event_id,)] = stack.sql("SELECT id FROM events WHERE source = 'schedule'")
    assert row["last_event_id"] == event_id
    # record_fire itself retried after it had recorded (its completion lost) counts nothing more.
    schedules = ScheduleStore(stack.app.state.services.pool)
    await schedules.record_fire(made["schedule_id"], event_id, datetime.now(UTC))
    [(count,)] = stack.sql("SELECT fire_count FROM schedules WHERE id = %s", made["schedule_id"])
    assert count == 1

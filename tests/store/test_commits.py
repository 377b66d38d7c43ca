"""CommitStore.commit: one transaction per delivery, idempotent per run, a duplicate for any other run."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from routing.decision import decide
from routing.delivery import CommitInput, DeliveryInput
from routing.models import Evaluation
from store.commits import CommitStore
from store.crypto import SecretBox
from store.webhooks import WebhookStore
from tests.conftest import Stack
from tests.helpers import issue_payload


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
        body=body,
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
    store = CommitStore(pool)

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


async def test_a_commit_whose_target_has_a_live_todo_names_that_todo_and_mints_nothing(stack: Stack) -> None:
    # The mint travels with the event's insert (one round trip): when it conflicts on the endpoint's live todo for
    # the same idempotency key (a re-route of a delivery whose todo is still open), the same transaction reports
    # the live todo and the event row names it instead of the id it had planned.
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    pool = stack.app.state.services.pool
    grant = await WebhookStore(pool, SecretBox(stack.settings.secret_key or "")).load_grant(webhook["webhook_id"])
    decision = decide(grant, Evaluation(), None)
    store = CommitStore(pool)
    original = _delivery(webhook, agent.endpoint_id, "original")
    first = await store.commit(CommitInput(delivery=original, decision=decision, run_id="run-1"))
    again = original.model_copy(
        update={"external_id": original.external_id + ":reroute:1", "idempotency_key": original.external_id}
    )
    second = await store.commit(CommitInput(delivery=again, decision=decision, run_id="run-2"))
    assert not second.duplicate and second.event_id != first.event_id
    assert second.created == 0 and [t.id for t in second.todos] == [first.todos[0].id]
    assert not second.todos[0].created
    [(todo_ids,)] = stack.sql("SELECT todo_ids FROM events WHERE id = %s", second.event_id)
    assert list(todo_ids) == [first.todos[0].id]
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1

"""Inbox rows are isolated: a start Temporal refuses is a faulted event, a row that keeps failing is parked, and
neither ever holds another row back (issue 29, finding 1)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client import REGISTRY
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from routing.delivery import DeliveryInput
from runtime.relay import PARK_AFTER, InboxRelay
from store.commits import CommitStore
from store.inbox import InboxStore
from tests.conftest import Agent, Stack
from tests.helpers import eventually, issue_payload, post_github

MIB = 1024 * 1024


def count(stack: Stack, query: str, *params: Any) -> int:
    return int(stack.sql(query, *params)[0][0])


def relay(stack: Stack, client: Client) -> InboxRelay:
    services = stack.app.state.services
    settings = stack.settings.model_copy(update={"relay_poll_seconds": 0.05, "relay_log_seconds": 3600.0})
    return InboxRelay(client, InboxStore(services.pool), CommitStore(services.pool), settings)


async def webhook_of(stack: Stack) -> tuple[Agent, dict[str, Any]]:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    return agent, webhook


def delivery_for(agent: Agent, webhook: dict[str, Any], name: str, body: bytes) -> DeliveryInput:
    """A verified delivery of ``webhook`` as the receiver would have put it in the inbox."""
    return DeliveryInput(
        webhook_id=webhook["webhook_id"],
        endpoint_id=agent.endpoint_id,
        source="github",
        kind="issues",
        external_id=f"{webhook['webhook_id']}:{name}",
        trust_mode="signed",
        verified=True,
        verify_detail="ok",
        content_type="application/json",
        headers={"x-github-event": "issues"},
        body=body,
        source_ip=None,
        received_at="2026-12-01T00:00:00+00:00",
    )


async def put(stack: Stack, delivery: DeliveryInput) -> None:
    await InboxStore(stack.app.state.services.pool).put(delivery.workflow_id, delivery, "temporal_unavailable")


def good_body(n: int) -> bytes:
    return json.dumps(issue_payload(number=n)).encode()


async def test_a_start_temporal_refuses_at_ingest_is_a_faulted_event_at_once(stack: Stack) -> None:
    # A body larger than Temporal's payload limit, accepted only because the cap was raised after start-up (the
    # API refuses to start with such a cap: test_an_ingest_cap_temporal_cannot_carry_refuses_to_start).
    stack.settings.ingest_body_max = 4 * MIB
    _, webhook = await webhook_of(stack)
    body = b"x" * (2 * MIB)
    resp = await post_github(stack.http, webhook, body, delivery="refused-1")
    assert resp.status_code == 202, resp.text
    answer = resp.json()
    assert answer["faulted"] is True and answer["created"] == 0 and answer.get("pending") is not True
    [(disposition, trace, stored)] = stack.sql(
        "SELECT disposition, routing_trace, payload FROM events WHERE id = %s", answer["event_id"]
    )
    assert disposition == "faulted" and trace["stage"] == "fault" and trace["cause"] == "start_refused"
    assert bytes(stored) == body
    assert count(stack, "SELECT count(*) FROM delivery_inbox") == 0
    # The producer's retry finds the event: nothing is doubled.
    again = await post_github(stack.http, webhook, body, delivery="refused-1")
    assert again.status_code == 202 and again.json()["event_id"] == answer["event_id"]


def test_an_ingest_cap_temporal_cannot_carry_refuses_to_start(stack: Stack) -> None:
    from api.app import create_app

    too_big = stack.settings.model_copy(update={"ingest_body_max": 2 * MIB})
    try:
        create_app(too_big)
    except ValueError as exc:
        assert "SWITCHBOARD_INGEST_BODY_MAX" in str(exc) and "at most" in str(exc)
    else:
        raise AssertionError("an API whose accepted deliveries could not be started came up")


async def test_a_refused_row_becomes_a_faulted_event_and_the_rows_behind_it_start(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    agent, webhook = await webhook_of(stack)
    await put(stack, delivery_for(agent, webhook, "too-big", b"x" * (2 * MIB)))  # the oldest: probed first
    for n in range(3):
        await put(stack, delivery_for(agent, webhook, f"fine-{n}", good_body(n)))
    task = asyncio.create_task(relay(stack, temporal_env.client).run())
    try:
        await eventually(lambda: count(stack, "SELECT count(*) FROM delivery_inbox") == 0, timeout=60)
        await eventually(lambda: count(stack, "SELECT count(*) FROM events") == 4, timeout=60)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    [(disposition, cause)] = stack.sql(
        "SELECT disposition, routing_trace->>'cause' FROM events WHERE external_id LIKE %s", "%:too-big"
    )
    assert (disposition, cause) == ("faulted", "start_refused")
    assert count(stack, "SELECT count(*) FROM events WHERE disposition = 'routed'") == 3


async def test_a_row_that_keeps_failing_while_temporal_answers_backs_off_then_is_parked(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    agent, webhook = await webhook_of(stack)
    # Over gRPC's message limit: Temporal answers RESOURCE_EXHAUSTED, which also means an overloaded server, so
    # only the health check (or the other rows' starts) tells that this row is the problem.
    poison = delivery_for(agent, webhook, "poison", b"x" * (5 * MIB))
    await put(stack, poison)
    await put(stack, delivery_for(agent, webhook, "fine-0", good_body(0)))
    one = relay(stack, temporal_env.client)
    # A probe of one row (as after an outage): the poison row fails alone, Temporal's health check passes.
    outcome = await one.relay_once(1)
    assert outcome.failed == 1 and outcome.outage is False
    [(attempts, due_in, parked)] = stack.sql(
        "SELECT attempts, extract(epoch FROM release_at - now()), parked_at FROM delivery_inbox WHERE workflow_id = %s",
        poison.workflow_id,
    )
    assert attempts == 1 and due_in > 1 and parked is None  # backed off on its own, not due again at once
    # The next probe takes the row behind it.
    outcome = await one.relay_once(1)
    assert outcome.started == 1
    await eventually(lambda: count(stack, "SELECT count(*) FROM events WHERE disposition = 'routed'") == 1)

    # Its last chance: due now, one failure short of parking.
    stack.sql(
        "UPDATE delivery_inbox SET attempts = %s, release_at = now() WHERE workflow_id = %s",
        PARK_AFTER - 1,
        poison.workflow_id,
    )
    parked_before = REGISTRY.get_sample_value("switchboard_inbox_parked_total") or 0.0
    await one.relay_once(10)
    [(attempts, parked, error)] = stack.sql(
        "SELECT attempts, parked_at, last_error FROM delivery_inbox WHERE workflow_id = %s", poison.workflow_id
    )
    assert attempts == PARK_AFTER and parked is not None and "larger than max" in error
    assert (REGISTRY.get_sample_value("switchboard_inbox_parked_total") or 0.0) == parked_before + 1
    # Parked rows are out of every claim, visible to operators, and counted in the inbox's gauges.
    assert (await one.relay_once(10)).claimed == 0
    stats = await one.inbox.stats()
    assert (stats.parked, stats.depth) == (1, 0)
    listed = await stack.admin("list_parked_deliveries", {})
    [row] = listed["deliveries"]
    assert row["workflow_id"] == poison.workflow_id and row["attempts"] == PARK_AFTER and row["last_error"]
    # An operator requeues it: due again, its failures forgotten.
    await stack.admin("requeue_parked_delivery", {"workflow_id": poison.workflow_id})
    [(attempts, parked)] = stack.sql(
        "SELECT attempts, parked_at FROM delivery_inbox WHERE workflow_id = %s", poison.workflow_id
    )
    assert attempts == 0 and parked is None
    missing = await stack.http.post(
        "/admin/v1/requeue_parked_delivery",
        json={"workflow_id": "delivery-nope"},
        headers={"Authorization": f"Bearer {stack.settings.admin_token}"},
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_a_row_whose_stored_delivery_does_not_parse_is_parked_and_others_start(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    agent, webhook = await webhook_of(stack)
    await put(stack, delivery_for(agent, webhook, "fine-0", good_body(0)))
    stack.sql(
        "INSERT INTO delivery_inbox (workflow_id, webhook_id, delivery, reason, enqueued_at, release_at)"
        " VALUES ('delivery-broken', %s, '{\"not\": \"a delivery\"}', 'admission', now() - interval '1 hour',"
        " now() - interval '1 hour')",
        webhook["webhook_id"],
    )
    outcome = await relay(stack, temporal_env.client).relay_once(10)
    assert outcome.started == 1
    [(parked, error)] = stack.sql(
        "SELECT parked_at, last_error FROM delivery_inbox WHERE workflow_id = 'delivery-broken'"
    )
    assert parked is not None and "does not parse" in error


async def test_while_temporal_is_down_the_probe_rotates_and_nothing_is_counted_or_parked(stack: Stack) -> None:
    agent, webhook = await webhook_of(stack)
    for n in range(3):
        await put(stack, delivery_for(agent, webhook, f"wait-{n}", good_body(n)))
    down = await Client.connect("127.0.0.1:1", data_converter=pydantic_data_converter, lazy=True)
    stuck = relay(stack, down)
    probed = []
    for _ in range(3):
        [(first,)] = stack.sql(
            "SELECT workflow_id FROM delivery_inbox WHERE parked_at IS NULL ORDER BY release_at, enqueued_at LIMIT 1"
        )
        outcome = await stuck.relay_once(1)
        assert outcome.outage is True and outcome.failed == 1
        probed.append(first)
    # Each probe tried a different row: a failed row goes to the back, so no one row can hold the others.
    assert len(set(probed)) == 3
    assert stack.sql("SELECT max(attempts), count(parked_at) FROM delivery_inbox") == [(0, 0)]

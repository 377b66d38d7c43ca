"""Schedules: each fire is a delivery from the reserved source `schedule`, routed by RouteDelivery."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from psycopg.types.json import Jsonb
from temporalio.client import ScheduleOverlapPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Replayer

from activities.schedules import FireInput
from tests.conftest import Agent, Stack
from tests.helpers import eventually
from workflows.route_delivery import RouteDelivery
from workflows.schedules import FireSchedule

T = TypeVar("T")


def _fire_events(stack: Stack) -> list[tuple[Any, ...]]:
    return stack.sql(
        "SELECT id, kind, external_id, verified, trust_mode, routing_trace, todo_ids FROM events"
        " WHERE source = 'schedule' ORDER BY received_at"
    )


async def _next_second() -> None:
    # A fire's slot is its scheduled time to the second; two manual triggers need two slots.
    await asyncio.sleep(1.05 - (time.time() % 1))


async def _schedule(agent: Agent, **body: Any) -> dict[str, Any]:
    return await agent.ok("create_schedule", {"cron": "0 0 1 1 *", "title": "Daily triage", **body})


async def test_each_fire_is_one_event_and_one_todo_with_trace(stack: Stack) -> None:
    agent = await stack.agent(queues=["work", "cron"])
    made = await _schedule(agent, queue="cron", timezone="Europe/Berlin", payload={"repo": "acme/app"})
    assert made["target"] == "queue" and made["webhook_id"] is None and made["queue"] == "cron"

    handle = stack.temporal.get_schedule_handle(made["temporal_schedule_id"])
    desc = await handle.describe()
    assert desc.schedule.spec.time_zone_name == "Europe/Berlin"
    assert desc.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
    assert desc.schedule.policy.catchup_window == timedelta(minutes=10)

    await handle.trigger()
    first = await eventually(lambda: _fire_events(stack))
    await _next_second()
    await handle.trigger()
    both = await eventually(lambda: _fire_events(stack) if len(_fire_events(stack)) == 2 else None)
    assert both[0] == first[0]

    todos = stack.sql("SELECT id, queue, source, kind, title, event_id, routing_trace, state FROM todos ORDER BY seq")
    assert len(todos) == 2
    for (event_id, kind, external_id, verified, trust_mode, trace, todo_ids), todo in zip(both, todos, strict=True):
        assert kind == "schedule.fired" and verified is True and trust_mode == "internal"
        assert external_id.split(":", 1)[1].startswith(f"schedule:{made['schedule_id']}:")
        assert trace == {"stage": "default", "cause": "no_match_default", "action": {"queue": "cron"}}
        # The fire is a queryable event linked both ways to the todo it produced.
        assert todo_ids == [todo[0]] and todo[5] == event_id
        assert todo[1] == "cron" and todo[2] == "schedule" and todo[6] == trace and todo[7] == "pending"
        assert "Daily triage" in todo[4]

    claimed = (await agent.ok("claim_next", {"queue": "cron"}))["todo"]
    assert claimed["payload"]["schedule_id"] == made["schedule_id"]
    assert claimed["payload"]["payload"] == {"repo": "acme/app"}

    listed = await eventually(lambda: _listed_after(agent, 2))
    [row] = listed
    assert row["schedule_id"] == made["schedule_id"] and row["last_event_id"] == both[1][0]


async def _listed_after(agent: Agent, fires: int) -> list[dict[str, Any]] | None:
    rows: list[dict[str, Any]] = (await agent.ok("list_schedules", {}))["schedules"]
    return rows if rows and rows[0]["fire_count"] == fires else None


async def test_two_racing_fires_for_one_slot_make_one_todo(stack: Stack) -> None:
    agent = await stack.agent(queues=["cron"])
    made = await _schedule(agent, queue="cron")
    slot = "2030-01-01T09:00:00Z"
    results = await asyncio.gather(
        *(
            stack.temporal.execute_workflow(
                FireSchedule.run,
                FireInput(schedule_id=made["schedule_id"], scheduled_time=slot),
                id=f"race-{uuid.uuid4().hex[:8]}",
                task_queue=stack.settings.task_queue,
            )
            for _ in range(2)
        )
    )
    assert sum(r.created for r in results) == 1
    assert {r.slot for r in results} == {slot}
    assert stack.sql("SELECT count(*) FROM events WHERE source = 'schedule'")[0][0] == 1
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1
    # Any later fire for the same slot (a retry, a late racer) is the same delivery.
    late_id = f"late-{uuid.uuid4().hex[:8]}"
    late = await stack.temporal.execute_workflow(
        FireSchedule.run,
        FireInput(schedule_id=made["schedule_id"], scheduled_time=slot),
        id=late_id,
        task_queue=stack.settings.task_queue,
    )
    assert late.created == 0 and late.duplicate is True
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1

    # Replay: the fire and the child delivery it started.
    replayer = Replayer(workflows=[FireSchedule, RouteDelivery], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(await stack.temporal.get_workflow_handle(late_id).fetch_history())
    await replayer.replay_workflow(await stack.temporal.get_workflow_handle(late.workflow_id or "").fetch_history())


async def test_webhook_target_fires_through_the_webhooks_rules(stack: Stack) -> None:
    agent = await stack.agent(queues=["work", "cron"])
    webhook = await agent.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    stack.sql(
        "UPDATE endpoint_webhooks SET routing_rules = %s WHERE id = %s",
        Jsonb([{"id": "ticks", "expr": '.source == "schedule" and .verified', "action": {"queue": "cron"}}]),
        webhook["webhook_id"],
    )
    made = await _schedule(agent, webhook_id=webhook["webhook_id"])
    assert made["target"] == "webhook" and made["webhook_id"] == webhook["webhook_id"]
    await stack.temporal.get_schedule_handle(made["temporal_schedule_id"]).trigger()
    [event] = await eventually(lambda: _fire_events(stack))
    assert event[5]["rule_id"] == "ticks"
    [(queue, event_id)] = stack.sql("SELECT queue, event_id FROM todos")
    assert queue == "cron" and event_id == event[0]

    # The webhook cannot be deleted from under its schedule; once the schedule is gone, it can.
    refused = await agent.call("delete_webhook", {"webhook_id": webhook["webhook_id"]})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "conflict"
    assert stack.sql("SELECT state FROM endpoint_webhooks WHERE id = %s", webhook["webhook_id"]) == [("live",)]
    await agent.ok("delete_schedule", {"schedule_id": made["schedule_id"]})
    await agent.ok("delete_webhook", {"webhook_id": webhook["webhook_id"]})


async def test_schedule_scope_validation_and_delete(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    other = await stack.agent()
    foreign = await other.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    cases: list[tuple[dict[str, Any], int]] = [
        ({"queue": "elsewhere"}, 403),  # outside webhook_queues
        ({"webhook_id": foreign["webhook_id"]}, 404),  # not the caller's webhook
        ({"queue": "work", "webhook_id": foreign["webhook_id"]}, 422),
        ({}, 422),
        ({"queue": "work", "cron": "* * *"}, 422),
        ({"queue": "work", "cron": "CRON_TZ=UTC 0 9 * * *"}, 422),
        ({"queue": "work", "timezone": "Mars/Olympus"}, 422),
    ]
    for extra, status in cases:
        resp = await agent.call("create_schedule", {"cron": "0 9 * * 1-5", "title": "x", **extra})
        assert resp.status_code == status, (extra, resp.text)
    assert stack.sql("SELECT count(*) FROM schedules")[0][0] == 0

    made = await _schedule(agent, queue="work", cron="@daily")
    assert (await other.call("delete_schedule", {"schedule_id": made["schedule_id"]})).status_code == 404
    assert (await other.ok("list_schedules", {}))["schedules"] == []

    # The internal webhook a queue target rides on is switchboard's: invisible, and refused at ingest.
    [(internal_token,)] = stack.sql(
        "SELECT w.ingest_token FROM schedules s JOIN endpoint_webhooks w ON w.id = s.webhook_id WHERE s.id = %s",
        made["schedule_id"],
    )
    forged = await stack.http.post(f"/webhooks/w/{internal_token}", json={"schedule_id": made["schedule_id"]})
    assert forged.status_code == 404
    assert (await agent.ok("list_webhooks", {}))["webhooks"] == []
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 0

    done = await agent.ok("delete_schedule", {"schedule_id": made["schedule_id"]})
    assert done == {"schedule_id": made["schedule_id"], "deleted": True}
    with pytest.raises(RPCError):
        await stack.temporal.get_schedule_handle(made["temporal_schedule_id"]).describe()
    assert (await agent.ok("list_schedules", {}))["schedules"] == []
    assert (await agent.call("delete_schedule", {"schedule_id": made["schedule_id"]})).status_code == 404
    # A fire already on its way finds the schedule gone and routes nothing.
    gone = await stack.temporal.execute_workflow(
        FireSchedule.run,
        FireInput(schedule_id=made["schedule_id"]),
        id=f"gone-{uuid.uuid4().hex[:8]}",
        task_queue=stack.settings.task_queue,
    )
    assert gone.status == "gone" and stack.sql("SELECT count(*) FROM events")[0][0] == 0

"""FireSchedule: one tick of an agent's schedule becomes a delivery routed by the same RouteDelivery workflow."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from activities.schedules import (
        FireInput,
        FireResult,
        PrepareFireInput,
        RecordFireInput,
        ScheduleActivities,
    )
    from workflows import search
    from workflows.route_delivery import STORE_RETRY, RouteDelivery

# Set by Temporal on every workflow a Schedule starts: the action's scheduled time (for a trigger, its time).
SCHEDULED_START_TIME = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")


def slot_of(when: datetime) -> str:
    """A fire's slot: its scheduled time in UTC to the second, the granularity a cron can name."""
    return when.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def fire_workflow_id(webhook_id: str, external_id: str) -> str:
    """The RouteDelivery run of one fire; deterministic, so racing fires for one slot meet at one id.

    Distinct from the receiver's ids so no producer-chosen delivery id can occupy a fire's workflow.
    """
    digest = hashlib.sha256(external_id.encode()).hexdigest()[:40]
    return f"fire-{webhook_id}-{digest}"


@workflow.defn(name="FireSchedule")
class FireSchedule:
    """Derive the fire's slot, build its delivery, route it as a child RouteDelivery, note the fire."""

    @workflow.run
    async def run(self, data: FireInput) -> FireResult:
        info = workflow.info()
        slot = data.scheduled_time or slot_of(info.typed_search_attributes.get(SCHEDULED_START_TIME) or info.start_time)
        prepared = await workflow.execute_activity_method(
            ScheduleActivities.prepare_fire,
            PrepareFireInput(schedule_id=data.schedule_id, slot=slot),
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=STORE_RETRY,
        )
        delivery = prepared.delivery
        if delivery is None:
            return FireResult(status="gone", slot=slot)
        child_id = fire_workflow_id(delivery.webhook_id, delivery.external_id)
        try:
            result = await workflow.execute_child_workflow(
                RouteDelivery.run,
                delivery,
                id=child_id,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(search.WEBHOOK_ID, delivery.webhook_id),
                        SearchAttributePair(search.SOURCE, delivery.source),
                        SearchAttributePair(search.KIND, delivery.kind or ""),
                    ]
                ),
                # The delivery outlives its trigger: a terminated fire must not cancel a commit in flight.
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            )
        except WorkflowAlreadyStartedError:
            # Another fire for this slot is routing it right now; the commit's dedup makes one event of both.
            return FireResult(status="joined", slot=slot, workflow_id=child_id)
        if result.status == "committed" and result.event_id and not result.duplicate:
            await workflow.execute_activity_method(
                ScheduleActivities.record_fire,
                RecordFireInput(schedule_id=data.schedule_id, event_id=result.event_id, slot=slot),
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=STORE_RETRY,
            )
        return FireResult(
            status=result.status,
            slot=slot,
            workflow_id=child_id,
            event_id=result.event_id,
            todo_ids=[t.id for t in result.todos],
            created=result.created,
            duplicate=result.duplicate,
        )

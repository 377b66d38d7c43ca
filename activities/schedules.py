"""Activities of FireSchedule: turn a schedule's fire into a synthetic delivery, and note the fire."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pydantic import BaseModel
from temporalio import activity

from activities.errors import application_errors
from routing.delivery import DeliveryInput, summary_line
from store.schedules import SCHEDULE_SOURCE, SCHEDULE_TRUST_MODE, ScheduleStore

FIRE_KIND = "schedule.fired"


class FireInput(BaseModel):
    """The scheduled action's argument; scheduled_time pins the slot (else the fire's scheduled start)."""

    schedule_id: str
    scheduled_time: str | None = None


class FireResult(BaseModel):
    """What one fire produced: the event and todos, or why it produced none."""

    status: str  # committed | gone | joined | no_targets
    slot: str
    workflow_id: str | None = None
    event_id: str | None = None
    todo_ids: list[str] = []
    created: int = 0
    duplicate: bool = False


class PrepareFireInput(BaseModel):
    schedule_id: str
    slot: str


class PrepareFireResult(BaseModel):
    """The synthetic delivery, or None when the schedule is gone."""

    delivery: DeliveryInput | None = None


class RecordFireInput(BaseModel):
    schedule_id: str
    event_id: str
    slot: str


def fire_delivery_id(schedule_id: str, slot: str) -> str:
    """The delivery id of one fire: the same schedule and slot always name the same delivery."""
    return f"schedule:{schedule_id}:{slot}"


class ScheduleActivities:
    """Constructed once in the worker with the pool-backed schedule store."""

    def __init__(self, schedules: ScheduleStore) -> None:
        self.schedules = schedules

    @activity.defn(name="prepare_schedule_fire")
    @application_errors
    async def prepare_fire(self, data: PrepareFireInput) -> PrepareFireResult:
        """The fire as a delivery from the reserved source `schedule`, keyed by schedule id and slot."""
        row = await self.schedules.get(data.schedule_id)
        if row is None:
            return PrepareFireResult(delivery=None)
        document = {
            "schedule_id": row.id,
            "title": row.title,
            "scheduled_time": data.slot,
            "cron": row.cron,
            "timezone": row.timezone,
            "payload": row.payload,
        }
        body = json.dumps(document, separators=(",", ":")).encode()
        delivery = DeliveryInput(
            webhook_id=row.webhook_id,
            endpoint_id=row.endpoint_id,
            source=SCHEDULE_SOURCE,
            kind=FIRE_KIND,
            external_id=f"{row.webhook_id}:{fire_delivery_id(row.id, data.slot)}",
            trust_mode=SCHEDULE_TRUST_MODE,
            # Switchboard itself is the producer: nothing outside could have shaped this delivery.
            verified=True,
            verify_detail="schedule",
            content_type="application/json",
            headers={},
            body=body,
            source_ip=None,
            received_at=datetime.now(UTC).isoformat(),
            summary=summary_line(SCHEDULE_SOURCE, FIRE_KIND, document),
        )
        return PrepareFireResult(delivery=delivery)

    @activity.defn(name="record_schedule_fire")
    @application_errors
    async def record_fire(self, data: RecordFireInput) -> None:
        """Note the fire's event on the schedule row."""
        fired_at = datetime.fromisoformat(data.slot.replace("Z", "+00:00"))
        await self.schedules.record_fire(data.schedule_id, data.event_id, fired_at)

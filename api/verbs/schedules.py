"""Agent verbs of the schedules family: cron triggers routed exactly like external deliveries.

Each schedule is a Temporal Schedule whose action starts FireSchedule; a fire is a delivery from the reserved
source `schedule` through RouteDelivery, so rules, dedup and trace apply identically.
"""

from __future__ import annotations

import json
import logging
import re
import zoneinfo
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from activities.schedules import FireInput
from api.verbs.registry import READ, AnyJson, CliCommand, Context, Hints, VerbInput, verb
from store.errors import DomainError, InvalidArgument
from store.schedules import SCHEDULE_SOURCE, ScheduleRow
from workflows import search

log = logging.getLogger("switchboard.schedules")

FAMILY = "schedules"
MAX_PAYLOAD_BYTES = 64 * 1024
# Skip overlapping fires, and after an outage start at most one late fire: the scheduler processes every
# missed time in one pass, the first one it starts is still running when it reaches the next, so SKIP
# drops the rest. The window bounds how stale that one catch-up fire may be.
CATCHUP_WINDOW = timedelta(minutes=10)
_MACROS = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})
# Five standard fields of digits, names and the operators * / , - ?; nothing that could smuggle a CRON_TZ=
# prefix or a seconds field past the timezone parameter.
_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,\-?]{1,64}")


class Unavailable(DomainError):
    """Temporal did not take the schedule change: the same call may succeed later."""

    code = "unavailable"
    retryable = True


def check_cron(cron: str) -> str:
    """A standard five-field cron expression or @macro, normalized; ValueError otherwise."""
    text = " ".join(cron.split())
    if text.lower() in _MACROS:
        return text.lower()
    fields = text.split(" ")
    if len(fields) != 5 or not all(_CRON_FIELD.fullmatch(f) for f in fields):
        raise ValueError("cron must be five fields (minute hour day-of-month month day-of-week) or an @macro")
    return text


def check_timezone(name: str) -> str:
    """An IANA timezone name; ValueError otherwise."""
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown timezone {name!r}") from exc
    return name


class CreateScheduleInput(VerbInput):
    cron: str = Field(min_length=1, max_length=200, description="five-field cron expression or @daily/@hourly/…")
    timezone: str = Field(default="UTC", min_length=1, max_length=64, description="IANA name, e.g. Europe/Berlin")
    webhook_id: str | None = Field(
        default=None, max_length=1000, description="deliver each fire through this webhook of yours (its rules)"
    )
    queue: str | None = Field(
        default=None, min_length=1, max_length=128, description="or mint each fire's todo on this queue"
    )
    title: str = Field(min_length=1, max_length=200, description="the title of each fire's todo")
    payload: AnyJson = Field(default=None, description="JSON carried in every fire's body under .payload.payload")

    @model_validator(mode="after")
    def _check(self) -> CreateScheduleInput:
        if (self.webhook_id is None) == (self.queue is None):
            raise ValueError("give exactly one of webhook_id or queue")
        self.cron = check_cron(self.cron)
        self.timezone = check_timezone(self.timezone)
        if self.payload is not None and len(json.dumps(self.payload).encode()) > MAX_PAYLOAD_BYTES:
            raise ValueError(f"payload over {MAX_PAYLOAD_BYTES} bytes")
        return self


class ScheduleOut(BaseModel):
    schedule_id: str
    cron: str
    timezone: str
    title: str
    target: Literal["webhook", "queue"]
    webhook_id: str | None = Field(description="the webhook fires go through, for a webhook target")
    queue: str
    payload: AnyJson = Field(default=None, description="the JSON every fire carries under .payload.payload")
    temporal_schedule_id: str = Field(description="open it in the Temporal UI to see fires and pause them")
    created_at: datetime
    fire_count: int
    last_fired_at: datetime | None
    last_event_id: str | None


class ListSchedulesInput(VerbInput):
    pass


class ListSchedulesOutput(BaseModel):
    schedules: list[ScheduleOut]


class DeleteScheduleInput(VerbInput):
    schedule_id: str = Field(max_length=1000, description="one of your schedules (list_schedules)")


class DeleteScheduleOutput(BaseModel):
    schedule_id: str
    deleted: bool = True


def _out(row: ScheduleRow) -> ScheduleOut:
    return ScheduleOut(
        schedule_id=row.id,
        cron=row.cron,
        timezone=row.timezone,
        title=row.title,
        target=row.target,
        # The internal webhook of a queue target is switchboard's plumbing, not the agent's.
        webhook_id=row.webhook_id if row.target == "webhook" else None,
        queue=row.queue,
        payload=row.payload,
        temporal_schedule_id=row.temporal_schedule_id,
        created_at=row.created_at,
        fire_count=row.fire_count,
        last_fired_at=row.last_fired_at,
        last_event_id=row.last_event_id,
    )


def fire_schedule(row: ScheduleRow, task_queue: str) -> Schedule:
    """The Temporal Schedule of one switchboard schedule: cron in its timezone, overlap skip, one catch-up."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            "FireSchedule",
            FireInput(schedule_id=row.id),
            # Temporal appends each fire's scheduled time to this id.
            id=f"schedule-fire-{row.id}",
            task_queue=task_queue,
            typed_search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(search.WEBHOOK_ID, row.webhook_id),
                    SearchAttributePair(search.SOURCE, SCHEDULE_SOURCE),
                ]
            ),
        ),
        spec=ScheduleSpec(cron_expressions=[row.cron], time_zone_name=row.timezone),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=CATCHUP_WINDOW),
    )


def _rpc_timeout(ctx: Context) -> timedelta:
    """How long a schedule call waits for Temporal before answering unavailable."""
    return timedelta(seconds=ctx.services.settings.temporal_start_timeout_seconds)


def _client(ctx: Context) -> Client:
    client = ctx.services.temporal
    if client is None:
        raise Unavailable("scheduling is unavailable, retry later")
    return client


@verb(
    "create_schedule",
    input=CreateScheduleInput,
    output=ScheduleOut,
    family=FAMILY,
    summary="Create a cron schedule whose fires route like deliveries, through your webhook or onto a queue.",
    rate_class="webhook_admin",
)
async def create_schedule(ctx: Context, data: CreateScheduleInput) -> ScheduleOut:
    client = _client(ctx)
    store = ctx.services.schedules
    row = await store.create(
        ctx.caller,
        webhook_id=data.webhook_id,
        queue=data.queue,
        cron=data.cron,
        timezone=data.timezone,
        title=data.title,
        payload=data.payload,
    )
    try:
        await client.create_schedule(
            row.temporal_schedule_id,
            fire_schedule(row, ctx.services.settings.task_queue),
            rpc_timeout=_rpc_timeout(ctx),
        )
    except RPCError as exc:
        await store.discard(row.id)
        if exc.status == RPCStatusCode.INVALID_ARGUMENT:
            raise InvalidArgument(f"Temporal refused the schedule: {exc.message}") from exc
        log.exception("could not create Temporal schedule %s", row.temporal_schedule_id)
        raise Unavailable("scheduling is unavailable, retry later") from exc
    except BaseException:
        await store.discard(row.id)
        raise
    return _out(row)


@verb(
    "list_schedules",
    input=ListSchedulesInput,
    output=ListSchedulesOutput,
    family=FAMILY,
    summary="This endpoint's schedules, with each one's fire count and last event.",
    hints=READ,
    cli=CliCommand(
        "schedules",
        "schedules (as their endpoint)",
        "list",
        "list_schedules: your endpoint's schedules with fire counts",
        columns=("schedule_id", "cron", "timezone", "title", "target", "queue", "fire_count", "last_fired_at"),
    ),
)
async def list_schedules(ctx: Context, data: ListSchedulesInput) -> ListSchedulesOutput:
    rows = await ctx.services.schedules.list(ctx.caller)
    return ListSchedulesOutput(schedules=[_out(r) for r in rows])


@verb(
    "delete_schedule",
    input=DeleteScheduleInput,
    output=DeleteScheduleOutput,
    family=FAMILY,
    summary="Delete a schedule: no further fires; past fires stay as events and todos.",
    rate_class="webhook_admin",
    hints=Hints(destructive=True, idempotent=True),
)
async def delete_schedule(ctx: Context, data: DeleteScheduleInput) -> DeleteScheduleOutput:
    client = _client(ctx)
    store = ctx.services.schedules
    row = await store.owned(ctx.caller, data.schedule_id)
    # Temporal first: if it is unreachable the row stays and a retry finishes the job.
    try:
        await client.get_schedule_handle(row.temporal_schedule_id).delete(rpc_timeout=_rpc_timeout(ctx))
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            log.exception("could not delete Temporal schedule %s", row.temporal_schedule_id)
            raise Unavailable("scheduling is unavailable, retry later") from exc
    await store.delete(ctx.caller, data.schedule_id)
    return DeleteScheduleOutput(schedule_id=data.schedule_id)

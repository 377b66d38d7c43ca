"""Schedules: agent-created cron triggers, each delivered through a webhook as the reserved source `schedule`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from psycopg.types.json import Jsonb
from pydantic import BaseModel

from routing.sources import RESERVED_SOURCES, SOURCES
from store.db import Pool
from store.errors import CeilingExceeded, Forbidden, NotFound, translates_errors
from store.ids import new_id, new_ingest_token
from store.models import Caller

SCHEDULE_SOURCE = "schedule"
SCHEDULE_TRUST_MODE = SOURCES[SCHEDULE_SOURCE].trust_mode
MAX_SCHEDULES_PER_ENDPOINT = 50  # ours

_COLUMNS = (
    "s.id, s.endpoint_id, s.webhook_id, s.target, s.cron, s.timezone, s.title, s.payload, s.temporal_schedule_id,"
    " s.state, s.created_at, s.fire_count, s.last_fired_at, s.last_event_id, w.target_queue AS queue"
)


class ScheduleRow(BaseModel):
    """A schedule with the queue its delivery webhook targets."""

    id: str
    endpoint_id: str
    webhook_id: str
    target: Literal["webhook", "queue"]
    cron: str
    timezone: str
    title: str
    payload: Any = None
    temporal_schedule_id: str
    state: str
    created_at: datetime
    fire_count: int
    last_fired_at: datetime | None
    last_event_id: str | None
    queue: str


def temporal_schedule_id_for(schedule_id: str) -> str:
    """The Temporal Schedule that ticks a switchboard schedule."""
    return f"switchboard-schedule-{schedule_id}"


class ScheduleStore:
    """Schedule rows and, for queue targets, their internal delivery webhooks."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @translates_errors
    async def create(
        self,
        caller: Caller,
        *,
        webhook_id: str | None,
        queue: str | None,
        cron: str,
        timezone: str,
        title: str,
        payload: Any,
    ) -> ScheduleRow:
        """Record a schedule within the caller's scope: its own webhook, or a queue in its webhook ceiling."""
        if queue is not None and queue not in caller.webhook_queues:
            raise Forbidden("queue not allowed by this endpoint's webhook ceiling")
        schedule_id = new_id("sc")
        async with self.pool.connection() as conn, conn.transaction():
            # The endpoint row lock makes the count check atomic, as for webhooks.
            await conn.execute("SELECT id FROM endpoints WHERE id = %s FOR UPDATE", (caller.endpoint_id,))
            cur = await conn.execute(
                "SELECT count(*) AS n FROM schedules WHERE endpoint_id = %s AND state = 'live'",
                (caller.endpoint_id,),
            )
            counted = await cur.fetchone()
            assert counted is not None
            if counted["n"] >= MAX_SCHEDULES_PER_ENDPOINT:
                raise CeilingExceeded(f"at most {MAX_SCHEDULES_PER_ENDPOINT} schedules per endpoint")
            if webhook_id is not None:
                cur = await conn.execute(
                    "SELECT id FROM endpoint_webhooks WHERE id = %s AND endpoint_id = %s AND state = 'live'"
                    " AND NOT source_type = ANY(%s)",
                    (webhook_id, caller.endpoint_id, list(RESERVED_SOURCES)),
                )
                if await cur.fetchone() is None:
                    raise NotFound("unknown webhook")
                target = "webhook"
            else:
                assert queue is not None
                # An internal webhook reuses the whole delivery pipeline (grant, rules, dedup, trace); its
                # token never resolves at ingest, which refuses reserved sources.
                webhook_id = new_id("wh")
                await conn.execute(
                    "INSERT INTO endpoint_webhooks (id, endpoint_id, source_type, target_queue, trust_mode,"
                    " ingest_token) VALUES (%s, %s, %s, %s, %s, %s)",
                    (webhook_id, caller.endpoint_id, SCHEDULE_SOURCE, queue, SCHEDULE_TRUST_MODE, new_ingest_token()),
                )
                target = "queue"
            await conn.execute(
                "INSERT INTO schedules (id, endpoint_id, webhook_id, target, cron, timezone, title, payload,"
                " temporal_schedule_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    schedule_id,
                    caller.endpoint_id,
                    webhook_id,
                    target,
                    cron,
                    timezone,
                    title,
                    Jsonb(payload) if payload is not None else None,
                    temporal_schedule_id_for(schedule_id),
                ),
            )
        found = await self.get(schedule_id)
        assert found is not None
        return found

    @translates_errors
    async def get(self, schedule_id: str) -> ScheduleRow | None:
        """A live schedule by id (any endpoint: the fire activity's view)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLUMNS} FROM schedules s JOIN endpoint_webhooks w ON w.id = s.webhook_id"  # noqa: S608
                " WHERE s.id = %s AND s.state = 'live'",
                (schedule_id,),
            )
            row = await cur.fetchone()
        return ScheduleRow.model_validate(row) if row else None

    @translates_errors
    async def list(self, caller: Caller) -> list[ScheduleRow]:
        """The caller's live schedules, oldest first."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLUMNS} FROM schedules s JOIN endpoint_webhooks w ON w.id = s.webhook_id"  # noqa: S608
                " WHERE s.endpoint_id = %s AND s.state = 'live' ORDER BY s.created_at, s.id",
                (caller.endpoint_id,),
            )
            rows = await cur.fetchall()
        return [ScheduleRow.model_validate(r) for r in rows]

    @translates_errors
    async def owned(self, caller: Caller, schedule_id: str) -> ScheduleRow:
        """One of the caller's live schedules; not_found for anyone else's."""
        row = await self.get(schedule_id)
        if row is None or row.endpoint_id != caller.endpoint_id:
            raise NotFound("unknown schedule")
        return row

    @translates_errors
    async def delete(self, caller: Caller, schedule_id: str) -> str:
        """Mark one of the caller's schedules deleted (fires still in flight find it gone); its Temporal id."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE schedules SET state = 'deleted', deleted_at = now()"
                " WHERE id = %s AND endpoint_id = %s AND state = 'live' RETURNING webhook_id, target,"
                " temporal_schedule_id",
                (schedule_id, caller.endpoint_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFound("unknown schedule")
            if row["target"] == "queue":
                await conn.execute(
                    "UPDATE endpoint_webhooks SET state = 'deleted', deleted_at = now(), updated_at = now()"
                    " WHERE id = %s AND source_type = %s",
                    (row["webhook_id"], SCHEDULE_SOURCE),
                )
        return str(row["temporal_schedule_id"])

    @translates_errors
    async def discard(self, schedule_id: str) -> None:
        """Undo a create whose Temporal Schedule could not be made (nothing has fired)."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute("DELETE FROM schedules WHERE id = %s RETURNING webhook_id, target", (schedule_id,))
            row = await cur.fetchone()
            if row is not None and row["target"] == "queue":
                await conn.execute(
                    "DELETE FROM endpoint_webhooks WHERE id = %s AND source_type = %s",
                    (row["webhook_id"], SCHEDULE_SOURCE),
                )

    @translates_errors
    async def record_fire(self, schedule_id: str, event_id: str, fired_at: datetime) -> None:
        """Note a fire's event on the schedule row (the event itself is the durable record); counted once."""
        async with self.pool.connection() as conn:
            # The fire's row makes a retried record (the activity ran, its completion was lost) count nothing.
            await conn.execute(
                "WITH fire AS (INSERT INTO schedule_fires (schedule_id, event_id) VALUES (%s, %s)"
                " ON CONFLICT DO NOTHING RETURNING schedule_id)"
                " UPDATE schedules SET fire_count = fire_count + 1, last_event_id = %s,"
                " last_fired_at = greatest(last_fired_at, %s) WHERE id = (SELECT schedule_id FROM fire)",
                (schedule_id, event_id, event_id, fired_at),
            )

"""Event history, confined to the webhooks of the caller's human, and its retention."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from store.db import Pool
from store.errors import InvalidArgument, NotFound, translates_errors
from store.models import Caller

EVENT_NOT_FOUND = "unknown event"
WEBHOOK_NOT_FOUND = "unknown webhook"
PRUNE_BATCH = 5000

_SUMMARY_COLUMNS = (
    "ev.id, ev.source, ev.kind, ev.trust_mode, ev.verified, ev.payload_size, ev.received_at, ev.webhook_id,"
    " ev.disposition, ev.routing_trace AS routing, ev.todo_ids, ev.reroute_of"
)

# Visibility is by the webhook's owner, whatever became of the webhook since: a deleted webhook's history
# stays readable by its human until retention prunes it.
_OWNED = """
JOIN endpoint_webhooks w ON w.id = ev.webhook_id
JOIN endpoints e ON e.id = w.endpoint_id
JOIN agents a ON a.id = e.agent_id AND a.owner_human_id = %(human)s
"""

# Newest first, keyset on (received_at, id): a page never repeats or skips a row however many arrive meanwhile.
_FILTERS = """
  AND (%(webhook)s::text IS NULL OR ev.webhook_id = %(webhook)s)
  AND (%(kind)s::text IS NULL OR ev.kind = %(kind)s)
  AND (%(disposition)s::text IS NULL OR ev.disposition = %(disposition)s)
  AND (%(since)s::timestamptz IS NULL OR ev.received_at >= %(since)s)
  AND (%(after_at)s::timestamptz IS NULL OR (ev.received_at, ev.id) < (%(after_at)s::timestamptz, %(after_id)s::text))
ORDER BY ev.received_at DESC, ev.id DESC
LIMIT %(limit)s
"""

_LIST = f"""
SELECT {_SUMMARY_COLUMNS}
FROM events ev {_OWNED}
WHERE true {_FILTERS}
"""  # noqa: S608 - constant fragments only

# Every event of one producer delivery: on each of the human's webhooks, the original whose idempotency key is
# "{webhook_id}:{delivery_id}" (events_external_id_idx), and the re-routes naming it (events_reroute_of_idx).
# Its own statement, so the planner drives from those few rows rather than filtering the whole history.
_LIST_DELIVERY = f"""
WITH originals AS (
    SELECT o.id FROM endpoint_webhooks ow
    JOIN endpoints oe ON oe.id = ow.endpoint_id
    JOIN agents oa ON oa.id = oe.agent_id AND oa.owner_human_id = %(human)s
    JOIN events o ON o.external_id = ow.id || ':' || %(delivery)s AND o.webhook_id = ow.id AND o.reroute_of IS NULL
), delivery AS (
    SELECT id FROM originals
    UNION ALL
    SELECT r.id FROM events r JOIN originals ON r.reroute_of = originals.id
)
SELECT {_SUMMARY_COLUMNS}
FROM events ev {_OWNED}
WHERE ev.id IN (SELECT id FROM delivery) {_FILTERS}
"""  # noqa: S608 - constant fragments only

_GET = f"""
SELECT {_SUMMARY_COLUMNS}, ev.external_id, ev.content_type, ev.headers, ev.payload
FROM events ev {_OWNED}
WHERE ev.id = %(event)s
"""  # noqa: S608 - constant fragments only

_WEBHOOK_OWNED = """
SELECT w.id FROM endpoint_webhooks w
JOIN endpoints e ON e.id = w.endpoint_id
JOIN agents a ON a.id = e.agent_id AND a.owner_human_id = %(human)s
WHERE w.id = %(webhook)s
"""

_PRUNE_EVENTS = """
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE received_at < now() - make_interval(days => %(days)s) LIMIT %(batch)s)
"""

# Terminal only: done, canceled and dead letters (failed with no retry window). Pending, claimed and parked
# retries are live work and never pruned; routing_once is not touched at all.
_PRUNE_TODOS = """
DELETE FROM todos WHERE id IN (
    SELECT id FROM todos
    WHERE (state IN ('done', 'canceled') OR (state = 'failed' AND next_retry_at IS NULL))
      AND coalesce(completed_at, updated_at) < now() - make_interval(days => %(days)s)
    LIMIT %(batch)s)
"""


class EventSummary(BaseModel):
    """An event as the history lists it."""

    id: str
    source: str
    kind: str | None
    trust_mode: str
    verified: bool
    payload_size: int
    received_at: datetime
    webhook_id: str
    disposition: str
    routing: dict[str, Any]
    todo_ids: list[str]
    reroute_of: str | None = None


class EventDetail(EventSummary):
    """One event with what was stored of the request."""

    external_id: str
    content_type: str | None
    headers: dict[str, Any]
    payload: Any
    payload_encoding: str


class EventPage(BaseModel):
    """One page of history and the cursor of the next, when there is one."""

    events: list[EventSummary]
    next_cursor: str | None = None


def encode_cursor(received_at: datetime, event_id: str) -> str:
    """The opaque cursor after a row: base64url of its sort key."""
    raw = json.dumps([received_at.isoformat(), event_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The sort key a cursor names; invalid_argument for anything this module did not mint."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, event_id = json.loads(raw)
        parsed = datetime.fromisoformat(at)
        if not isinstance(event_id, str) or parsed.tzinfo is None:
            raise ValueError("cursor shape")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidArgument("cursor is not one this verb returned") from None
    return parsed, event_id


def decode_payload(body: bytes) -> tuple[Any, str]:
    """The stored body as JSON when it parses, else text, else base64; with the encoding used."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(body).decode(), "base64"
    try:
        return json.loads(text), "json"
    except ValueError:
        return text, "text"


class EventStore:
    """Reads of the event history and its pruning."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @translates_errors
    async def list(
        self,
        caller: Caller,
        *,
        webhook_id: str | None,
        kind: str | None,
        disposition: str | None,
        since: datetime | None,
        limit: int,
        cursor: str | None,
        delivery_id: str | None = None,
    ) -> EventPage:
        """A page of the human's events, newest first; a foreign or unknown webhook filter is not_found.

        With delivery_id, only the events of that producer delivery: its original event and its re-routes.
        """
        after_at, after_id = decode_cursor(cursor) if cursor else (None, None)
        async with self.pool.connection() as conn:
            if webhook_id is not None:
                cur = await conn.execute(_WEBHOOK_OWNED, {"webhook": webhook_id, "human": caller.human_id})
                if await cur.fetchone() is None:
                    raise NotFound(WEBHOOK_NOT_FOUND)
            cur = await conn.execute(
                _LIST if delivery_id is None else _LIST_DELIVERY,
                {
                    "human": caller.human_id,
                    "delivery": delivery_id,
                    "webhook": webhook_id,
                    "kind": kind,
                    "disposition": disposition,
                    "since": since,
                    "after_at": after_at,
                    "after_id": after_id,
                    "limit": limit + 1,
                },
            )
            rows = await cur.fetchall()
        events = [EventSummary.model_validate(r) for r in rows[:limit]]
        more = len(rows) > limit
        return EventPage(
            events=events,
            next_cursor=encode_cursor(events[-1].received_at, events[-1].id) if more else None,
        )

    @translates_errors
    async def get(self, caller: Caller, event_id: str) -> EventDetail:
        """One event of the human's webhooks, with sanitized headers and the decoded payload."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_GET, {"event": event_id, "human": caller.human_id})
            row = await cur.fetchone()
        if row is None:
            raise NotFound(EVENT_NOT_FOUND)
        payload, encoding = decode_payload(bytes(row.pop("payload")))
        return EventDetail(payload=payload, payload_encoding=encoding, **row)

    @translates_errors
    async def prune(self, retention_days: int) -> dict[str, int]:
        """Delete events and terminal todos older than the retention window, in bounded batches."""
        counts = {"events_pruned": 0, "todos_pruned": 0}
        for key, sql in (("todos_pruned", _PRUNE_TODOS), ("events_pruned", _PRUNE_EVENTS)):
            while True:
                async with self.pool.connection() as conn:
                    cur = await conn.execute(sql, {"days": retention_days, "batch": PRUNE_BATCH})
                    n = cur.rowcount
                counts[key] += n
                if n < PRUNE_BATCH:
                    break
        return counts

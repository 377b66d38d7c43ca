"""Event history, confined to the webhooks of the caller's human; the reads a replay makes; its retention."""

from __future__ import annotations

import base64
import binascii
import builtins
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from routing.backtest import StoredEvent, StoredTodo
from routing.models import EventDisposition
from routing.reroute import StoredDelivery
from routing.text import loads_bounded, may_hold_surrogate, replace_lone_surrogates
from routing.trust import QuarantineReason, quarantine_reason
from store.db import Pool
from store.errors import Conflict, InvalidArgument, NotFound, translates_errors
from store.models import Caller

EVENT_NOT_FOUND = "unknown event"
# A quarantined event's review: held for a person, then released (routed again) or dismissed.
QuarantineState = Literal["held", "released", "dismissed"]
WEBHOOK_NOT_FOUND = "unknown webhook"
PRUNE_BATCH = 5000

_SUMMARY_COLUMNS = (
    "ev.id, ev.source, ev.kind, ev.trust_mode, ev.verified, ev.payload_size, ev.received_at, ev.webhook_id,"
    " ev.disposition, ev.routing_trace AS routing, ev.todo_ids, ev.reroute_of, ev.quarantine_state,"
    " ev.reviewed_by, ev.reviewed_at, ev.review_note, ev.release_event_id, ev.release"
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
  AND (%(quarantine_state)s::text IS NULL OR ev.quarantine_state = %(quarantine_state)s)
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

_EVENT_OWNED = f"""
SELECT 1 FROM events ev {_OWNED} WHERE ev.id = %(event)s
"""  # noqa: S608 - constant fragments only

# Replay reads (routing.backtest.History): by webhook, after the caller's ownership of it was checked.
_REPLAY_COLUMNS = (
    "id, webhook_id, source, kind, trust_mode, verified, content_type, headers, payload, payload_size,"
    " received_at, routing_trace, disposition, todo_ids, release"
)
_REPLAY_EVENTS = f"""
SELECT {_REPLAY_COLUMNS} FROM events WHERE webhook_id = %s AND id = ANY(%s)
"""  # noqa: S608 - constant column list
_RECENT_EVENT_IDS = """
SELECT id FROM events WHERE webhook_id = %s ORDER BY received_at DESC, id DESC LIMIT %s
"""
_LANDED_TODOS = "SELECT id, endpoint_id, queue FROM todos WHERE id = ANY(%s)"
_ONCE_CLAIMS = "SELECT once_key, event_id FROM routing_once WHERE webhook_id = %s AND once_key = ANY(%s)"

# Re-route reads (routing.reroute). A delivery's events are its original and the re-routes naming it; its current
# event is the latest of them by created_at (a re-route commits after whatever it follows).
# A released delivery's release travels with its later re-routes: the first event of the delivery that carries one.
_ORIGINAL_COLUMNS = (
    "o.id, o.webhook_id, o.endpoint_id, o.source, o.kind, o.external_id, o.trust_mode, o.verified,"
    " o.verify_detail, o.content_type, o.headers, o.payload, o.source_ip, o.received_at,"
    " (SELECT r.release FROM events r WHERE r.reroute_of = o.id AND r.release IS NOT NULL"
    "  ORDER BY r.created_at, r.id LIMIT 1) AS release"
)
_OWNED_ORIGINAL = f"""
SELECT {_ORIGINAL_COLUMNS}
FROM events ev {_OWNED}
JOIN events o ON o.id = coalesce(ev.reroute_of, ev.id)
WHERE ev.id = %(event)s
"""  # noqa: S608 - constant fragments only
_ORIGINAL = f"""
SELECT {_ORIGINAL_COLUMNS} FROM events o WHERE o.id = %s AND o.webhook_id = %s AND o.reroute_of IS NULL
"""  # noqa: S608 - constant column list
_CURRENT_EVENTS = """
WITH delivery AS (
    SELECT coalesce(ev.reroute_of, ev.id) AS original, ev.id, ev.created_at, ev.received_at, ev.disposition,
           ev.routing_trace
    FROM events ev
    WHERE ev.webhook_id = %(webhook)s
      AND (%(original)s::text IS NULL OR ev.id = %(original)s OR ev.reroute_of = %(original)s)
      AND (%(kind)s::text IS NULL OR ev.kind = %(kind)s)
      AND (%(since)s::timestamptz IS NULL OR ev.received_at >= %(since)s)
      AND (%(until)s::timestamptz IS NULL OR ev.received_at < %(until)s)
), current AS (
    SELECT DISTINCT ON (original) original, id, received_at, disposition, routing_trace
    FROM delivery
    ORDER BY original, created_at DESC, id DESC
)
SELECT original, id FROM current
WHERE (%(disposition)s::text IS NULL OR disposition = %(disposition)s)
  AND (%(rule)s::text IS NULL OR routing_trace->>'rule_id' = %(rule)s)
ORDER BY received_at DESC, original DESC
LIMIT %(limit)s
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


# Quarantine reviews (release_webhook_event, dismiss_webhook_event): an event of the caller's human, locked.
_REVIEW_COLUMNS = (
    "ev.id, ev.webhook_id, ev.disposition, ev.routing_trace, ev.quarantine_state, ev.reviewed_by, ev.reviewed_at,"
    " ev.review_note, ev.release_event_id"
)
_REVIEW_FOR_UPDATE = f"""
SELECT {_REVIEW_COLUMNS}
FROM events ev {_OWNED}
WHERE ev.id = %(event)s
FOR UPDATE OF ev
"""  # noqa: S608 - constant fragments only
_REVIEW = """
UPDATE events SET quarantine_state = %(state)s, reviewed_by = %(by)s, reviewed_at = now(), review_note = %(note)s
WHERE id = %(event)s AND quarantine_state = 'held'
RETURNING reviewed_by, reviewed_at, review_note
"""


class Review(BaseModel):
    """A quarantined event's review: held, or released / dismissed by whom, when, with what note."""

    event_id: str
    webhook_id: str
    state: QuarantineState
    reason: QuarantineReason
    reviewed_by: str | None = None
    reviewed_at: datetime | None = None
    note: str | None = None
    release_event_id: str | None = None


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
    disposition: EventDisposition
    routing: dict[str, Any]
    todo_ids: list[str]
    reroute_of: str | None = None
    quarantine_state: QuarantineState | None = None
    reviewed_by: str | None = None
    reviewed_at: datetime | None = None
    review_note: str | None = None
    release_event_id: str | None = None
    release: dict[str, Any] | None = None


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


def _review(row: Mapping[str, Any]) -> Review:
    return Review(
        event_id=row["id"],
        webhook_id=row["webhook_id"],
        state=row["quarantine_state"],
        reason=quarantine_reason(row["routing_trace"]),
        reviewed_by=row["reviewed_by"],
        reviewed_at=row["reviewed_at"],
        note=row["review_note"],
        release_event_id=row["release_event_id"],
    )


def encode_cursor(received_at: datetime, event_id: str) -> str:
    """The opaque cursor after a row: base64url of its sort key."""
    raw = json.dumps([received_at.isoformat(), event_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The sort key a cursor names; invalid_argument for anything this module did not mint."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, event_id = loads_bounded(raw)
        parsed = datetime.fromisoformat(at)
        if not isinstance(event_id, str) or parsed.tzinfo is None:
            raise ValueError("cursor shape")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidArgument("cursor is not one this verb returned") from None
    return parsed, event_id


def decode_payload(body: bytes) -> tuple[Any, str]:
    """The stored body as JSON when it parses, else text, else base64; with the encoding used.

    Whatever a producer sent, the answer can be written: a body nested past MAX_JSON_DEPTH, or holding a lone
    surrogate escape (`"\\ud800"`, which no UTF-8 answer can carry as a character), is its exact text.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(body).decode(), "base64"
    try:
        value = loads_bounded(text)
    except ValueError:
        return text, "text"
    if may_hold_surrogate(body) and replace_lone_surrogates(value)[1]:
        return text, "text"
    return value, "json"


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
        disposition: EventDisposition | None,
        since: datetime | None,
        limit: int,
        cursor: str | None,
        delivery_id: str | None = None,
        quarantine_state: QuarantineState | None = None,
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
                    "quarantine_state": quarantine_state,
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
    async def stored_event(self, webhook_id: str, event_id: str) -> StoredEvent:
        """One event recorded on this webhook, to replay; an event of any other webhook is not_found."""
        found = await self.stored_events(webhook_id, [event_id])
        if not found:
            raise NotFound(EVENT_NOT_FOUND)
        return found[0]

    # builtins.list: this class's own list() shadows the name in its body.
    @translates_errors
    async def stored_events(self, webhook_id: str, event_ids: Sequence[str]) -> builtins.list[StoredEvent]:
        """The named events of this webhook (payloads included), in the order asked; others are skipped."""
        if not event_ids:
            return []
        async with self.pool.connection() as conn:
            cur = await conn.execute(_REPLAY_EVENTS, (webhook_id, list(event_ids)))
            rows = await cur.fetchall()
        by_id = {r["id"]: StoredEvent.model_validate({**r, "payload": bytes(r["payload"])}) for r in rows}
        return [by_id[i] for i in event_ids if i in by_id]

    @translates_errors
    async def recent_event_ids(self, webhook_id: str, limit: int) -> builtins.list[str]:
        """Ids of the webhook's most recent events, newest first."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_RECENT_EVENT_IDS, (webhook_id, limit))
            rows = await cur.fetchall()
        return [str(r["id"]) for r in rows]

    @translates_errors
    async def landed_todos(self, todo_ids: Sequence[str]) -> dict[str, StoredTodo]:
        """Endpoint and queue of the named todos that still exist (retention may have pruned some)."""
        if not todo_ids:
            return {}
        async with self.pool.connection() as conn:
            cur = await conn.execute(_LANDED_TODOS, (list(todo_ids),))
            rows = await cur.fetchall()
        return {r["id"]: StoredTodo.model_validate(r) for r in rows}

    @translates_errors
    async def once_claims(self, webhook_id: str, keys: Sequence[str]) -> dict[str, str]:
        """once_key → claiming event id, for the keys of this webhook already claimed."""
        if not keys:
            return {}
        async with self.pool.connection() as conn:
            cur = await conn.execute(_ONCE_CLAIMS, (webhook_id, list(keys)))
            rows = await cur.fetchall()
        return {r["once_key"]: r["event_id"] for r in rows}

    @translates_errors
    async def owns_event(self, caller: Caller, event_id: str) -> bool:
        """Whether the event is on a webhook of the caller's human, deleted or not."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_EVENT_OWNED, {"event": event_id, "human": caller.human_id})
            return await cur.fetchone() is not None

    @translates_errors
    async def owns_webhook(self, caller: Caller, webhook_id: str) -> bool:
        """Whether the caller's human owns the webhook, deleted or not (its history stays theirs)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_WEBHOOK_OWNED, {"webhook": webhook_id, "human": caller.human_id})
            return await cur.fetchone() is not None

    @translates_errors
    async def original_delivery(self, caller: Caller, event_id: str) -> StoredDelivery:
        """The original delivery of an event of the human's webhooks (itself, or what a re-route names)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_OWNED_ORIGINAL, {"event": event_id, "human": caller.human_id})
            row = await cur.fetchone()
        if row is None:
            raise NotFound(EVENT_NOT_FOUND)
        return StoredDelivery.model_validate({**row, "payload": bytes(row["payload"])})

    @translates_errors
    async def stored_delivery(self, webhook_id: str, event_id: str) -> StoredDelivery | None:
        """An original event of this webhook as stored, to re-route; None once retention pruned it."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_ORIGINAL, (event_id, webhook_id))
            row = await cur.fetchone()
        return None if row is None else StoredDelivery.model_validate({**row, "payload": bytes(row["payload"])})

    @translates_errors
    async def current_events(
        self,
        webhook_id: str,
        *,
        original: str | None = None,
        disposition: EventDisposition | None = None,
        rule_id: str | None = None,
        kind: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 1,
    ) -> builtins.list[tuple[str, str]]:
        """(original, current event) of the webhook's deliveries, newest first; filters read the current event.

        disposition and rule_id are those of the current outcome (a dropped delivery re-routed since is routed
        now); kind, since and until (exclusive) are the delivery's own. Call after checking ownership.
        """
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _CURRENT_EVENTS,
                {
                    "webhook": webhook_id,
                    "original": original,
                    "disposition": disposition,
                    "rule": rule_id,
                    "kind": kind,
                    "since": since,
                    "until": until,
                    "limit": limit,
                },
            )
            rows = await cur.fetchall()
        return [(str(r["original"]), str(r["id"])) for r in rows]

    @translates_errors
    async def review(
        self, caller: Caller, event_id: str, state: Literal["released", "dismissed"], by: str, note: str | None
    ) -> Review:
        """Release or dismiss a held quarantined event of the human's webhooks, once.

        A repeat of the same decision answers the review as it stands (a second release mints nothing: its run
        finds the release's dedup slot taken); the other decision, or an event that is not quarantined, is a
        conflict; another human's event and an unknown id are the same not_found.
        """
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_REVIEW_FOR_UPDATE, {"event": event_id, "human": caller.human_id})
            row = await cur.fetchone()
            if row is None:
                raise NotFound(EVENT_NOT_FOUND)
            if row["disposition"] != "quarantined":
                raise Conflict(f"event {event_id} is {row['disposition']}, not quarantined")
            current = row["quarantine_state"]
            if current == "held":
                cur = await conn.execute(_REVIEW, {"state": state, "by": by, "note": note, "event": event_id})
                done = await cur.fetchone()
                assert done is not None
                row.update(done, quarantine_state=state)
            elif current != state:
                raise Conflict(f"event {event_id} was already {current} by {row['reviewed_by']}")
        return _review(row)

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

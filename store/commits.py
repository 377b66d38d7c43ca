"""The commit of one routed delivery: event, once-claim, todos and doorbell in one transaction."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, AsyncCursor
from psycopg.types.json import Jsonb

from routing.delivery import CommitInput, CommitResult, DeliveryInput, FaultCommitInput, TodoRef
from routing.models import Decision
from routing.text import clean_text
from routing.titles import todo_title
from routing.trust import quarantine_reason
from store.db import Pool
from store.errors import is_transient, translates_errors
from store.ids import new_id

DOORBELL_CHANNEL = "switchboard_todos"

_FIND_EVENT = """
SELECT id, disposition, todo_ids, routing_trace, workflow_run_id FROM events
WHERE endpoint_id = %s AND source = %s AND external_id = %s
"""

_INSERT_EVENT = """
INSERT INTO events (id, webhook_id, endpoint_id, source, kind, external_id, trust_mode, verified,
                    verify_detail, content_type, headers, payload, payload_size, source_ip, received_at,
                    routing_trace, disposition, workflow_id, workflow_run_id, todo_ids, reroute_of,
                    quarantine_state, release)
VALUES (%(id)s, %(webhook_id)s, %(endpoint_id)s, %(source)s, %(kind)s, %(external_id)s, %(trust_mode)s,
        %(verified)s, %(verify_detail)s, %(content_type)s, %(headers)s, %(payload)s, %(payload_size)s,
        %(source_ip)s, %(received_at)s, %(routing_trace)s, %(disposition)s, %(workflow_id)s, %(workflow_run_id)s,
        %(todo_ids)s, %(reroute_of)s, %(quarantine_state)s, %(release)s)
ON CONFLICT (endpoint_id, source, external_id) DO NOTHING
RETURNING id
"""

# One statement mints every target's todo and rings the doorbell for each new one (delivered at commit).
# The notification carries ids only (two generated ids, well under pg_notify's 8,000-byte limit whatever the
# delivery held); the listener reads what a ring shows from the todos table (store/doorbell.py).
_INSERT_TODOS = """
WITH ins AS (
    INSERT INTO todos (id, endpoint_id, queue, source, kind, title, payload, event_id, idempotency_key,
                       routing_trace, work_order, subject_key)
    SELECT t.id, t.endpoint_id, t.queue, %(source)s, %(kind)s, %(title)s, %(payload)s, %(event_id)s,
           %(idempotency_key)s, %(routing_trace)s, %(work_order)s, %(subject_key)s
    FROM unnest(%(ids)s::text[], %(endpoints)s::text[], %(queues)s::text[]) AS t(id, endpoint_id, queue)
    -- Only under this transaction's own event row: the commit sends this with the event's insert, before it
    -- knows whether the insert took the dedup slot, and a duplicate must mint nothing.
    WHERE EXISTS (SELECT 1 FROM events WHERE id = %(event_id)s)
    ON CONFLICT DO NOTHING
    RETURNING id, endpoint_id, queue
)
SELECT ins.id, pg_notify(%(channel)s, json_build_object('todo_id', ins.id, 'endpoint_id', ins.endpoint_id)::text)
    AS rang
FROM ins
"""

# Coalescing: one transaction-scoped lock per (endpoint, queue, subject) serializes concurrent deliveries about
# the same entity, so two of them cannot both find no open todo and both mint; the row lock then holds the
# open todo against a concurrent complete until this delivery has attached to it.
_LOCK_SUBJECT = "SELECT pg_advisory_xact_lock(%s)"
_FIND_OPEN_SUBJECT = """
SELECT id FROM todos
WHERE endpoint_id = %s AND queue = %s AND subject_key = %s AND state IN ('pending', 'claimed')
ORDER BY seq LIMIT 1
FOR UPDATE
"""
_ATTACH_UPDATE = """
UPDATE todos SET update_event_ids = array_append(update_event_ids, %s), updated_at = now() WHERE id = %s
"""

# A once-key is claimed by the first event that routes with it; a later one is recorded as a repeat.
_CLAIM_ONCE = (
    "INSERT INTO routing_once (webhook_id, once_key, event_id) VALUES (%s, %s, %s)"
    " ON CONFLICT DO NOTHING RETURNING event_id"
)
# A release's event names itself on the quarantined event it released (the first one to commit; a second
# release of the same event finds the dedup slot taken before it gets here).
_LINK_RELEASE = "UPDATE events SET release_event_id = %s WHERE id = %s AND release_event_id IS NULL"
_MARK_REPEAT = "UPDATE events SET disposition = 'repeat', routing_trace = %s, todo_ids = '{}' WHERE id = %s"
_SET_TODOS = "UPDATE events SET todo_ids = %s WHERE id = %s"
_SET_TODOS_AND_TRACE = "UPDATE events SET todo_ids = %s, routing_trace = %s WHERE id = %s"
_FIND_TODOS = "SELECT id, endpoint_id, queue, event_id FROM todos WHERE id = ANY(%s)"

_FIND_LIVE_TODO = """
SELECT id FROM todos WHERE endpoint_id = %s AND idempotency_key = %s
  AND state NOT IN ('done', 'canceled') AND NOT (state = 'failed' AND next_retry_at IS NULL)
"""


def _subject_lock(endpoint_id: str, queue: str, subject: str) -> int:
    """The advisory lock id of one (endpoint, queue, subject); a collision only serializes more."""
    digest = hashlib.sha256("\0".join(("coalesce", endpoint_id, queue, subject)).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _jsonb_payload(value: Any, body: bytes, lossy: bool) -> Jsonb | None:
    # A body whose lone surrogates were replaced (routing.text) is not what the producer sent: the event's
    # raw bytes are the only copy, as for a non-JSON body.
    if value is None or lossy:
        return None
    # jsonb cannot hold NUL characters; such payloads stay available raw on the event. A NUL can only arrive
    # escaped, so bodies without that escape skip the walk.
    if b"\\u0000" in body and _has_nul(value):
        return None
    return Jsonb(value)


# What PostgreSQL text cannot hold (NUL) or encode (lone surrogates), replaced only on the faulted path.
def _storable(text: str | None) -> str | None:
    return None if text is None else clean_text(text)


def _event_row(
    d: DeliveryInput,
    event_id: str,
    trace: dict[str, Any],
    disposition: str,
    workflow_id: str | None,
    todo_ids: list[str],
    body: bytes,
    *,
    storable: bool = False,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Parameters of _INSERT_EVENT; with storable, producer-derived text is made something PostgreSQL accepts."""

    def text(value: str | None) -> str | None:
        return _storable(value) if storable else value

    headers = {text(k) or "": text(v) or "" for k, v in d.headers.items()}
    return {
        "id": event_id,
        "webhook_id": d.webhook_id,
        "endpoint_id": d.endpoint_id,
        "source": d.source,
        "kind": text(d.kind),
        "external_id": text(d.external_id),
        "trust_mode": d.trust_mode,
        "verified": d.verified,
        "verify_detail": text(d.verify_detail),
        "content_type": text(d.content_type),
        "headers": Jsonb(headers),
        "payload": body,
        "payload_size": len(body),
        "source_ip": text(d.source_ip),
        "received_at": datetime.fromisoformat(d.received_at),
        "routing_trace": Jsonb(trace),
        "disposition": disposition,
        "workflow_id": workflow_id,
        "workflow_run_id": run_id,
        "todo_ids": todo_ids,
        "reroute_of": d.reroute_of,
        "quarantine_state": "held" if disposition == "quarantined" else None,
        "release": Jsonb(d.release.model_dump()) if d.release is not None else None,
    }


def _traced(trace: dict[str, Any], d: DeliveryInput) -> dict[str, Any]:
    """The trace stored on the event and its todos; a re-route names the event it routed again, a release who
    released which quarantined event."""
    if d.reroute_of:
        trace["reroute_of"] = d.reroute_of
    if d.release is not None:
        trace["release"] = d.release.model_dump()
    return trace


class CommitStore:
    """Writes the outcome of routing; idempotent, so Temporal may retry it freely."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @translates_errors
    async def commit(self, data: CommitInput) -> CommitResult:
        """Persist the event and its todos once; a redelivery returns what the first delivery made."""
        d, decision = data.delivery, data.decision
        base: dict[str, Any] = {"verified": d.verified, "trust_mode": d.trust_mode}
        event_id = new_id("ev")
        trace = _traced(dict(decision.trace), d)
        rule_id = trace.get("rule_id")
        disposition = decision.disposition
        body = d.body
        # Todo ids are minted up front so the event row names them from its first write.
        planned = [(new_id("td"), t.endpoint_id, t.queue) for t in decision.todos] if disposition == "routed" else []
        # Pipelined: BEGIN, the event and (when nothing has to be read first) the todos travel in one round trip,
        # and COMMIT in a second, where one statement per round trip took four; same transaction, same outcome.
        async with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
            row = _event_row(
                d, event_id, trace, disposition, data.workflow_id, [p[0] for p in planned], body, run_id=data.run_id
            )
            inserted = await conn.execute(_INSERT_EVENT, row)
            # A once-key or coalescing decides between the event's insert and the mint; otherwise the mint can go
            # with the insert (it mints nothing unless the insert took the dedup slot: _INSERT_TODOS).
            coalescing = bool(decision.coalesce and decision.subject_key)
            eager = planned if disposition == "routed" and not decision.once_key and not coalescing else []
            minting = await self._send_mint(conn, d, decision, event_id, trace, body, eager) if eager else None
            if await inserted.fetchone() is None:
                # The dedup slot is spent: by this very run (a retry of a commit that had committed reports the
                # original outcome), or by an earlier delivery or another run (a duplicate: report what it made).
                again = await self._existing(conn, d.endpoint_id, d.source, d.external_id, data.run_id)
                assert again is not None
                return CommitResult(**again, **base)
            if d.release is not None and d.release.event_id:
                await conn.execute(_LINK_RELEASE, (event_id, d.release.event_id))
            if disposition == "dropped":
                return CommitResult(event_id=event_id, dropped=True, disposition="dropped", rule_id=rule_id, **base)
            if disposition == "faulted":
                # on_fault "hold": the event and its faults are the whole outcome; no once-key, no todo, no ring.
                return CommitResult(event_id=event_id, faulted=True, disposition="faulted", rule_id=rule_id, **base)
            if disposition == "quarantined":
                # Held for a person: stored (and listed) with no once-key, no todo and no ring until released.
                return CommitResult(
                    event_id=event_id,
                    quarantined=True,
                    disposition="quarantined",
                    rule_id=rule_id,
                    quarantine_reason=quarantine_reason(trace),
                    **base,
                )
            if decision.once_key and not await self._claim_once(conn, d.webhook_id, decision.once_key, event_id, trace):
                return CommitResult(event_id=event_id, repeat=True, disposition="repeat", rule_id=rule_id, **base)
            if minting is not None:
                refs = await self._minted(conn, d, minting, planned)
                if [r.id for r in refs] != [p[0] for p in planned]:
                    await conn.execute(_SET_TODOS, ([t.id for t in refs], event_id))
            else:
                refs = await self._place_todos(conn, d, decision, event_id, trace, body, planned)
            return CommitResult(
                event_id=event_id,
                todos=refs,
                created=sum(1 for t in refs if t.created),
                disposition="routed",
                rule_id=rule_id,
                **base,
            )

    async def _insert_event(self, conn: AsyncConnection[Any], row: dict[str, Any]) -> bool:
        """Insert the event row; False when its dedup slot (endpoint, source, external id) is already taken."""
        cur = await conn.execute(_INSERT_EVENT, row)
        return await cur.fetchone() is not None

    async def _claim_once(
        self, conn: AsyncConnection[Any], webhook_id: str, once_key: str, event_id: str, trace: dict[str, Any]
    ) -> bool:
        """Claim the once-key for this event; when an earlier event holds it, this one becomes a repeat."""
        cur = await conn.execute(_CLAIM_ONCE, (webhook_id, once_key, event_id))
        if await cur.fetchone() is not None:
            return True
        trace["once"] = "repeat"
        await conn.execute(_MARK_REPEAT, (Jsonb(trace), event_id))
        return False

    async def _place_todos(
        self,
        conn: AsyncConnection[Any],
        d: DeliveryInput,
        decision: Decision,
        event_id: str,
        trace: dict[str, Any],
        body: bytes,
        planned: list[tuple[str, str, str]],
    ) -> list[TodoRef]:
        """Each target's todo, in target order: its open todo for the subject (coalesce), or a new one."""
        coalesced: dict[str, TodoRef] = {}
        if decision.coalesce and decision.subject_key:
            coalesced = await self._coalesce(conn, decision.subject_key, event_id, planned)
            if coalesced:
                attached = [coalesced[p[1]].id for p in planned if p[1] in coalesced]
                trace["coalesced"] = {
                    "todo_id": attached[0],
                    **({"todo_ids": attached} if len(attached) > 1 else {}),
                }
        to_mint = [p for p in planned if p[1] not in coalesced]
        minted = {r.endpoint_id: r for r in await self._mint(conn, d, decision, event_id, trace, body, to_mint)}
        # Target order, whichever way each target's todo came about.
        refs = [r for p in planned if (r := coalesced.get(p[1]) or minted.get(p[1])) is not None]
        # The event row named the planned ids; it names what each target got instead where that differs.
        if coalesced:
            await conn.execute(_SET_TODOS_AND_TRACE, ([t.id for t in refs], Jsonb(trace), event_id))
        elif [r.id for r in refs] != [p[0] for p in planned]:
            await conn.execute(_SET_TODOS, ([t.id for t in refs], event_id))
        return refs

    @translates_errors
    async def commit_faulted(self, data: FaultCommitInput) -> CommitResult:
        """Store a delivery whose commit was refused as faulted, with the error on its trace; idempotent."""
        d = data.delivery
        base: dict[str, Any] = {"verified": d.verified, "trust_mode": d.trust_mode}
        trace: dict[str, Any] = {
            "stage": "fault",
            "cause": data.cause,
            "error": {"type": data.error_type, "message": data.error_message},
        }
        if data.faults:
            trace["faults"] = data.faults
        trace = _traced(trace, d)
        event_id = new_id("ev")
        row = _event_row(d, event_id, trace, "faulted", data.workflow_id, [], d.body, storable=True)
        try:
            return await self._insert_faulted(d, row, base)
        except Exception as exc:
            if is_transient(exc):
                raise
        # Whatever the database refused is among the producer-derived fields: keep the row, drop those.
        row.update(kind=None, headers=Jsonb({}), content_type=None, verify_detail="", source_ip=None)
        return await self._insert_faulted(d, row, base)

    async def _insert_faulted(self, d: DeliveryInput, row: dict[str, Any], base: dict[str, Any]) -> CommitResult:
        async with self.pool.connection() as conn, conn.transaction():
            if not await self._insert_event(conn, row):
                # A redelivery (or a retried run) of a delivery already stored: it stays what it was.
                again = await self._existing(conn, d.endpoint_id, d.source, row["external_id"], None)
                assert again is not None
                return CommitResult(**again, **base)
        return CommitResult(event_id=row["id"], faulted=True, disposition="faulted", **base)

    async def _mint(
        self,
        conn: AsyncConnection[Any],
        d: DeliveryInput,
        decision: Decision,
        event_id: str,
        trace: dict[str, Any],
        body: bytes,
        planned: list[tuple[str, str, str]],
    ) -> list[TodoRef]:
        """Mint the planned todos and ring the doorbell for each new one; a target with a live todo keeps it."""
        if not planned:
            return []
        cur = await self._send_mint(conn, d, decision, event_id, trace, body, planned)
        return await self._minted(conn, d, cur, planned)

    async def _send_mint(
        self,
        conn: AsyncConnection[Any],
        d: DeliveryInput,
        decision: Decision,
        event_id: str,
        trace: dict[str, Any],
        body: bytes,
        planned: list[tuple[str, str, str]],
    ) -> AsyncCursor[Any]:
        """Send the statement minting the planned todos (in a pipeline, without waiting for its answer)."""
        parsed, lossy = d.payload_checked()
        title = todo_title(d.source, d.kind, parsed)
        return await conn.execute(
            _INSERT_TODOS,
            {
                "ids": [p[0] for p in planned],
                "endpoints": [p[1] for p in planned],
                "queues": [p[2] for p in planned],
                "source": d.source,
                "kind": d.kind,
                "title": title,
                "payload": _jsonb_payload(parsed, body, lossy),
                "event_id": event_id,
                "idempotency_key": d.todo_key(),
                "routing_trace": Jsonb(trace),
                "work_order": Jsonb(decision.work_order) if decision.work_order else None,
                "subject_key": decision.subject_key if decision.coalesce else None,
                "channel": DOORBELL_CHANNEL,
            },
        )

    async def _minted(
        self, conn: AsyncConnection[Any], d: DeliveryInput, cur: AsyncCursor[Any], planned: list[tuple[str, str, str]]
    ) -> list[TodoRef]:
        """The todo of each planned target, in target order, from the mint's answer: new, or its live todo."""
        created = {r["id"] for r in await cur.fetchall()}
        refs: list[TodoRef] = []
        for todo_id, endpoint_id, queue in planned:
            if todo_id in created:
                refs.append(TodoRef(id=todo_id, endpoint_id=endpoint_id, queue=queue, created=True))
                continue
            # A live todo with this idempotency key already exists on the endpoint: report it, mint nothing.
            found = await conn.execute(_FIND_LIVE_TODO, (endpoint_id, d.todo_key()))
            row = await found.fetchone()
            if row is not None:
                refs.append(TodoRef(id=row["id"], endpoint_id=endpoint_id, queue=queue, created=False))
        return refs

    async def _coalesce(
        self,
        conn: AsyncConnection[Any],
        subject: str,
        event_id: str,
        planned: list[tuple[str, str, str]],
    ) -> dict[str, TodoRef]:
        """Attach the event to each target's open todo for the subject; returns them by endpoint id."""
        found: dict[str, TodoRef] = {}
        # Locks are taken in one global order so two multi-target deliveries cannot deadlock.
        for key, _todo_id, endpoint_id, queue in sorted((_subject_lock(p[1], p[2], subject), *p) for p in planned):
            await conn.execute(_LOCK_SUBJECT, (key,))
            cur = await conn.execute(_FIND_OPEN_SUBJECT, (endpoint_id, queue, subject))
            row = await cur.fetchone()
            if row is None:
                continue
            await conn.execute(_ATTACH_UPDATE, (event_id, row["id"]))
            found[endpoint_id] = TodoRef(id=row["id"], endpoint_id=endpoint_id, queue=queue, created=False)
        return found

    async def _existing(
        self, conn: AsyncConnection[Any], endpoint_id: str, source: str, external_id: str, run_id: str | None
    ) -> dict[str, Any] | None:
        cur = await conn.execute(_FIND_EVENT, (endpoint_id, source, external_id))
        row = await cur.fetchone()
        if row is None:
            return None
        own = run_id is not None and row["workflow_run_id"] == run_id
        todos: list[TodoRef] = []
        if row["todo_ids"]:
            cur = await conn.execute(_FIND_TODOS, (list(row["todo_ids"]),))
            found = {r["id"]: r for r in await cur.fetchall()}
            # The todos this event minted carry its id; coalesced or already-live ones were found, not created.
            todos = [
                TodoRef(
                    id=i,
                    endpoint_id=found[i]["endpoint_id"],
                    queue=found[i]["queue"],
                    created=own and found[i]["event_id"] == row["id"],
                )
                for i in row["todo_ids"]
                if i in found
            ]
        disposition = row["disposition"]
        return {
            "event_id": row["id"],
            "todos": todos,
            "created": sum(1 for t in todos if t.created),
            "duplicate": not own,
            "dropped": disposition == "dropped",
            "repeat": disposition == "repeat",
            "faulted": disposition == "faulted",
            "quarantined": disposition == "quarantined",
            "disposition": disposition,
            "rule_id": (row["routing_trace"] or {}).get("rule_id"),
            "quarantine_reason": quarantine_reason(row["routing_trace"]) if disposition == "quarantined" else None,
        }

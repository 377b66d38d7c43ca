"""The commit of one routed delivery: event, once-claim, todos and doorbell in one transaction."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from routing.delivery import CommitInput, CommitResult, TodoRef
from routing.envelope import parse_payload
from routing.titles import todo_title
from store.db import Pool
from store.ids import new_id

DOORBELL_CHANNEL = "switchboard_todos"

_FIND_EVENT = """
SELECT id, disposition, todo_ids, routing_trace FROM events
WHERE endpoint_id = %s AND source = %s AND external_id = %s
"""

_INSERT_EVENT = """
INSERT INTO events (id, webhook_id, endpoint_id, source, kind, external_id, trust_mode, verified,
                    verify_detail, content_type, headers, payload, payload_size, source_ip, received_at,
                    routing_trace, disposition, workflow_id)
VALUES (%(id)s, %(webhook_id)s, %(endpoint_id)s, %(source)s, %(kind)s, %(external_id)s, %(trust_mode)s,
        %(verified)s, %(verify_detail)s, %(content_type)s, %(headers)s, %(payload)s, %(payload_size)s,
        %(source_ip)s, %(received_at)s, %(routing_trace)s, %(disposition)s, %(workflow_id)s)
ON CONFLICT (endpoint_id, source, external_id) DO NOTHING
RETURNING id
"""

_INSERT_TODO = """
INSERT INTO todos (id, endpoint_id, queue, source, kind, title, payload, event_id, idempotency_key,
                   routing_trace, work_order)
VALUES (%(id)s, %(endpoint_id)s, %(queue)s, %(source)s, %(kind)s, %(title)s, %(payload)s, %(event_id)s,
        %(idempotency_key)s, %(routing_trace)s, %(work_order)s)
ON CONFLICT DO NOTHING
RETURNING id
"""

_FIND_LIVE_TODO = """
SELECT id FROM todos WHERE endpoint_id = %s AND idempotency_key = %s
  AND state NOT IN ('done', 'canceled') AND NOT (state = 'failed' AND next_retry_at IS NULL)
"""


def _jsonb_payload(body: bytes) -> Jsonb | None:
    value = parse_payload(body)
    if value is None:
        return None
    # jsonb cannot hold NUL characters; such payloads stay available raw on the event.
    if "\\u0000" in json.dumps(value):
        return None
    return Jsonb(value)


class DeliveryStore:
    """Writes the outcome of routing; idempotent, so Temporal may retry it freely."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def commit(self, data: CommitInput) -> CommitResult:
        """Persist the event and its todos once; a redelivery returns what the first delivery made."""
        d, decision = data.delivery, data.decision
        base: dict[str, Any] = {"verified": d.verified, "trust_mode": d.trust_mode}
        async with self.pool.connection() as conn, conn.transaction():
            existing = await self._existing(conn, d.endpoint_id, d.source, d.external_id)
            if existing is not None:
                return CommitResult(**existing, duplicate=True, **base)
            event_id = new_id("ev")
            trace = dict(decision.trace)
            disposition = decision.disposition
            body = d.body()
            cur = await conn.execute(
                _INSERT_EVENT,
                {
                    "id": event_id,
                    "webhook_id": d.webhook_id,
                    "endpoint_id": d.endpoint_id,
                    "source": d.source,
                    "kind": d.kind,
                    "external_id": d.external_id,
                    "trust_mode": d.trust_mode,
                    "verified": d.verified,
                    "verify_detail": d.verify_detail,
                    "content_type": d.content_type,
                    "headers": Jsonb(d.headers),
                    "payload": body,
                    "payload_size": len(body),
                    "source_ip": d.source_ip,
                    "received_at": datetime.fromisoformat(d.received_at),
                    "routing_trace": Jsonb(trace),
                    "disposition": disposition,
                    "workflow_id": data.workflow_id,
                },
            )
            if await cur.fetchone() is None:
                # Lost a race with a concurrent run of the same delivery: report what it wrote.
                again = await self._existing(conn, d.endpoint_id, d.source, d.external_id)
                assert again is not None
                return CommitResult(**again, duplicate=True, **base)
            rule_id = trace.get("rule_id")
            if disposition == "dropped":
                return CommitResult(event_id=event_id, dropped=True, disposition="dropped", rule_id=rule_id, **base)
            if decision.once_key:
                cur = await conn.execute(
                    "INSERT INTO routing_once (webhook_id, once_key, event_id) VALUES (%s, %s, %s)"
                    " ON CONFLICT DO NOTHING RETURNING event_id",
                    (d.webhook_id, decision.once_key, event_id),
                )
                if await cur.fetchone() is None:
                    trace["once"] = "repeat"
                    await conn.execute(
                        "UPDATE events SET disposition = 'repeat', routing_trace = %s WHERE id = %s",
                        (Jsonb(trace), event_id),
                    )
                    return CommitResult(event_id=event_id, repeat=True, disposition="repeat", rule_id=rule_id, **base)
            payload = _jsonb_payload(body)
            title = todo_title(d.source, d.kind, parse_payload(body))
            refs: list[TodoRef] = []
            for target in decision.deliveries:
                todo_id = new_id("td")
                cur = await conn.execute(
                    _INSERT_TODO,
                    {
                        "id": todo_id,
                        "endpoint_id": target.endpoint_id,
                        "queue": target.queue,
                        "source": d.source,
                        "kind": d.kind,
                        "title": title,
                        "payload": payload,
                        "event_id": event_id,
                        "idempotency_key": d.external_id,
                        "routing_trace": Jsonb(trace),
                        "work_order": Jsonb(decision.work_order) if decision.work_order else None,
                    },
                )
                if await cur.fetchone() is not None:
                    refs.append(TodoRef(id=todo_id, endpoint_id=target.endpoint_id, queue=target.queue, created=True))
                    await conn.execute(
                        "SELECT pg_notify(%s, %s)",
                        (
                            DOORBELL_CHANNEL,
                            json.dumps(
                                {
                                    "todo_id": todo_id,
                                    "endpoint_id": target.endpoint_id,
                                    "queue": target.queue,
                                    "kind": d.kind,
                                    "source": d.source,
                                    "title": title,
                                }
                            ),
                        ),
                    )
                else:
                    cur = await conn.execute(_FIND_LIVE_TODO, (target.endpoint_id, d.external_id))
                    row = await cur.fetchone()
                    if row is not None:
                        refs.append(
                            TodoRef(
                                id=row["id"],
                                endpoint_id=target.endpoint_id,
                                queue=target.queue,
                                created=False,
                            )
                        )
            await conn.execute("UPDATE events SET todo_ids = %s WHERE id = %s", ([t.id for t in refs], event_id))
            return CommitResult(
                event_id=event_id,
                todos=refs,
                created=sum(1 for t in refs if t.created),
                disposition="routed",
                rule_id=rule_id,
                **base,
            )

    async def _existing(
        self, conn: AsyncConnection[Any], endpoint_id: str, source: str, external_id: str
    ) -> dict[str, Any] | None:
        cur = await conn.execute(_FIND_EVENT, (endpoint_id, source, external_id))
        row = await cur.fetchone()
        if row is None:
            return None
        todos: list[TodoRef] = []
        if row["todo_ids"]:
            cur = await conn.execute(
                "SELECT id, endpoint_id, queue FROM todos WHERE id = ANY(%s)", (list(row["todo_ids"]),)
            )
            found = {r["id"]: r for r in await cur.fetchall()}
            todos = [
                TodoRef(id=i, endpoint_id=found[i]["endpoint_id"], queue=found[i]["queue"], created=False)
                for i in row["todo_ids"]
                if i in found
            ]
        disposition = row["disposition"]
        return {
            "event_id": row["id"],
            "todos": todos,
            "created": 0,
            "dropped": disposition == "dropped",
            "repeat": disposition == "repeat",
            "disposition": disposition,
            "rule_id": (row["routing_trace"] or {}).get("rule_id"),
        }

"""The todo queue: leases, retries and dead letters, all as single atomic statements."""

from __future__ import annotations

import builtins
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from store.db import Pool
from store.errors import Conflict, Forbidden, InvalidArgument, NotFound, translates_errors
from store.events import decode_cursor, encode_cursor
from store.models import Caller, Todo, TodoPage

DEFAULT_LEASE_SECONDS = 300
MAX_LEASE_SECONDS = 86400
RETRY_BASE_SECONDS = 30
RETRY_CAP_SECONDS = 900
# One live todo per (endpoint, idempotency key): migrations/0001_init.sql.
LIVE_IDEM_INDEX = "todos_live_idem_idx"
_TWIN_CONFLICT = "another live todo of the same delivery holds this endpoint's slot"

_COLUMNS = (
    "id, endpoint_id, queue, source, kind, title, payload, event_id, idempotency_key, state, owner,"
    " lease_expires_at, attempt, max_attempts, result, last_error, created_at, updated_at, claimed_at,"
    " completed_at, next_retry_at, routing_trace AS routing, work_order, update_event_ids, cancel_reason"
)

MAX_CLAIM_BATCH = 50
"""The most todos one claim_next may take (`max`): each gets its own lease, so a holder must be able to work them."""

# The oldest `max` pending todos in scope that no other claimer holds, in one statement (RETURNING has no order:
# t.seq comes back so the caller can put them oldest first).
_CLAIM_NEXT = f"""
WITH next AS (
    SELECT id FROM todos
    WHERE endpoint_id = %(endpoint)s AND state = 'pending' AND queue = ANY(%(queues)s)
    ORDER BY seq
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
)
UPDATE todos t
SET state = 'claimed', owner = %(owner)s, attempt = t.attempt + 1, claimed_at = now(), updated_at = now(),
    lease_expires_at = now() + make_interval(secs => %(lease)s), next_retry_at = NULL
FROM next WHERE t.id = next.id
RETURNING t.seq, {", ".join("t." + c.strip() for c in _COLUMNS.split(","))}
"""  # noqa: S608 - constant column list

_CLAIM = f"""
UPDATE todos
SET state = 'claimed', owner = %(owner)s, attempt = attempt + 1, claimed_at = now(), updated_at = now(),
    lease_expires_at = now() + make_interval(secs => %(lease)s), next_retry_at = NULL
WHERE id = %(id)s AND endpoint_id = %(endpoint)s AND queue = ANY(%(queues)s) AND state = 'pending'
RETURNING {_COLUMNS}
"""  # noqa: S608

_COMPLETE = f"""
UPDATE todos
SET state = 'done', result = %(result)s, completed_at = now(), updated_at = now(), lease_expires_at = NULL
WHERE id = %(id)s AND endpoint_id = %(endpoint)s AND queue = ANY(%(queues)s) AND state = 'claimed' AND owner = %(owner)s
RETURNING {_COLUMNS}
"""  # noqa: S608

# Backoff doubles from 30 s and is capped at 15 min; at the attempt cap the todo is dead-lettered.
_FAIL = f"""
UPDATE todos
SET state = 'failed', last_error = %(error)s, result = coalesce(%(result)s, result), updated_at = now(),
    lease_expires_at = NULL,
    next_retry_at = CASE WHEN attempt < max_attempts
        THEN now() + make_interval(secs => least({RETRY_CAP_SECONDS}, {RETRY_BASE_SECONDS} * power(2, attempt - 1)))
        ELSE NULL END
WHERE id = %(id)s AND endpoint_id = %(endpoint)s AND queue = ANY(%(queues)s) AND state = 'claimed' AND owner = %(owner)s
RETURNING {_COLUMNS}
"""  # noqa: S608

_HEARTBEAT = f"""
UPDATE todos SET lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
WHERE id = %(id)s AND endpoint_id = %(endpoint)s AND queue = ANY(%(queues)s) AND state = 'claimed' AND owner = %(owner)s
RETURNING {_COLUMNS}
"""  # noqa: S608

_RELEASE = f"""
UPDATE todos SET state = 'pending', owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = %(id)s AND endpoint_id = %(endpoint)s AND queue = ANY(%(queues)s) AND state = 'claimed' AND owner = %(owner)s
RETURNING {_COLUMNS}
"""  # noqa: S608

# failed → pending now. A parked retry keeps its attempt count (only the wait is skipped); a dead letter gets a
# fresh attempt budget: attempt back to 0, so it has max_attempts claims again and its backoff restarts at 30 s.
# last_error and result stay until the next fail or complete replaces them. A dead letter gives its slot back,
# so it returns only while no other live todo of the same delivery holds the slot on this endpoint.
_RETRY = f"""
UPDATE todos t
SET state = 'pending', owner = NULL, lease_expires_at = NULL, next_retry_at = NULL, updated_at = now(),
    attempt = CASE WHEN t.next_retry_at IS NULL THEN 0 ELSE t.attempt END
WHERE t.id = %(id)s AND t.endpoint_id = %(endpoint)s AND t.queue = ANY(%(queues)s) AND t.state = 'failed'
  AND NOT EXISTS (
      SELECT 1 FROM todos o
      WHERE o.endpoint_id = t.endpoint_id AND o.idempotency_key = t.idempotency_key AND o.id <> t.id
        AND o.state NOT IN ('done', 'canceled') AND NOT (o.state = 'failed' AND o.next_retry_at IS NULL))
RETURNING {_COLUMNS}
"""  # noqa: S608 - constant fragments only

# pending or failed (parked or dead letter) → canceled: terminal, never retried, pruned with the other
# terminal todos (completed_at is when it was canceled).
_CANCEL = f"""
UPDATE todos
SET state = 'canceled', cancel_reason = %(reason)s, owner = NULL, lease_expires_at = NULL, next_retry_at = NULL,
    completed_at = now(), updated_at = now()
WHERE id = %(id)s AND endpoint_id = %(endpoint)s AND queue = ANY(%(queues)s) AND state IN ('pending', 'failed')
RETURNING {_COLUMNS}
"""  # noqa: S608

# The live todo (todos_live_idem_idx: not done, canceled or dead-lettered) holding a delivery's slot.
_FIND_LIVE_TWIN = """
SELECT id FROM todos WHERE endpoint_id = %s AND idempotency_key = %s AND id <> %s
  AND state NOT IN ('done', 'canceled') AND NOT (state = 'failed' AND next_retry_at IS NULL)
"""

# Newest first, keyset on (created_at, id) (todos_list_idx): a page never repeats or skips a row however many
# todos are minted meanwhile. Todos minted by one delivery share created_at; the id orders them.
_LIST = f"""
SELECT {_COLUMNS} FROM todos
WHERE endpoint_id = %(endpoint)s AND queue = ANY(%(queues)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(after_at)s::timestamptz IS NULL OR (created_at, id) < (%(after_at)s::timestamptz, %(after_id)s::text))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s
"""  # noqa: S608 - constant column list

_REAP_LEASES = """
UPDATE todos
SET state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END,
    owner = CASE WHEN attempt >= max_attempts THEN owner ELSE NULL END,
    last_error = CASE WHEN attempt >= max_attempts THEN 'lease expired' ELSE last_error END,
    lease_expires_at = NULL, next_retry_at = NULL, updated_at = now()
WHERE state = 'claimed' AND lease_expires_at < now()
RETURNING id, state
"""

_REAP_RETRIES = """
UPDATE todos SET state = 'pending', owner = NULL, next_retry_at = NULL, updated_at = now()
WHERE state = 'failed' AND next_retry_at IS NOT NULL AND next_retry_at <= now()
RETURNING id
"""


def clamp_lease(seconds: int | None) -> int:
    """A lease TTL within [1, 86400] seconds; the default when unset."""
    if seconds is None:
        return DEFAULT_LEASE_SECONDS
    return max(1, min(MAX_LEASE_SECONDS, int(seconds)))


def owner_of(caller: Caller) -> str:
    """The owner recorded on a claimed todo."""
    return f"agent:{caller.agent_id}"


def conflict_message(todo: Todo, needs: str) -> str:
    """Why a transition that needs the todo in state `needs` did not apply (`todo is done, not claimed`).

    Read after the refused UPDATE, so a concurrent change may show here; the code stays conflict either way.
    Only the endpoint's own agent sees its todos, so a claimed todo it cannot act on changed under it.
    """
    if todo.state != needs:
        return f"todo is {todo.state}, not {needs}"
    return f"todo changed concurrently; it is {todo.state} now"


class TodoStore:
    """Todo verbs confined to the calling endpoint and its scope queues."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @translates_errors
    async def get(self, caller: Caller, todo_id: str) -> Todo:
        """A todo of the caller's endpoint, in a scope queue."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLUMNS} FROM todos WHERE id = %s AND endpoint_id = %s",  # noqa: S608
                (todo_id, caller.endpoint_id),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFound("unknown todo")
        if row["queue"] not in caller.scope_queues:
            raise Forbidden("todo queue is outside this endpoint's scope")
        return Todo.model_validate(row)

    @translates_errors
    async def list(
        self, caller: Caller, queue: str | None, state: str | None, limit: int, cursor: str | None = None
    ) -> TodoPage:
        """A page of todos in the caller's scope, newest first, and the cursor of the next page."""
        queues = caller.scope_queues
        if queue is not None:
            if queue not in caller.scope_queues:
                raise Forbidden("queue is outside this endpoint's scope")
            queues = [queue]
        # The event history's keyset cursor (store.events), here over (created_at, id).
        after_at, after_id = decode_cursor(cursor) if cursor else (None, None)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _LIST,
                {
                    "endpoint": caller.endpoint_id,
                    "queues": queues,
                    "state": state,
                    "after_at": after_at,
                    "after_id": after_id,
                    "limit": limit + 1,
                },
            )
            rows = await cur.fetchall()
        todos = [Todo.model_validate(r) for r in rows[:limit]]
        more = len(rows) > limit
        return TodoPage(todos=todos, next_cursor=encode_cursor(todos[-1].created_at, todos[-1].id) if more else None)

    @translates_errors
    async def claim_next(self, caller: Caller, queue: str | None, lease_seconds: int | None) -> Todo | None:
        """Claim the oldest pending todo in scope, skipping rows other claimers hold."""
        todos = await self.claim_many(caller, queue, lease_seconds, 1)
        return todos[0] if todos else None

    @translates_errors
    async def claim_many(
        self, caller: Caller, queue: str | None, lease_seconds: int | None, most: int
    ) -> builtins.list[Todo]:
        """Claim up to `most` of the oldest pending todos in scope in one statement, oldest first; each is leased."""
        if not 1 <= most <= MAX_CLAIM_BATCH:
            raise InvalidArgument(f"max must be between 1 and {MAX_CLAIM_BATCH}")
        queues = caller.scope_queues
        if queue is not None:
            if queue not in caller.scope_queues:
                raise Forbidden("queue is outside this endpoint's scope")
            queues = [queue]
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _CLAIM_NEXT,
                {
                    "endpoint": caller.endpoint_id,
                    "queues": queues,
                    "owner": owner_of(caller),
                    "lease": clamp_lease(lease_seconds),
                    "max": most,
                },
            )
            rows = await cur.fetchall()
        rows.sort(key=lambda r: int(r["seq"]))
        return [Todo.model_validate(r) for r in rows]

    @translates_errors
    async def claim(self, caller: Caller, todo_id: str, lease_seconds: int | None) -> Todo:
        """pending → claimed, atomically; conflict when not pending."""
        return await self._transition(
            caller,
            todo_id,
            _CLAIM,
            {
                "id": todo_id,
                "endpoint": caller.endpoint_id,
                "owner": owner_of(caller),
                "lease": clamp_lease(lease_seconds),
            },
            "pending",
        )

    @translates_errors
    async def complete(self, caller: Caller, todo_id: str, result: Any) -> Todo:
        """claimed → done, by the holder only."""
        return await self._transition(
            caller,
            todo_id,
            _COMPLETE,
            {
                "id": todo_id,
                "endpoint": caller.endpoint_id,
                "owner": owner_of(caller),
                "result": Jsonb(result),
            },
            "claimed",
        )

    @translates_errors
    async def fail(self, caller: Caller, todo_id: str, error: str | None, result: Any) -> Todo:
        """claimed → failed with a retry window, or dead letter at the attempt cap."""
        return await self._transition(
            caller,
            todo_id,
            _FAIL,
            {
                "id": todo_id,
                "endpoint": caller.endpoint_id,
                "owner": owner_of(caller),
                "error": error,
                "result": Jsonb(result) if result is not None else None,
            },
            "claimed",
        )

    @translates_errors
    async def heartbeat(self, caller: Caller, todo_id: str, lease_seconds: int | None) -> Todo:
        """Extend the holder's lease; without a TTL it resets to the default."""
        return await self._transition(
            caller,
            todo_id,
            _HEARTBEAT,
            {
                "id": todo_id,
                "endpoint": caller.endpoint_id,
                "owner": owner_of(caller),
                "lease": clamp_lease(lease_seconds),
            },
            "claimed",
        )

    @translates_errors
    async def release(self, caller: Caller, todo_id: str) -> Todo:
        """claimed → pending, voluntarily, by the holder."""
        return await self._transition(
            caller,
            todo_id,
            _RELEASE,
            {"id": todo_id, "endpoint": caller.endpoint_id, "owner": owner_of(caller)},
            "claimed",
        )

    async def _transition(self, caller: Caller, todo_id: str, sql: str, params: dict[str, Any], needs: str) -> Todo:
        # One conditional UPDATE whose WHERE carries ownership and scope: a todo outside the scope can never
        # change. Only when nothing matched do we look the todo up to say why (not_found, forbidden, conflict).
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql, {**params, "queues": caller.scope_queues})
            row = await cur.fetchone()
        if row is None:
            raise Conflict(conflict_message(await self.get(caller, todo_id), needs))
        return Todo.model_validate(row)

    @translates_errors
    async def retry(self, caller: Caller, todo_id: str) -> Todo:
        """failed (parked or dead letter) → pending now; a dead letter gets a fresh attempt budget."""
        params = {"id": todo_id, "endpoint": caller.endpoint_id, "queues": caller.scope_queues}
        try:
            async with self.pool.connection() as conn:
                cur = await conn.execute(_RETRY, params)
                row = await cur.fetchone()
        except psycopg.errors.UniqueViolation as exc:
            # A concurrent retry of another dead letter of the same delivery took the slot first.
            if exc.diag.constraint_name != LIVE_IDEM_INDEX:
                raise
            raise Conflict(_TWIN_CONFLICT) from exc
        if row is not None:
            return Todo.model_validate(row)
        todo = await self.get(caller, todo_id)
        if todo.state != "failed":
            raise Conflict(conflict_message(todo, "failed"))
        async with self.pool.connection() as conn:
            cur = await conn.execute(_FIND_LIVE_TWIN, (todo.endpoint_id, todo.idempotency_key, todo.id))
            twin = await cur.fetchone()
        if twin is not None:
            raise Conflict(f"{_TWIN_CONFLICT}: {twin['id']}")
        raise Conflict(conflict_message(todo, "failed"))

    @translates_errors
    async def cancel(self, caller: Caller, todo_id: str, reason: str | None) -> Todo:
        """pending or failed → canceled, with an optional reason; a claimed todo is its holder's to finish."""
        params = {"id": todo_id, "endpoint": caller.endpoint_id, "queues": caller.scope_queues, "reason": reason}
        async with self.pool.connection() as conn:
            cur = await conn.execute(_CANCEL, params)
            row = await cur.fetchone()
        if row is not None:
            return Todo.model_validate(row)
        todo = await self.get(caller, todo_id)
        # Refused in pending or failed only when it changed concurrently; conflict_message says so for one state.
        raise Conflict(
            conflict_message(todo, todo.state if todo.state in ("pending", "failed") else "pending or failed")
        )

    @translates_errors
    async def reap(self) -> dict[str, int]:
        """Expired leases back to pending (or dead letter at the cap); due retries back to pending."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_REAP_LEASES)
            leases = await cur.fetchall()
            cur = await conn.execute(_REAP_RETRIES)
            retries = await cur.fetchall()
        return {
            "requeued": sum(1 for r in leases if r["state"] == "pending"),
            "dead_lettered": sum(1 for r in leases if r["state"] == "failed"),
            "retried": len(retries),
        }

    @translates_errors
    async def live_counts(self, limit: int) -> dict[tuple[str, str], int]:
        """Live todos per (queue, state) across every endpoint, the largest `limit` groups (for /metrics).

        Only the live states, each served by its partial index (pending, claimed, failed awaiting a retry):
        terminal rows are most of a busy table and are counted by the process counters instead. A statement
        timeout bounds the scrape however large the backlog.
        """
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("SET LOCAL statement_timeout = '2s'")
            cur = await conn.execute(_LIVE_COUNTS, {"limit": limit})
            rows = await cur.fetchall()
        return {(r["queue"], r["state"]): int(r["n"]) for r in rows}


_LIVE_COUNTS = """
SELECT queue, state, count(*) AS n FROM todos
WHERE state IN ('pending', 'claimed') OR (state = 'failed' AND next_retry_at IS NOT NULL)
GROUP BY queue, state
ORDER BY n DESC, queue, state
LIMIT %(limit)s
"""

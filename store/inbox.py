"""The delivery inbox: verified deliveries waiting for Temporal to take their start, and per-webhook pacing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from psycopg.types.json import Jsonb
from pydantic import BaseModel

from routing.delivery import DeliveryInput
from store.db import Pool
from store.errors import translates_errors

InboxReason = Literal["temporal_unavailable", "admission", "rate"]

_PUT = """
INSERT INTO delivery_inbox (workflow_id, webhook_id, delivery, reason)
VALUES (%(workflow_id)s, %(webhook_id)s, %(delivery)s, %(reason)s)
ON CONFLICT (workflow_id) DO NOTHING
RETURNING workflow_id
"""

# Generic cell rate algorithm in one statement: the upsert advances the webhook's theoretical arrival time by
# one interval (row-locked, so API processes share one pace); a delivery that would arrive past the burst
# tolerance is written to the inbox, released when its slot comes.
_PACE = """
WITH pace AS (
    INSERT INTO webhook_pace AS p (webhook_id, tat) VALUES (%(webhook_id)s, now() + %(interval)s)
    ON CONFLICT (webhook_id) DO UPDATE SET tat = greatest(p.tat, now()) + %(interval)s
    RETURNING tat
), deferred AS (
    INSERT INTO delivery_inbox (workflow_id, webhook_id, delivery, reason, release_at)
    SELECT %(workflow_id)s, %(webhook_id)s, %(delivery)s, 'rate', pace.tat - %(tolerance)s
    FROM pace WHERE pace.tat - now() > %(tolerance)s
    ON CONFLICT (workflow_id) DO NOTHING
)
SELECT pace.tat - now() > %(tolerance)s AS deferred FROM pace
"""

# Due rows, oldest slot first; SKIP LOCKED lets every relay take a different share.
_CLAIM = """
SELECT workflow_id, delivery, reason, enqueued_at, release_at, attempts
FROM delivery_inbox
WHERE release_at <= now()
ORDER BY release_at, enqueued_at
LIMIT %s
FOR UPDATE SKIP LOCKED
"""

_STATS = """
SELECT count(*) AS depth,
       count(*) FILTER (WHERE release_at <= now()) AS due,
       extract(epoch FROM now() - min(enqueued_at))::float8 AS oldest_age_seconds,
       extract(epoch FROM now() - min(release_at) FILTER (WHERE release_at <= now()))::float8 AS lag_seconds
FROM delivery_inbox
"""


class InboxRow(BaseModel):
    """One waiting delivery."""

    workflow_id: str
    delivery: DeliveryInput
    reason: str
    enqueued_at: datetime
    release_at: datetime
    attempts: int


class InboxStats(BaseModel):
    """Depth and age of the inbox: what an operator (and later /metrics) watches."""

    depth: int = 0
    due: int = 0  # released (not waiting for a pacing slot or a retry)
    oldest_age_seconds: float | None = None
    lag_seconds: float | None = None  # how long the oldest due row has been waiting for a relay


@dataclass
class InboxClaim:
    """Rows one relay holds (row-locked) for one batch; it notes each outcome, settled when the batch ends."""

    rows: list[InboxRow]
    started: list[str] = field(default_factory=list)
    failed: list[tuple[str, str, float | None]] = field(default_factory=list)

    def done(self, workflow_id: str) -> None:
        """Temporal took this start: the row leaves the inbox."""
        self.started.append(workflow_id)

    def retry(self, workflow_id: str, error: str, *, after: float | None) -> None:
        """The start failed; the row stays (released again after `after` seconds, or at once when None)."""
        self.failed.append((workflow_id, error[:500], after))


class InboxStore:
    """Inbox rows and webhook pacing; every write is one statement."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @translates_errors
    async def put(self, workflow_id: str, delivery: DeliveryInput, reason: InboxReason) -> bool:
        """Keep a verified delivery until a relay starts it; False when it was already waiting."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _PUT,
                {
                    "workflow_id": workflow_id,
                    "webhook_id": delivery.webhook_id,
                    "delivery": Jsonb(delivery.model_dump(mode="json")),
                    "reason": reason,
                },
            )
            return await cur.fetchone() is not None

    @translates_errors
    async def pace(self, workflow_id: str, delivery: DeliveryInput, *, rate: float, burst: int) -> bool:
        """Take the webhook's next pacing slot; True when the delivery was deferred into the inbox."""
        interval = timedelta(seconds=1.0 / rate)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _PACE,
                {
                    "workflow_id": workflow_id,
                    "webhook_id": delivery.webhook_id,
                    "delivery": Jsonb(delivery.model_dump(mode="json")),
                    "interval": interval,
                    "tolerance": interval * max(burst, 1),
                },
            )
            row = await cur.fetchone()
        return bool(row and row["deferred"])

    @translates_errors
    @contextlib.asynccontextmanager
    async def claim(self, limit: int) -> AsyncIterator[InboxClaim]:
        """Lock up to `limit` due rows for one batch; started rows are deleted when the block ends.

        The rows stay locked (one transaction) while the relay starts their workflows, so no other relay takes
        them; a relay that dies mid-batch just releases them, and the next start joins the run.
        """
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_CLAIM, (limit,))
            claim = InboxClaim(rows=[InboxRow.model_validate(r) for r in await cur.fetchall()])
            yield claim
            if claim.started:
                await conn.execute("DELETE FROM delivery_inbox WHERE workflow_id = ANY(%s)", (claim.started,))
            for workflow_id, error, after in claim.failed:
                await conn.execute(
                    "UPDATE delivery_inbox SET attempts = attempts + 1, last_error = %s,"
                    " release_at = CASE WHEN %s::float8 IS NULL THEN release_at"
                    " ELSE now() + make_interval(secs => %s::float8) END WHERE workflow_id = %s",
                    (error, after, after, workflow_id),
                )

    @translates_errors
    async def stats(self) -> InboxStats:
        """Depth, due rows, oldest age and relay lag, in one query."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_STATS)
            row = await cur.fetchone()
        return InboxStats.model_validate(row) if row else InboxStats()

    @translates_errors
    async def get(self, workflow_id: str) -> InboxRow | None:
        """One waiting row (operators and tests)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT workflow_id, delivery, reason, enqueued_at, release_at, attempts FROM delivery_inbox"
                " WHERE workflow_id = %s",
                (workflow_id,),
            )
            row = await cur.fetchone()
        return InboxRow.model_validate(row) if row else None

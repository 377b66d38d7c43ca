"""The delivery inbox: verified deliveries waiting for Temporal to take their start, and per-webhook pacing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from psycopg.types.json import Jsonb
from pydantic import BaseModel, ValidationError

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

# Due rows, oldest slot first; SKIP LOCKED lets every relay take a different share. Parked rows wait for a person.
_CLAIM = """
SELECT workflow_id, delivery, reason, enqueued_at, release_at, attempts
FROM delivery_inbox
WHERE release_at <= now() AND parked_at IS NULL
ORDER BY release_at, enqueued_at
LIMIT %s
FOR UPDATE SKIP LOCKED
"""

_STATS = """
SELECT count(*) FILTER (WHERE parked_at IS NULL) AS depth,
       count(*) FILTER (WHERE release_at <= now() AND parked_at IS NULL) AS due,
       count(*) FILTER (WHERE parked_at IS NOT NULL) AS parked,
       extract(epoch FROM now() - min(enqueued_at) FILTER (WHERE parked_at IS NULL))::float8 AS oldest_age_seconds,
       extract(epoch FROM now() - min(release_at) FILTER (WHERE release_at <= now() AND parked_at IS NULL))::float8
           AS lag_seconds
FROM delivery_inbox
"""

# A start that failed: the row waits `after` seconds (or is parked); outage=True leaves it due and uncounted.
_FAILED = """
UPDATE delivery_inbox SET
    last_error = %(error)s,
    attempts = attempts + CASE WHEN %(outage)s THEN 0 ELSE 1 END,
    release_at = now() + make_interval(secs => %(after)s),
    parked_at = CASE WHEN %(park)s THEN now() END
WHERE workflow_id = %(workflow_id)s
"""

_PARKED = """
SELECT workflow_id, webhook_id, reason, enqueued_at, parked_at, attempts, last_error
FROM delivery_inbox WHERE parked_at IS NOT NULL ORDER BY parked_at LIMIT %s
"""

_REQUEUE = """
UPDATE delivery_inbox SET parked_at = NULL, attempts = 0, release_at = now()
WHERE workflow_id = %s AND parked_at IS NOT NULL
RETURNING workflow_id
"""


class InboxRow(BaseModel):
    """One waiting delivery."""

    workflow_id: str
    delivery: DeliveryInput
    reason: str
    enqueued_at: datetime
    release_at: datetime
    attempts: int


class ParkedRow(BaseModel):
    """A delivery whose start kept failing while Temporal answered others: what an operator looks at."""

    workflow_id: str
    webhook_id: str
    reason: str
    enqueued_at: datetime
    parked_at: datetime
    attempts: int
    last_error: str | None


class InboxStats(BaseModel):
    """Depth and age of the inbox: what an operator (and /metrics) watches."""

    depth: int = 0  # waiting for a relay (parked rows aside)
    due: int = 0  # released (not waiting for a pacing slot or a retry)
    parked: int = 0
    oldest_age_seconds: float | None = None
    lag_seconds: float | None = None  # how long the oldest due row has been waiting for a relay


@dataclass(frozen=True)
class Failure:
    """A start that failed, as a relay settles it: when the row is due again, and whether it is parked."""

    workflow_id: str
    error: str
    after: float
    outage: bool
    park: bool


@dataclass
class InboxClaim:
    """Rows one relay holds (row-locked) for one batch; it notes each outcome, settled when the batch ends."""

    rows: list[InboxRow]
    started: list[str] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)

    def done(self, workflow_id: str) -> None:
        """Temporal took this start (or it ended as a faulted event): the row leaves the inbox."""
        self.started.append(workflow_id)

    def retry(self, failure: Failure) -> None:
        """The start failed; the row stays, due again after ``failure.after`` seconds, or parked."""
        self.failed.append(failure)


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
            claim = InboxClaim(rows=[])
            for found in await cur.fetchall():
                try:
                    claim.rows.append(InboxRow.model_validate(found))
                except ValidationError as exc:
                    # A row no relay could ever start: parked at once, never in another row's way.
                    error = f"the stored delivery does not parse: {exc}"
                    claim.retry(Failure(found["workflow_id"], error, after=0.0, outage=False, park=True))
            yield claim
            if claim.started:
                await conn.execute("DELETE FROM delivery_inbox WHERE workflow_id = ANY(%s)", (claim.started,))
            for failure in claim.failed:
                await conn.execute(
                    _FAILED,
                    {
                        "workflow_id": failure.workflow_id,
                        "error": failure.error[:500],
                        "outage": failure.outage,
                        "after": failure.after,
                        "park": failure.park,
                    },
                )

    @translates_errors
    async def stats(self) -> InboxStats:
        """Depth, due rows, oldest age and relay lag, in one query."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_STATS)
            row = await cur.fetchone()
        return InboxStats.model_validate(row) if row else InboxStats()

    @translates_errors
    async def parked(self, limit: int = 100) -> list[ParkedRow]:
        """Parked rows, oldest first."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_PARKED, (limit,))
            return [ParkedRow.model_validate(r) for r in await cur.fetchall()]

    @translates_errors
    async def requeue(self, workflow_id: str) -> bool:
        """Give a parked row back to the relays (due now, its count of failures reset); False when none is parked."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_REQUEUE, (workflow_id,))
            return await cur.fetchone() is not None

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

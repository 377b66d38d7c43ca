"""The doorbell's SQL: LISTEN, the liveness check, the once-per-todo ring claim and the catch-up after a gap.

A todo rings one session across every API process: a process that has an eligible open stream claims the
ring with `UPDATE todos SET rung_at = now() WHERE rung_at IS NULL … RETURNING`, and only the winner rings.
The notification itself carries ids only; what a ring shows is read here, from the todos table.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, sql

from store.commits import DOORBELL_CHANNEL
from store.db import KEEPALIVES, Pool
from store.errors import translates_errors

REVOKED_CHANNEL = "switchboard_revoked"
"""NOTIFY channel of revoked endpoints (payload: the endpoint id), so every process closes their streams."""

CHANNELS = (DOORBELL_CHANNEL, REVOKED_CHANNEL)

# The liveness round trip, sent through the pool: a NOTIFY on the listener's own channel that must come back
# on its LISTEN connection. The same statement reads the server's clock (the catch-up's watermark) and which
# of the endpoints with open streams in that process are no longer live.
_PING = """
SELECT clock_timestamp() AS now, pg_notify(%(channel)s, %(token)s) AS sent,
       ARRAY(SELECT id FROM endpoints WHERE id = ANY(%(endpoints)s) AND state <> 'live') AS revoked
"""

_CLAIM = """
UPDATE todos SET rung_at = now()
WHERE id = %(id)s AND endpoint_id = %(endpoint)s AND queue = ANY(%(queues)s)
  AND state = 'pending' AND rung_at IS NULL
RETURNING id, endpoint_id, queue, kind, source, title
"""

# A ring claimed but then dropped (the chosen stream's buffer was full): free it for a later catch-up.
_UNCLAIM = "UPDATE todos SET rung_at = NULL WHERE id = %s AND rung_at IS NOT NULL AND state = 'pending'"

_MISSED = """
SELECT id FROM todos
WHERE endpoint_id = %(endpoint)s AND queue = ANY(%(queues)s) AND state = 'pending' AND rung_at IS NULL
  AND created_at >= %(since)s
ORDER BY seq
LIMIT %(limit)s
"""


@dataclass(frozen=True)
class RingRow:
    """What one ring shows, as the todos table holds it."""

    todo_id: str
    endpoint_id: str
    queue: str
    kind: str | None
    source: str
    title: str


@dataclass(frozen=True)
class Check:
    """The result of one liveness check."""

    now: datetime
    revoked: list[str]


@dataclass(frozen=True)
class Note:
    """One notification heard on the LISTEN connection."""

    channel: str
    payload: str


class Listener:
    """A process's dedicated LISTEN connection (outside the pool: LISTEN lives as long as its session)."""

    def __init__(self, conn: AsyncConnection[Any]) -> None:
        self.conn = conn

    @classmethod
    @translates_errors
    async def connect(cls, url: str) -> Listener:
        """Open the connection (autocommit, TCP keepalives, so a vanished peer is noticed by the kernel too)."""
        return cls(await AsyncConnection.connect(url, autocommit=True, connect_timeout=10, **KEEPALIVES))

    @translates_errors
    async def listen(self, *extra: str) -> None:
        """LISTEN on every doorbell channel and on `extra` ones."""
        for channel in (*CHANNELS, *extra):
            await self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    @translates_errors
    async def notifies(self, seconds: float) -> AsyncGenerator[Note]:
        """Notifications as they arrive, for at most `seconds` (close it early with `aclosing`)."""
        async with contextlib.aclosing(self.conn.notifies(timeout=seconds)) as notes:
            async for note in notes:
                yield Note(channel=note.channel, payload=note.payload)

    @translates_errors
    async def close(self) -> None:
        """Close the connection (its LISTENs end with it)."""
        await self.conn.close()


class DoorbellStore:
    """The liveness ping, the ring claim and the catch-up query, over the process's pool."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @translates_errors
    async def ping(self, channel: str, token: str, endpoints: list[str]) -> Check:
        """NOTIFY `token` on `channel`; the server's clock then, and which of `endpoints` are revoked."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_PING, {"channel": channel, "token": token, "endpoints": endpoints})
            row = await cur.fetchone()
        assert row is not None
        return Check(now=row["now"], revoked=list(row["revoked"]))

    @translates_errors
    async def claim(self, todo_id: str, endpoint_id: str, queues: list[str]) -> RingRow | None:
        """Claim the one ring of a pending todo in `queues`; None when it is not ours to ring (anymore)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_CLAIM, {"id": todo_id, "endpoint": endpoint_id, "queues": queues})
            row = await cur.fetchone()
        if row is None:
            return None
        return RingRow(
            todo_id=row["id"],
            endpoint_id=row["endpoint_id"],
            queue=row["queue"],
            kind=row["kind"],
            source=row["source"],
            title=row["title"],
        )

    @translates_errors
    async def unclaim(self, todo_id: str) -> None:
        """Give back a claimed ring that no stream took."""
        async with self.pool.connection() as conn:
            await conn.execute(_UNCLAIM, (todo_id,))

    @translates_errors
    async def missed(self, endpoint_id: str, queues: list[str], since: datetime, limit: int) -> list[str]:
        """Pending, unrung todos of the endpoint in `queues` created since `since`, oldest first."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _MISSED, {"endpoint": endpoint_id, "queues": queues, "since": since, "limit": limit}
            )
            return [r["id"] for r in await cur.fetchall()]

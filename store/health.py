"""The /healthz probe of PostgreSQL: one connection of its own that mends itself, and never blocks the answer.

A pool here could stay empty without a word: psycopg_pool refills in background tasks, and a cancellation
landing while a connection is returned can leave it counting a connection it no longer has. The probe owns one
plain connection instead. Each check runs one `SELECT 1` on it in a task of its own; a failure of any kind
(refused, lost, cancelled) closes it, and the next check connects afresh, so the probe answers again as soon
as PostgreSQL does. The caller waits at most its bound: a round trip that hangs (a server that stopped
answering) keeps running in its task, one at a time, until TCP keepalives or the server end it; checks meanwhile
wait on that same round trip rather than piling up connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from store.db import KEEPALIVES
from store.errors import translates_errors


class HealthProbe:
    """One round trip to PostgreSQL on demand, on a connection the probe reopens whenever it failed."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: AsyncConnection[TupleRow] | None = None
        self._round_trip: asyncio.Task[None] | None = None

    @translates_errors
    async def ping(self, *, wait: float) -> None:
        """One `SELECT 1` answered within `wait` seconds: TimeoutError when none came, StoreUnavailable (saying
        why) when the round trip failed."""
        if self._round_trip is None or self._round_trip.done():
            self._round_trip = asyncio.create_task(self._select_one(wait), name="healthz-postgres")
            # Its outcome is read by whoever waits for it; one nobody waited for must not warn when collected.
            self._round_trip.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.wait_for(asyncio.shield(self._round_trip), wait)

    async def _select_one(self, wait: float) -> None:
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = None
                self._conn = await AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=max(1, math.ceil(wait)), **KEEPALIVES
                )
            await self._conn.execute("SELECT 1")
        except BaseException:
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.close()
            raise

    async def close(self) -> None:
        """Stop any round trip under way (waiting at most a second for it) and close the connection."""
        if self._round_trip is not None and not self._round_trip.done():
            self._round_trip.cancel()
            with contextlib.suppress(BaseException):
                async with asyncio.timeout(1.0):
                    await self._round_trip
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

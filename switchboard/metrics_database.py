"""Gauges of the shared database (the inbox, the live todos), read by an API process when it is scraped.

No single process counts these: they are the database's state, read at scrape time, cached and bounded, and
rendered by api/metrics.py next to the process registry (they are not registered in it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric

log = logging.getLogger("switchboard.metrics")


@dataclass(frozen=True)
class DatabaseSnapshot:
    """State of the shared database that no single process counts: the inbox and the live todos."""

    inbox_depth: int
    inbox_due: int
    inbox_parked: int
    inbox_oldest_age_seconds: float
    inbox_lag_seconds: float
    # (queue, state) -> count, live states only (pending, claimed, failed awaiting a retry).
    todos: Mapping[tuple[str, str], int]


class DatabaseGauges:
    """Gauges read from PostgreSQL at scrape time, cached for ``ttl`` seconds and bounded by ``timeout``.

    Every API process reports the same values (they are the database's, not the process's): aggregate with
    `max`, not `sum`. A scrape while PostgreSQL does not answer in time still answers, with these gauges left
    out and `switchboard_metrics_database_up` 0.
    """

    def __init__(
        self, fetch: Callable[[], Awaitable[DatabaseSnapshot]], *, ttl: float = 5.0, timeout: float = 1.0
    ) -> None:
        self._fetch = fetch
        self.ttl = ttl
        self.timeout = timeout
        self._snapshot: DatabaseSnapshot | None = None
        self._taken = float("-inf")
        self._up = False
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Read the database unless the cached snapshot is younger than the ttl."""
        async with self._lock:
            if time.monotonic() - self._taken < self.ttl:
                return
            try:
                async with asyncio.timeout(self.timeout):
                    self._snapshot = await self._fetch()
                self._up = True
            except Exception as exc:
                log.warning("metrics: database gauges unavailable (%s)", type(exc).__name__)
                self._snapshot, self._up = None, False
            self._taken = time.monotonic()

    def describe(self) -> list[Metric]:
        """Not registered in the process registry: each API app renders its own."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The cached snapshot as gauges."""
        up = Metric("switchboard_metrics_database_up", "1 when the last database gauge read succeeded.", "gauge")
        up.add_sample("switchboard_metrics_database_up", {}, 1.0 if self._up else 0.0)
        yield up
        snap = self._snapshot
        if snap is None:
            return
        for name, doc, value in (
            ("switchboard_inbox_depth", "Deliveries waiting in the PostgreSQL inbox.", snap.inbox_depth),
            ("switchboard_inbox_due", "Inbox rows due for the relay now.", snap.inbox_due),
            (
                "switchboard_inbox_parked_rows",
                "Inbox rows parked until an operator requeues them (their start kept failing).",
                snap.inbox_parked,
            ),
            (
                "switchboard_inbox_oldest_age_seconds",
                "Age of the oldest inbox row (0 when empty).",
                snap.inbox_oldest_age_seconds,
            ),
            ("switchboard_inbox_lag_seconds", "How long the oldest due row has been due.", snap.inbox_lag_seconds),
        ):
            gauge = Metric(name, doc, "gauge")
            gauge.add_sample(name, {}, float(value))
            yield gauge
        todos = Metric("switchboard_todos", "Live todos by queue and state (pending, claimed, failed).", "gauge")
        for (queue, state), count in sorted(snap.todos.items()):
            todos.add_sample("switchboard_todos", {"queue": queue, "state": state}, float(count))
        yield todos

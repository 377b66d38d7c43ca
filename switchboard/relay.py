"""The inbox relay: starts the workflows of deliveries that wait in the PostgreSQL inbox, once Temporal answers.

One relay runs in every worker process (and in the API-hosted worker). Relays share the inbox through
`FOR UPDATE SKIP LOCKED`; each start uses the delivery's own workflow id with USE_EXISTING, so a relay and a
producer's retry (or two relays) join one run; a row is deleted only after Temporal acknowledged its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from temporalio.client import Client

from store.errors import StoreUnavailable
from store.inbox import InboxRow, InboxStore
from switchboard.settings import Settings
from switchboard.temporal import is_outage, start_delivery

log = logging.getLogger("switchboard.relay")

_ROW_RETRY_MAX = 300.0  # a start Temporal refuses (not an outage) is retried at most this far apart


@dataclass
class BatchOutcome:
    """What one relay batch did."""

    claimed: int = 0
    started: int = 0
    failed: int = 0
    outage: bool = False


class InboxRelay:
    """Drains the inbox into Temporal with backoff while Temporal (or PostgreSQL) is down; never busy-loops."""

    def __init__(self, client: Client, inbox: InboxStore, settings: Settings, *, task_queue: str | None = None) -> None:
        self.client = client
        self.inbox = inbox
        self.settings = settings
        self.task_queue = task_queue or settings.task_queue
        self._backoff = 0.0
        self._last_report = 0.0
        self._last_depth = 0

    async def run(self) -> None:
        """Relay until cancelled."""
        log.info("inbox relay running", extra={"task_queue": self.task_queue})
        while True:
            try:
                # While Temporal is down, one row probes it; a full batch follows the first success.
                outcome = await self.relay_once(1 if self._backoff else self.settings.relay_batch)
            except StoreUnavailable as exc:
                log.warning("inbox relay cannot reach PostgreSQL", extra={"error": str(exc)[:200]})
                outcome = BatchOutcome(outage=True)
            except Exception:
                log.exception("inbox relay batch failed")
                outcome = BatchOutcome(outage=True)
            await self._report()
            if outcome.outage:
                self._backoff = min(
                    max(self._backoff * 2, self.settings.relay_poll_seconds), self.settings.relay_backoff_max_seconds
                )
                await asyncio.sleep(self._backoff)
                continue
            self._backoff = 0.0
            if outcome.claimed < self.settings.relay_batch:
                # A full batch means more is due: go again at once; otherwise poll.
                await asyncio.sleep(self.settings.relay_poll_seconds)

    async def relay_once(self, limit: int) -> BatchOutcome:
        """Claim up to `limit` due rows, start their workflows, delete the started rows."""
        outcome = BatchOutcome()
        async with self.inbox.claim(limit) as claim:
            outcome.claimed = len(claim.rows)
            if not claim.rows:
                return outcome
            gate = asyncio.Semaphore(self.settings.relay_concurrency)
            errors = await asyncio.gather(*(self._start(row, gate) for row in claim.rows))
            now = time.time()
            ages = [now - row.enqueued_at.timestamp() for row in claim.rows]
            lags = [now - row.release_at.timestamp() for row in claim.rows]
            for row, error in zip(claim.rows, errors, strict=True):
                if error is None:
                    claim.done(row.workflow_id)
                    outcome.started += 1
                    continue
                outcome.failed += 1
                if is_outage(error):
                    outcome.outage = True
                    claim.retry(row.workflow_id, _describe(error), after=None)
                else:
                    after = min(2.0 ** (row.attempts + 1), _ROW_RETRY_MAX)
                    log.error(
                        "Temporal refused a relayed start; the delivery stays in the inbox",
                        extra={"workflow_id": row.workflow_id, "error": _describe(error), "retry_in": after},
                    )
                    claim.retry(row.workflow_id, _describe(error), after=after)
        stats = await self.inbox.stats()
        log.info(
            "inbox relay batch",
            extra={
                "claimed": outcome.claimed,
                "started": outcome.started,
                "failed": outcome.failed,
                "oldest_age_seconds": round(max(ages), 3),
                "lag_seconds": round(max(lags), 3),
                "depth": stats.depth,
                "due": stats.due,
            },
        )
        return outcome

    async def _start(self, row: InboxRow, gate: asyncio.Semaphore) -> BaseException | None:
        async with gate:
            try:
                async with asyncio.timeout(self.settings.temporal_start_timeout_seconds):
                    await start_delivery(self.client, row.delivery, self.settings, task_queue=self.task_queue)
            except Exception as exc:
                return exc
        return None

    async def _report(self) -> None:
        # A periodic depth line while the inbox holds anything (and once when it empties), so a backlog and its
        # recovery are visible even when no batch runs (Temporal down, rows waiting for their pacing slot).
        now = time.monotonic()
        if now - self._last_report < self.settings.relay_log_seconds:
            return
        self._last_report = now
        try:
            stats = await self.inbox.stats()
        except StoreUnavailable:
            return
        if stats.depth or self._last_depth:
            log.info("inbox depth", extra=stats.model_dump())
        self._last_depth = stats.depth


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


@contextlib.asynccontextmanager
async def running_relay(
    client: Client, inbox: InboxStore, settings: Settings, *, task_queue: str | None = None
) -> AsyncIterator[InboxRelay]:
    """Run a relay for the lifetime of the block."""
    relay = InboxRelay(client, inbox, settings, task_queue=task_queue)
    task = asyncio.create_task(relay.run(), name="inbox-relay")
    try:
        yield relay
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""The inbox relay: starts the workflows of deliveries that wait in the PostgreSQL inbox, once Temporal answers.

One relay runs in every worker process (and in the API-hosted worker). Relays share the inbox through
`FOR UPDATE SKIP LOCKED`; each start uses the delivery's own workflow id, so a relay and a producer's retry (or two
relays) join one run; a row is deleted only after Temporal acknowledged its start.

Rows are isolated from each other: a failed start sends its row to the back (its release time moves), so the
next probe tries another; a start Temporal refuses ends as a faulted event; and a row whose start keeps failing
while Temporal answers (its health check passes, or other starts succeed) backs off on its own and is parked
after PARK_AFTER such failures, visible to operators and never blocking another row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import Client

from runtime.starts import is_outage, start_delivery, start_refusal
from store.commits import CommitStore
from store.errors import StoreUnavailable
from store.inbox import Failure, InboxRow, InboxStore
from switchboard import tasks
from switchboard.metrics import record_inbox_parked
from switchboard.settings import Settings

log = logging.getLogger("switchboard.relay")

# A row whose start fails while Temporal answers is tried again 2, 4, 8 … s later (at most ROW_RETRY_MAX), and
# parked after PARK_AFTER such failures (about eight minutes of trying).
ROW_RETRY_MAX = 300.0
PARK_AFTER = 8
HEALTH_TIMEOUT = timedelta(seconds=2)


@dataclass
class BatchOutcome:
    """What one relay batch did."""

    claimed: int = 0
    started: int = 0
    failed: int = 0
    outage: bool = False


class InboxRelay:
    """Drains the inbox into Temporal with backoff while Temporal (or PostgreSQL) is down; never busy-loops."""

    def __init__(
        self,
        client: Client,
        inbox: InboxStore,
        commits: CommitStore,
        settings: Settings,
        *,
        task_queue: str | None = None,
    ) -> None:
        self.client = client
        self.inbox = inbox
        self.commits = commits
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
            for unreadable in claim.failed:
                record_inbox_parked()
                log.error(
                    "an inbox row cannot be read; parked",
                    extra={"workflow_id": unreadable.workflow_id, "error": unreadable.error[:300]},
                )
            outcome.claimed = len(claim.rows)
            if not claim.rows:
                return outcome
            gate = asyncio.Semaphore(self.settings.relay_concurrency)
            errors = await asyncio.gather(*(self._start(row, gate) for row in claim.rows))
            now = time.time()
            ages = [now - row.enqueued_at.timestamp() for row in claim.rows]
            lags = [now - row.release_at.timestamp() for row in claim.rows]
            outcome.started = sum(1 for error in errors if error is None)
            # An error that looks like an outage is one only when Temporal is not answering: if other starts went
            # through, or its health check passes, the row's own start is what fails.
            suspect = [e for e in errors if e is not None and is_outage(e)]
            outage = bool(suspect) and not outcome.started and not await self._temporal_healthy()
            for row, error in zip(claim.rows, errors, strict=True):
                if error is None:
                    claim.done(row.workflow_id)
                elif not is_outage(error):
                    await self._refused(row, error)
                    claim.done(row.workflow_id)
                else:
                    outcome.failed += 1
                    claim.retry(self._failure(row, error, outage=outage))
            outcome.outage = outage
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
                "parked": stats.parked,
            },
        )
        return outcome

    def _failure(self, row: InboxRow, error: BaseException, *, outage: bool) -> Failure:
        """How a failed row is settled: due again at once in an outage (behind the other rows), else backed off."""
        if outage:
            return Failure(row.workflow_id, _describe(error), after=0.0, outage=True, park=False)
        attempts = row.attempts + 1
        park = attempts >= PARK_AFTER
        after = min(2.0**attempts, ROW_RETRY_MAX)
        if park:
            record_inbox_parked()
            log.error(
                "a delivery's start keeps failing while Temporal answers; parked in the inbox",
                extra={"workflow_id": row.workflow_id, "attempts": attempts, "error": _describe(error)},
            )
        else:
            log.warning(
                "a relayed start failed while Temporal answers; the row backs off",
                extra={
                    "workflow_id": row.workflow_id,
                    "attempts": attempts,
                    "error": _describe(error),
                    "retry_in": after,
                },
            )
        return Failure(row.workflow_id, _describe(error), after=after, outage=False, park=park)

    async def _refused(self, row: InboxRow, error: BaseException) -> None:
        """Temporal refused this start: the delivery becomes a faulted event (retrying could never succeed)."""
        log.error(
            "Temporal refused a relayed start; stored as faulted",
            extra={"workflow_id": row.workflow_id, "error": _describe(error)},
        )
        await self.commits.commit_faulted(start_refusal(row.delivery, error))

    async def _temporal_healthy(self) -> bool:
        """Whether Temporal's frontend answers its health check now."""
        try:
            return await self.client.service_client.check_health(timeout=HEALTH_TIMEOUT)
        except Exception:
            return False

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
    client: Client,
    inbox: InboxStore,
    commits: CommitStore,
    settings: Settings,
    *,
    task_queue: str | None = None,
) -> AsyncIterator[InboxRelay]:
    """Run a relay for the lifetime of the block."""
    relay = InboxRelay(client, inbox, commits, settings, task_queue=task_queue)
    task = asyncio.create_task(relay.run(), name="inbox-relay")
    try:
        yield relay
    finally:
        await tasks.stop(task)

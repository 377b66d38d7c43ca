"""ReconcileWebhook: one run of a github webhook's reconciler, started by its Temporal Schedule.

GitHub never retries a failed delivery, but it keeps every attempt. A run pages through the hook's delivery log from
the newest attempt down to its checkpoint, notes each guid Switchboard never got (no event, no inbox row, no running
delivery), and asks GitHub to redeliver them: at most the operator's pages and redeliveries per run, never one guid
twice in a run, never one Switchboard has. The redelivery arrives signed through the receiver, so verification and
dedup are the receiver's as always.

A rate limit is a timer in the run when GitHub's wait is short (within the run's interval and five minutes), else
the run ends and later runs make no call until the wait is over. Any other failure (a revoked token, a wrong hook
id, GitHub down) ends the run with that status, recorded on the reconciler; nothing here touches ingest.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.errors import STORE_REJECTED, VALIDATION_ERROR
    from activities.reconcile import (
        Begun,
        FinishInput,
        ReconcileActivities,
        ReconcileInput,
        ReconcileResult,
        RedeliverInput,
        RunStatus,
    )

# Store and Temporal outages inside a step are retried a few times; a step that still fails ends the run as
# "error" (the next scheduled run starts afresh from the saved checkpoint).
STEP_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=[VALIDATION_ERROR, STORE_REJECTED],
)
STEP_TIMEOUT = timedelta(seconds=60)
# Redelivery requests go out in batches of this many (each batch one heartbeating activity).
REDELIVER_BATCH = 10
# At most this many waits for GitHub's rate limit in one run.
WAITS_MAX = 3
_FAILED = frozenset({"unauthorized", "forbidden", "not_found", "unavailable", "error", "refused"})


def _status(outcome: str) -> RunStatus:
    if outcome in ("ok", "rate_limited", "unauthorized", "forbidden", "not_found", "unavailable"):
        return outcome  # type: ignore[return-value]
    return "error"


@workflow.defn(name="ReconcileWebhook")
class ReconcileWebhook:
    """Scan the hook's delivery log since the checkpoint, ask for what Switchboard lacks, record the outcome."""

    def __init__(self) -> None:
        self.result = ReconcileResult(status="ok")
        self.begun = Begun(status="ready")
        # GitHub's wait before the next call (a spent window or a rate limit), and what it interrupted.
        self.pause: tuple[float, str] | None = None

    @workflow.run
    async def run(self, data: ReconcileInput) -> ReconcileResult:
        self.begun = await workflow.execute_activity_method(
            ReconcileActivities.begin,
            data,
            start_to_close_timeout=STEP_TIMEOUT,
            retry_policy=STEP_RETRY,
            summary="settle arrivals, check the switch and any backoff",
        )
        begun = self.begun
        result = self.result
        result.arrived, result.given_up, result.checkpoint_id = begun.arrived, begun.given_up, begun.checkpoint_id
        if begun.status != "ready":
            result.status, result.detail = begun.status, begun.detail
            return await self._finish(data)
        if begun.wait_seconds:
            self.pause = (begun.wait_seconds, "a rate limit from an earlier run")
        try:
            await self._scan(data)
            if result.status == "ok":
                await self._redeliver(data)
        except ActivityError as err:
            result.status, result.detail = "error", f"a step failed after its retries: {err.cause or err}"[:300]
        return await self._finish(data)

    async def _wait(self) -> bool:
        """Wait out GitHub's rate limit with a timer when it is short enough; False (the run ends) otherwise."""
        if self.pause is None:
            return True
        seconds, why = self.pause
        self.pause = None
        if seconds > self.begun.wait_max_seconds or self.result.waits >= WAITS_MAX:
            self.result.status = "rate_limited"
            self.result.detail = f"GitHub's rate limit: no call for {seconds:.0f} s ({why}); a later run continues"
            return False
        self.result.waits += 1
        self._details()
        await workflow.sleep(timedelta(seconds=seconds), summary=f"GitHub rate limit: {why}")
        return True

    async def _scan(self, data: ReconcileInput) -> None:
        result = self.result
        while result.pages < self.begun.pages_max:
            if not await self._wait():
                return
            page = await workflow.execute_activity_method(
                ReconcileActivities.scan_page,
                data,
                start_to_close_timeout=STEP_TIMEOUT,
                retry_policy=STEP_RETRY,
                summary=f"page {result.pages + 1} of GitHub's delivery log",
            )
            result.checkpoint_id, result.scanning = page.checkpoint_id, page.scanning
            if page.wait_seconds:
                self.pause = (page.wait_seconds, "reading the delivery log")
            if page.outcome == "rate_limited":
                continue
            result.pages += 1
            if page.outcome != "ok":
                result.status, result.detail = _status(page.outcome), page.detail
                return
            result.seen += page.seen
            result.missing += page.missing
            result.arrived += page.arrived
            result.given_up += page.given_up
            self._details()
            if page.done:
                return

    async def _redeliver(self, data: ReconcileInput) -> None:
        result = self.result
        asked = 0
        while asked < self.begun.redeliveries_max:
            if not await self._wait():
                return
            limit = min(REDELIVER_BATCH, self.begun.redeliveries_max - asked)
            batch = await workflow.execute_activity_method(
                ReconcileActivities.redeliver,
                RedeliverInput(webhook_id=data.webhook_id, limit=limit),
                start_to_close_timeout=timedelta(seconds=limit * self.begun.call_seconds + 60),
                heartbeat_timeout=timedelta(seconds=self.begun.call_seconds + 30),
                retry_policy=STEP_RETRY,
                summary=f"ask GitHub to redeliver up to {limit}",
            )
            asked += batch.requested + batch.refused
            result.requested += batch.requested
            result.given_up += batch.refused
            result.present += batch.present
            self._details()
            if batch.outcome in _FAILED:
                result.status, result.detail = _status(batch.outcome), batch.detail
                return
            if not batch.left:
                return
            if batch.wait_seconds:
                self.pause = (batch.wait_seconds, "asking for redeliveries")

    async def _finish(self, data: ReconcileInput) -> ReconcileResult:
        finished = await workflow.execute_activity_method(
            ReconcileActivities.finish,
            FinishInput(webhook_id=data.webhook_id, result=self.result),
            start_to_close_timeout=STEP_TIMEOUT,
            retry_policy=STEP_RETRY,
            summary="confirm arrivals, record the outcome",
        )
        self.result.arrived += finished.arrived
        self.result.awaiting = finished.awaiting
        self._details()
        return self.result

    def _details(self) -> None:
        r = self.result
        lines = [
            f"**{self.begun.scope or 'reconciler'}** · **status** {r.status}" + (f": {r.detail}" if r.detail else ""),
            f"**pages** {r.pages} · **seen** {r.seen} · **missing** {r.missing} · **requested** {r.requested}"
            f" · **arrived** {r.arrived} · **given up** {r.given_up} · **already here** {r.present}",
            f"**checkpoint** {r.checkpoint_id if r.checkpoint_id is not None else 'none yet'}"
            + (" (scan continues next run)" if r.scanning else "")
            + (f" · **rate-limit waits** {r.waits}" if r.waits else ""),
        ]
        workflow.set_current_details("\n\n".join(lines))

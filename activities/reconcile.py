"""Activities of ReconcileWebhook: read GitHub's delivery log, find what Switchboard never got, ask for redeliveries.

Each call to GitHub is one short activity step with its own bounds (switchboard/github.py); what GitHub answered is
data in the result (ok, rate_limited with the wait it asks for, unauthorized, …), never an exception, so a bad
token or a GitHub outage is the reconciler's visible state and nothing is retried blindly. Only store or Temporal
outages raise (and are retried). Nothing read from GitHub is ingested: a redelivery arrives through the receiver.
The token is opened here, per activity, and never leaves: no input, result, log line or error carries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.errors import application_errors
from routing.delivery import workflow_id_for
from store.reconcile_ledger import ReconcileJob, ReconcileLedger, Seen, external_id_of
from store.reconcilers import Status, reconcile_schedule_id
from switchboard.github import Answer, GitHubHooks, HookScope
from switchboard.metrics import RECONCILE_CALLS, RECONCILE_RUNS, record_reconcile
from switchboard.settings import Settings

log = logging.getLogger("switchboard.reconcile")

# A wait GitHub asks for up to this long (and no longer than the reconciler's interval) is a timer in the run;
# a longer one ends the run, and later runs make no call before it is over.
WAIT_INLINE_MAX = 300.0

RunStatus = Literal[
    "ok", "rate_limited", "unauthorized", "forbidden", "not_found", "unavailable", "error", "disabled", "gone"
]


class ReconcileInput(BaseModel):
    """The scheduled action's argument: which webhook's reconciler runs."""

    webhook_id: str


class Begun(BaseModel):
    """Whether the run goes ahead, its bounds (the operator's settings), and what it settled before reading."""

    status: Literal["ready", "disabled", "gone", "rate_limited", "error"]
    detail: str = ""
    scope: str = ""
    wait_seconds: float | None = None  # a backoff still running: wait this long before the first call
    wait_max_seconds: float = 0.0
    pages_max: int = 0
    redeliveries_max: int = 0
    call_seconds: float = 30.0  # one GitHub call and the pause after it, at most (heartbeat bound)
    checkpoint_id: int | None = None
    resumed: bool = False  # the scan continues where an earlier run stopped
    arrived: int = 0
    given_up: int = 0


class PageResult(BaseModel):
    """One page of GitHub's delivery log: what it held, what it did to the ledger, where the scan stands."""

    outcome: str
    detail: str = ""
    seen: int = 0
    missing: int = 0
    arrived: int = 0
    again: int = 0
    given_up: int = 0
    done: bool = False
    wait_seconds: float | None = None
    checkpoint_id: int | None = None
    scanning: bool = False


class RedeliverInput(BaseModel):
    webhook_id: str
    limit: int


class RedeliverResult(BaseModel):
    """A batch of redelivery requests: asked for, already held, refused by GitHub; whether more are due."""

    outcome: str
    detail: str = ""
    requested: int = 0
    present: int = 0
    refused: int = 0
    left: bool = False
    wait_seconds: float | None = None


class ReconcileResult(BaseModel):
    """A run's outcome and counts: the run's result in its history, and what get_webhook_reconciler shows."""

    status: RunStatus
    detail: str = ""
    pages: int = 0
    seen: int = 0
    missing: int = 0
    requested: int = 0
    arrived: int = 0
    given_up: int = 0
    present: int = 0
    waits: int = 0
    checkpoint_id: int | None = None
    scanning: bool = False
    awaiting: int = 0  # redeliveries requested (this run or before) not seen arriving yet


class FinishInput(BaseModel):
    webhook_id: str
    result: ReconcileResult


class Finished(BaseModel):
    """What the end of the run confirmed: requested redeliveries that arrived meanwhile, and those still on their way."""

    arrived: int = 0
    awaiting: int = 0


def hook_scope(job: ReconcileJob) -> HookScope:
    """The GitHub hook a reconciler reads."""
    return HookScope(job.scope_kind, job.scope_name, job.hook_id)


def _run_id() -> str:
    """The workflow run this activity works for (a run never asks GitHub twice for one delivery)."""
    return str(activity.info().workflow_run_id)


def _store_status(outcome: str) -> Status:
    """A call's outcome as the reconciler's recorded state."""
    if outcome in ("ok", "rate_limited", "unauthorized", "forbidden", "not_found", "unavailable"):
        return outcome  # type: ignore[return-value]
    return "error"


class ReconcileActivities:
    """Constructed once in the worker with the reconciler store, the Temporal client and the settings."""

    def __init__(self, ledger: ReconcileLedger, temporal: Client, settings: Settings) -> None:
        self.ledger = ledger
        self.temporal = temporal
        self.settings = settings

    async def _holds(self, webhook_id: str, guids: list[str]) -> set[str]:
        """The guids Switchboard already has for this webhook: an event, an inbox row, or a running delivery.

        Read along the path a delivery travels (inbox and events, then Temporal, then events again), so one that
        moves on between two reads is still found.
        """
        if not guids:
            return set()
        held = await self.ledger.present(webhook_id, guids)
        running: set[str] = set()
        rest = [g for g in guids if g not in held]
        for guid in rest:
            key = external_id_of(webhook_id, guid)
            if key is None:
                continue
            try:
                desc = await self.temporal.get_workflow_handle(workflow_id_for(webhook_id, key)).describe()
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    continue
                raise
            if desc.status == WorkflowExecutionStatus.RUNNING:
                running.add(guid)
        later = [g for g in rest if g not in running]
        if later:
            held |= await self.ledger.present(webhook_id, later)
        return held | running

    async def _confirm(self, webhook_id: str) -> int:
        """Requested redeliveries that reached Switchboard since: arrived."""
        requested = await self.ledger.open_requests(webhook_id)
        arrived = await self.ledger.arrived(webhook_id, await self._holds(webhook_id, requested))
        record_reconcile("arrived", arrived)
        return arrived

    async def _backoff(self, webhook_id: str, status: Status, detail: str, wait: float | None) -> None:
        until = datetime.now(UTC) + timedelta(seconds=wait) if wait else None
        await self.ledger.set_status(webhook_id, status, detail, backoff_until=until)

    def _hooks(self, job: ReconcileJob) -> GitHubHooks:
        assert job.token is not None
        return GitHubHooks(job.api_url, job.token, hook_scope(job), timeout=self.settings.reconcile_timeout_seconds)

    @activity.defn(name="reconcile_begin")
    @application_errors
    async def begin(self, data: ReconcileInput) -> Begun:
        """Decide whether the run goes ahead; settle what arrived or aged out since the last run."""
        job = await self.ledger.job(data.webhook_id)
        if job is None:
            if not await self.ledger.webhook_live(data.webhook_id):
                # The webhook was deleted (its reconciler went with it): so does the schedule that started this
                # run. A reconciler cleared by its owner lost its schedule in clear_webhook_reconciler already.
                await self.ledger.forget(data.webhook_id)
                with contextlib.suppress(RPCError):
                    await self.temporal.get_schedule_handle(reconcile_schedule_id(data.webhook_id)).delete()
            RECONCILE_RUNS.labels(status="gone").inc()
            return Begun(status="gone", detail="no reconciler for this webhook (cleared, or the webhook is gone)")
        scope = hook_scope(job).describe()
        if not self.settings.reconcile:
            RECONCILE_RUNS.labels(status="disabled").inc()
            return Begun(status="disabled", scope=scope, detail="reconciliation is off (SWITCHBOARD_RECONCILE=false)")
        if job.token is None:
            detail = "the token does not open with this server's key: set it again (set_webhook_reconciler)"
            await self.ledger.set_status(data.webhook_id, "error", detail)
            return Begun(status="error", scope=scope, detail=detail)
        given_up = await self.ledger.expire(data.webhook_id, job.lookback_hours)
        record_reconcile("given_up", given_up)
        arrived = await self._confirm(data.webhook_id)
        await self.ledger.revive(data.webhook_id, job.interval_seconds)
        wait = None
        if job.backoff_until is not None:
            left = (job.backoff_until - datetime.now(UTC)).total_seconds()
            wait = left if left > 0 else None
        gap = self.settings.reconcile_request_gap_seconds
        return Begun(
            status="ready",
            scope=scope,
            wait_seconds=wait,
            wait_max_seconds=min(float(job.interval_seconds), WAIT_INLINE_MAX),
            pages_max=self.settings.reconcile_pages_max,
            redeliveries_max=self.settings.reconcile_redeliveries_max,
            call_seconds=self.settings.reconcile_timeout_seconds + gap,
            checkpoint_id=job.checkpoint_id,
            resumed=job.scan_cursor is not None,
            arrived=arrived,
            given_up=given_up,
        )

    @activity.defn(name="reconcile_scan_page")
    @application_errors
    async def scan_page(self, data: ReconcileInput) -> PageResult:
        """Read the next page of the hook's delivery log and put what Switchboard lacks in the ledger.

        The scan goes from the newest attempt down to the checkpoint (or the lookback); the page's place is saved
        with what it found, so a scan cut short (page limit, a crash, a rate limit) continues where it stopped.
        """
        job = await self.ledger.job(data.webhook_id)
        if job is None or job.token is None:
            return PageResult(outcome="error", detail="the reconciler is gone or its token does not open")
        resumed = job.scan_cursor is not None
        async with self._hooks(job) as hooks:
            page = await hooks.list_page(job.scan_cursor)
        RECONCILE_CALLS.labels(call="list", outcome=page.outcome).inc()
        if page.outcome != "ok":
            if resumed and page.outcome == "refused":
                # GitHub no longer takes the saved cursor: the next run scans from the newest page again.
                await self.ledger.reset_scan(data.webhook_id)
            await self._backoff(data.webhook_id, _store_status(page.outcome), page.detail, page.wait_seconds)
            return PageResult(
                outcome=page.outcome,
                detail=page.detail,
                wait_seconds=page.wait_seconds,
                checkpoint_id=job.checkpoint_id,
                scanning=resumed,
            )
        floor = datetime.now(UTC) - timedelta(hours=job.lookback_hours)
        done = page.next_cursor is None
        seen: list[Seen] = []
        for attempt in page.attempts:
            if (job.checkpoint_id is not None and attempt.id <= job.checkpoint_id) or attempt.delivered_at < floor:
                done = True
                break
            seen.append(Seen(attempt.guid, attempt.id, attempt.delivered_at, attempt.delivered))
        top = job.scan_top_id if resumed else (page.attempts[0].id if page.attempts else None)
        checkpoint: tuple[int | None, int | None, str | None]
        if done:
            ids = [i for i in (job.checkpoint_id, top) if i is not None]
            checkpoint = (max(ids) if ids else None, None, None)
        else:
            checkpoint = (job.checkpoint_id, top, page.next_cursor)
        held = await self._holds(data.webhook_id, sorted({s.guid for s in seen}))
        examined = await self.ledger.examine(data.webhook_id, seen, held, checkpoint=checkpoint)
        record_reconcile("seen", len(seen))
        record_reconcile("missing", examined.missing)
        record_reconcile("arrived", examined.arrived)
        record_reconcile("given_up", examined.given_up)
        if page.wait_seconds:
            # The call spent GitHub's window: no call before it resets.
            await self._backoff(data.webhook_id, "rate_limited", "GitHub's rate limit is spent", page.wait_seconds)
        return PageResult(
            outcome="ok",
            seen=len(seen),
            missing=examined.missing,
            arrived=examined.arrived,
            again=examined.again,
            given_up=examined.given_up,
            done=done,
            wait_seconds=page.wait_seconds,
            checkpoint_id=checkpoint[0],
            scanning=not done,
        )

    @activity.defn(name="reconcile_redeliver")
    @application_errors
    async def redeliver(self, data: RedeliverInput) -> RedeliverResult:
        """Ask GitHub to redeliver up to `limit` missing deliveries, one at a time, pausing between requests.

        Each is noted before its call and never asked twice in one run; one Switchboard has meanwhile is skipped.
        A rate limit or an outage stops the batch (that delivery stays missing); a delivery GitHub refuses to
        redeliver (e.g. past its window) is given up.
        """
        run_id = _run_id()
        job = await self.ledger.job(data.webhook_id)
        if job is None or job.token is None:
            return RedeliverResult(outcome="error", detail="the reconciler is gone or its token does not open")
        due = await self.ledger.due(data.webhook_id, run_id, data.limit)
        out = RedeliverResult(outcome="ok", left=len(due) == data.limit)
        if not due:
            return out
        held = await self._holds(data.webhook_id, [d.guid for d in due])
        gap = self.settings.reconcile_request_gap_seconds
        async with self._hooks(job) as hooks:
            for n, item in enumerate(due):
                activity.heartbeat(n)
                if item.guid in held:
                    await self.ledger.drop_present(data.webhook_id, item.guid)
                    out.present += 1
                    continue
                if not await self.ledger.mark_requested(data.webhook_id, item, run_id):
                    continue
                answer = await hooks.redeliver(item.attempt_id)
                RECONCILE_CALLS.labels(call="redeliver", outcome=answer.outcome).inc()
                if answer.outcome == "ok":
                    out.requested += 1
                    record_reconcile("requested")
                elif answer.outcome == "refused":
                    # Not a redelivery GitHub will make: counted as given up, never as requested.
                    await self.ledger.unmark(data.webhook_id, item)
                    await self.ledger.give_up(data.webhook_id, item.guid, answer.detail)
                    record_reconcile("given_up")
                    out.refused += 1
                else:
                    await self.ledger.unmark(data.webhook_id, item)
                    return await self._stopped(data.webhook_id, out, answer)
                if answer.wait_seconds:
                    return await self._stopped(data.webhook_id, out, answer)
                activity.heartbeat(n)
                # GitHub asks integrations to space out the requests that change something.
                await asyncio.sleep(gap)
        return out

    async def _stopped(self, webhook_id: str, out: RedeliverResult, answer: Answer) -> RedeliverResult:
        """The batch ends early on a rate limit or a failed call; the reconciler's state says why."""
        status: Status = "rate_limited" if answer.wait_seconds else _store_status(answer.outcome)
        detail = answer.detail or "GitHub's rate limit is spent"
        await self._backoff(webhook_id, status, detail, answer.wait_seconds)
        out.outcome = answer.outcome if answer.outcome != "ok" else "rate_limited"
        out.detail = detail
        out.wait_seconds = answer.wait_seconds
        out.left = True
        return out

    @activity.defn(name="reconcile_finish")
    @application_errors
    async def finish(self, data: FinishInput) -> Finished:
        """Confirm what arrived during the run, and record its outcome and counts on the reconciler."""
        result = data.result
        if result.status in ("gone", "disabled"):
            return Finished()
        arrived = await self._confirm(data.webhook_id)
        counts = result.model_dump(mode="json", exclude={"status", "detail"})
        counts["arrived"] = result.arrived + arrived
        await self.ledger.finish(
            data.webhook_id,
            _run_id(),
            _store_status(result.status),
            result.detail or None,
            counts,
        )
        RECONCILE_RUNS.labels(status=result.status).inc()
        awaiting = await self.ledger.open_requests(data.webhook_id)
        log.log(
            logging.INFO if result.status == "ok" else logging.WARNING,
            "reconciler run ended: %s",
            result.status,
            extra={"webhook_id": data.webhook_id, "detail": result.detail, **counts, "awaiting": len(awaiting)},
        )
        return Finished(arrived=arrived, awaiting=len(awaiting))

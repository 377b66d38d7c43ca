"""The Temporal Schedule of each reconciler: made, changed and removed by the reconciler verbs, paused by the
operator's switch (SWITCHBOARD_RECONCILE) when a worker starts."""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from activities.reconcile import ReconcileInput
from store.reconcile_ledger import ReconcileLedger, ScheduleEntry
from store.reconcilers import RECONCILE_SOURCE
from switchboard.settings import Settings
from workflows import search

log = logging.getLogger("switchboard.reconcile")

WORKFLOW = "ReconcileWebhook"
PAUSED_NOTE = "paused: reconciliation is off (SWITCHBOARD_RECONCILE=false)"
# A run is bounded by its steps; this only stops one that would hang past every bound.
RUN_TIMEOUT = timedelta(hours=2)


def reconcile_workflow_id(webhook_id: str) -> str:
    """The id prefix of a reconciler's runs (Temporal appends each start's time)."""
    return f"reconcile-{webhook_id}"


def reconcile_schedule(entry: ScheduleEntry, settings: Settings) -> Schedule:
    """One reconciler's schedule: a run every interval, never two at once, paused while the switch is off."""
    every = timedelta(seconds=entry.interval_seconds)
    return Schedule(
        action=ScheduleActionStartWorkflow(
            WORKFLOW,
            ReconcileInput(webhook_id=entry.webhook_id),
            id=reconcile_workflow_id(entry.webhook_id),
            task_queue=settings.task_queue,
            execution_timeout=RUN_TIMEOUT,
            typed_search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(search.WEBHOOK_ID, entry.webhook_id),
                    SearchAttributePair(search.SOURCE, RECONCILE_SOURCE),
                ]
            ),
            static_summary=entry.summary,
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        # A run missed while Temporal was down is taken once it is back, within one interval.
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=max(every, timedelta(minutes=1))),
        state=ScheduleState(paused=not settings.reconcile, note=PAUSED_NOTE if not settings.reconcile else None),
    )


async def put_schedule(client: Client, entry: ScheduleEntry, settings: Settings) -> None:
    """Create the reconciler's schedule, or bring an existing one to this configuration."""
    schedule = reconcile_schedule(entry, settings)
    try:
        await client.create_schedule(entry.temporal_schedule_id, schedule)
    except ScheduleAlreadyRunningError:

        def update(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(entry.temporal_schedule_id).update(update)


async def remove_schedule(client: Client, schedule_id: str) -> None:
    """Delete a reconciler's schedule; one already gone is fine."""
    try:
        await client.get_schedule_handle(schedule_id).delete()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise


async def sync_schedules(client: Client, ledger: ReconcileLedger, settings: Settings) -> None:
    """At worker start: every reconciler has its schedule, paused or running as SWITCHBOARD_RECONCILE says.

    A schedule lost in Temporal (deleted by hand, a new namespace) is made again; with the switch off every one is
    paused, with it on the switch's own pauses are lifted. Failures are logged, never fatal: reconciliation must
    not stop a worker.
    """
    try:
        entries = await ledger.schedules()
    except Exception:
        log.exception("could not read the reconcilers to sync their schedules")
        return
    for entry in entries:
        try:
            handle = client.get_schedule_handle(entry.temporal_schedule_id)
            try:
                desc = await handle.describe()
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                await put_schedule(client, entry, settings)
                log.info("created reconcile schedule %s", entry.temporal_schedule_id)
                continue
            state = desc.schedule.state
            if not settings.reconcile and not state.paused:
                await handle.pause(note=PAUSED_NOTE)
                log.info("paused reconcile schedule %s", entry.temporal_schedule_id)
            elif settings.reconcile and state.paused and state.note == PAUSED_NOTE:
                # Only the switch's own pause is lifted: one an operator set by hand stays.
                await handle.unpause(note="reconciliation is on (SWITCHBOARD_RECONCILE)")
                log.info("resumed reconcile schedule %s", entry.temporal_schedule_id)
        except Exception:
            log.exception("could not sync reconcile schedule %s", entry.temporal_schedule_id)

"""Re-route verbs of the events family: route stored deliveries again with the webhook's current configuration.

Shapes and handlers only. A re-route is the receiver's own RouteDelivery workflow run on a stored delivery
(routing.reroute builds its input); the plan a dry run answers is the backtest's stored-vs-new comparison
(routing.backtest) against each delivery's current outcome, evaluated in this process's rule sandbox. A bulk
re-route is one RerouteEvents workflow (workflows/reroute.py): its progress is a query, its answer the result.
"""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field, StrictBool
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from api.verbs.events import EVENTS_HELP
from api.verbs.registry import READ, CliArg, CliCommand, Context, Hints, VerbInput, verb
from api.verbs.rules import history_of, sandbox_of
from routing.delivery import CommitResult, DeliveryInput
from routing.models import EventDisposition, Grant
from routing.reroute import (
    REROUTE_MAX,
    PlannedEvent,
    RerouteEventsInput,
    RerouteProgress,
    RerouteResult,
    plan,
    reroute_input,
    result_of,
)
from routing.router import evaluator
from store.errors import Conflict, DomainError, NotFound
from workflows import search
from workflows.reroute import (
    PROGRESS_QUERY,
    RerouteEvents,
    batch_workflow_id,
    reroute_start,
    reroute_workflow_id,
)
from workflows.route_delivery import RouteDelivery

FAMILY = "events"
WAIT_DEFAULT = 10.0
WAIT_MAX = 60.0
# A bulk re-route starts at most this many deliveries per second (each one a RouteDelivery run).
STARTS_PER_SECOND = 10.0
WORKFLOW_NOT_FOUND = "unknown re-route"

WAIT_DOC = "how long to wait for the outcome before answering pending with the workflow_id (get_reroute polls it)"


# ---------------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------------


class RerouteEventInput(VerbInput):
    event_id: str = Field(min_length=1, max_length=1000, description="an event of one of your human's webhooks")
    dry_run: StrictBool = Field(default=False, description="answer what re-routing would decide; write nothing")
    wait_seconds: float = Field(default=WAIT_DEFAULT, ge=0, le=WAIT_MAX, description=WAIT_DOC)


class RerouteEventOutput(BaseModel):
    event_id: str = Field(description="the original event (a re-route of a re-route re-routes its original)")
    dry_run: bool
    plan: PlannedEvent | None = Field(default=None, description="dry run: the current outcome and the new decision")
    workflow_id: str | None = Field(
        default=None, description="the re-route's RouteDelivery run (search attribute SwitchboardRerouteOf = event_id)"
    )
    pending: bool = Field(default=False, description="not routed within wait_seconds: poll get_reroute")
    result: RerouteResult | None = None


class RerouteEventsVerbInput(VerbInput):
    webhook_id: str = Field(min_length=1, max_length=128, description="one of your human's webhooks (wh_…)")
    disposition: EventDisposition | None = Field(default=None, description="the delivery's current disposition")
    rule_id: str | None = Field(default=None, max_length=64, description="the rule that decided its current outcome")
    kind: str | None = Field(default=None, max_length=256, description="only deliveries of this kind (event type)")
    since: datetime | None = Field(default=None, description="received at or after this instant")
    until: datetime | None = Field(default=None, description="received before this instant")
    limit: int = Field(default=50, ge=1, le=REROUTE_MAX, description="most recent matching deliveries")
    dry_run: StrictBool = Field(default=False, description="answer the plan only; write nothing")
    wait_seconds: float = Field(default=WAIT_DEFAULT, ge=0, le=WAIT_MAX, description=WAIT_DOC)


RerouteStatus = Literal["planned", "running", "completed", "failed", "canceled", "terminated", "timed_out"]


class RerouteEventsOutput(BaseModel):
    webhook_id: str
    dry_run: bool
    matched: int = Field(description="deliveries matching the filters (each counted once, re-routes included)")
    changed: int = Field(description="of those, the ones a re-route would act on (only these are re-routed)")
    events: list[PlannedEvent] = Field(description="newest first: each delivery's current outcome and new decision")
    status: RerouteStatus = Field(description="planned (dry run), running (poll get_reroute) or how the re-route ended")
    workflow_id: str | None = Field(default=None, description="the RerouteEvents run; none when nothing changed")
    created: int = Field(default=0, description="todos the re-routes minted (so far, while running)")
    progress: RerouteProgress | None = Field(default=None, description="per-event results (so far, while running)")


class GetRerouteInput(VerbInput):
    workflow_id: str = Field(
        min_length=1, max_length=300, description="the workflow_id a reroute_webhook_event(s) answer gave"
    )


class GetRerouteOutput(BaseModel):
    workflow_id: str
    kind: Literal["event", "events"] = Field(description="reroute_webhook_event or reroute_webhook_events")
    status: RerouteStatus
    result: RerouteResult | None = Field(default=None, description="event: the re-route's outcome once routed")
    progress: RerouteProgress | None = Field(default=None, description="events: the tally and per-event results")


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def _utc(at: datetime | None) -> datetime | None:
    # A naive instant is read as UTC rather than as the database session's zone (as list_webhook_events does).
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


def temporal_of(ctx: Context) -> Client:
    if ctx.services.temporal is None:
        raise DomainError("Temporal is unavailable, retry later", code="unavailable")
    return ctx.services.temporal


async def current_grant(ctx: Context, webhook_id: str) -> Grant:
    """The webhook's current grant and configuration; a deleted webhook of the caller's has nothing to route by."""
    try:
        return (await ctx.services.rules.read(ctx.caller, webhook_id)).grant
    except NotFound:
        if await history_of(ctx).owns_webhook(ctx.caller, webhook_id):
            raise Conflict("the webhook was deleted; its events have nothing to be routed with") from None
        raise


async def started(start: Any) -> Any:
    """A Temporal start, its outage answered as unavailable (nothing was re-routed)."""
    try:
        return await start
    except WorkflowAlreadyStartedError as exc:
        raise Conflict(
            f"a bulk re-route of this webhook is still running (workflow_id {exc.workflow_id}); poll get_reroute"
        ) from None
    except RPCError as exc:
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            raise DomainError("Temporal is unavailable, retry later", code="unavailable") from exc
        raise


async def route_again(
    ctx: Context,
    delivery: DeliveryInput,
    workflow_id: str,
    event_id: str,
    wait_seconds: float,
    *,
    id_reuse_policy: WorkflowIDReusePolicy,
    id_conflict_policy: WorkflowIDConflictPolicy = WorkflowIDConflictPolicy.UNSPECIFIED,
) -> RerouteResult | None:
    """Route a re-routed or released delivery of ``event_id`` through RouteDelivery as ``workflow_id`` and wait up
    to ``wait_seconds`` for its commit: its result (``failed`` if the run failed), or None while it still runs."""
    settings = ctx.services.settings
    attrs, summary, details = reroute_start(delivery)
    handle: WorkflowHandle[Any, CommitResult] = await started(
        temporal_of(ctx).start_workflow(
            RouteDelivery.run,
            delivery,
            id=workflow_id,
            task_queue=settings.task_queue,
            id_reuse_policy=id_reuse_policy,
            id_conflict_policy=id_conflict_policy,
            search_attributes=attrs,
            static_summary=summary,
            static_details=details,
            rpc_timeout=timedelta(seconds=settings.temporal_start_timeout_seconds),
        )
    )
    try:
        async with asyncio.timeout(wait_seconds):
            committed = await handle.result()
    except TimeoutError:
        return None
    except WorkflowFailureError as exc:
        return RerouteResult(event_id=event_id, workflow_id=workflow_id, status="failed", error=str(exc)[:300])
    return result_of(event_id, workflow_id, committed)


async def _owns_reroute(ctx: Context, workflow_id: str) -> bool:
    """Whether the re-route this id would name (workflows/reroute.py) is of the caller's human's events."""
    name = workflow_id.removeprefix("reroute-")
    if name == workflow_id:
        return False
    history = history_of(ctx)
    if name.startswith("batch-"):
        return await history.owns_webhook(ctx.caller, name.removeprefix("batch-"))
    event_id, _, nonce = name.rpartition("-")
    return bool(event_id and nonce) and await history.owns_event(ctx.caller, event_id)


_STATUS: dict[WorkflowExecutionStatus, RerouteStatus] = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "canceled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
    # The latest run of a continued-as-new workflow is what describe reads; this is only seen mid-hand-over.
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "running",
}


# ---------------------------------------------------------------------------------------------------
# Verbs
# ---------------------------------------------------------------------------------------------------


@verb(
    "reroute_webhook_event",
    input=RerouteEventInput,
    output=RerouteEventOutput,
    family=FAMILY,
    summary="Route a stored event again with its webhook's current rules and grant, as a new event; or dry-run it.",
    rate_class="authoring",
)
async def reroute_webhook_event(ctx: Context, data: RerouteEventInput) -> RerouteEventOutput:
    history = history_of(ctx)
    original = await history.original_delivery(ctx.caller, data.event_id)
    grant = await current_grant(ctx, original.webhook_id)
    if data.dry_run:
        current = await history.current_events(original.webhook_id, original=original.id)
        planned = await plan(history, grant, current, evaluator(sandbox_of(ctx)))
        if not planned:  # pruned by retention between the two reads
            raise NotFound("unknown event")
        return RerouteEventOutput(event_id=original.id, dry_run=True, plan=planned[0])
    settings = ctx.services.settings
    nonce = secrets.token_hex(8)
    delivery = reroute_input(original, nonce, evaluate_queue_seconds=settings.evaluate_queue_seconds)
    workflow_id = reroute_workflow_id(original.id, nonce)
    result = await route_again(
        ctx,
        delivery,
        workflow_id,
        original.id,
        data.wait_seconds,
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
    )
    return RerouteEventOutput(
        event_id=original.id, dry_run=False, workflow_id=workflow_id, pending=result is None, result=result
    )


@verb(
    "reroute_webhook_events",
    input=RerouteEventsVerbInput,
    output=RerouteEventsOutput,
    family=FAMILY,
    summary="Re-route the webhook's matching events whose decision changed (one workflow, bounded rate); or dry-run.",
    rate_class="authoring",
    # Once it ended, a repeat finds nothing changed and starts nothing; while it runs, a repeat is a conflict.
    hints=Hints(idempotent=True),
)
async def reroute_webhook_events(ctx: Context, data: RerouteEventsVerbInput) -> RerouteEventsOutput:
    history = history_of(ctx)
    grant = await current_grant(ctx, data.webhook_id)
    selected = await history.current_events(
        data.webhook_id,
        disposition=data.disposition,
        rule_id=data.rule_id,
        kind=data.kind,
        since=_utc(data.since),
        until=_utc(data.until),
        limit=data.limit,
    )
    # Up to 200 evaluations in the rule verbs' sandbox: one caller's plans queue behind its own backtests.
    async with ctx.services.backtests.hold(ctx.caller.endpoint_id):
        rows = await plan(history, grant, selected, evaluator(sandbox_of(ctx)))
    changed = [r.event_id for r in rows if r.changed]
    answer = RerouteEventsOutput(
        webhook_id=data.webhook_id,
        dry_run=data.dry_run,
        matched=len(rows),
        changed=len(changed),
        events=rows,
        status="planned" if data.dry_run else "completed",
    )
    if data.dry_run or not changed:
        return answer
    settings = ctx.services.settings
    nonce = secrets.token_hex(8)
    workflow_id = batch_workflow_id(data.webhook_id)
    attrs = TypedSearchAttributes(
        [SearchAttributePair(search.WEBHOOK_ID, data.webhook_id), SearchAttributePair(search.SOURCE, grant.source)]
    )
    handle: WorkflowHandle[Any, RerouteProgress] = await started(
        temporal_of(ctx).start_workflow(
            RerouteEvents.run,
            RerouteEventsInput(
                webhook_id=data.webhook_id,
                # Oldest first: a once-key goes to the oldest delivery, as the plan simulated.
                event_ids=changed[::-1],
                batch=nonce,
                matched=len(rows),
                changed=len(changed),
                evaluate_queue_seconds=settings.evaluate_queue_seconds,
                starts_per_second=STARTS_PER_SECOND,
            ),
            id=workflow_id,
            task_queue=settings.task_queue,
            # One bulk re-route of a webhook at a time: a second one planned while the first runs would re-route
            # the deliveries the first has not reached yet (FAIL is the conflict policy's default).
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            search_attributes=attrs,
            static_summary=f"re-route {len(changed)} of {len(rows)} events of {data.webhook_id}",
            rpc_timeout=timedelta(seconds=settings.temporal_start_timeout_seconds),
        )
    )
    answer.workflow_id = workflow_id
    progress: RerouteProgress | None
    try:
        progress = await asyncio.wait_for(handle.result(), timeout=data.wait_seconds)
    except TimeoutError:
        answer.status = "running"
        progress = await _progress(handle)
    except WorkflowFailureError:
        answer.status = "failed"
        progress = None
    answer.progress = progress
    answer.created = progress.created if progress is not None else 0
    return answer


async def _result(client: Client, workflow_id: str, result_type: type[BaseModel], rpc_timeout: timedelta) -> Any:
    """The result of a closed run (the latest, following continue-as-new), decoded as ``result_type``."""
    return await _answered(
        client.get_workflow_handle(workflow_id, result_type=result_type).result(rpc_timeout=rpc_timeout)
    )


async def _answered(call: Any) -> Any:
    """A Temporal read, its outage (unreachable, or no answer within its rpc timeout) answered as unavailable."""
    try:
        return await call
    except RPCError as exc:
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            raise DomainError("Temporal is unavailable, retry later", code="unavailable") from exc
        raise


async def _progress(handle: WorkflowHandle[Any, Any]) -> RerouteProgress | None:
    """A running bulk re-route's tally; None before its first workflow task ran (or with no worker to answer)."""
    try:
        found = await asyncio.wait_for(handle.query(PROGRESS_QUERY, result_type=RerouteProgress), 5)
    except (TimeoutError, RPCError, WorkflowQueryFailedError):
        return None
    return found if isinstance(found, RerouteProgress) else None


@verb(
    "get_reroute",
    input=GetRerouteInput,
    output=GetRerouteOutput,
    family=FAMILY,
    summary="How a re-route (reroute_webhook_event or reroute_webhook_events) is going, or how it ended.",
    hints=READ,
    # `switchboard events reroute` (both re-route verbs, then this one until the run ends) is composed in cli/main.py.
    cli=CliCommand(
        group="events",
        group_help=EVENTS_HELP,
        action="get-reroute",
        help="get_reroute: how a re-route is going, or how it ended",
        args=(CliArg("workflow_id", help="the workflow_id a re-route answered"),),
    ),
)
async def get_reroute(ctx: Context, data: GetRerouteInput) -> GetRerouteOutput:
    # Ownership first, from the id alone (a re-route's id names its original event, a bulk one its webhook), in
    # one query: another human's re-route and one that does not exist take the same path and time to not_found,
    # and neither reaches Temporal.
    if not await _owns_reroute(ctx, data.workflow_id):
        raise NotFound(WORKFLOW_NOT_FOUND)
    client = temporal_of(ctx)
    handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(data.workflow_id)
    rpc_timeout = timedelta(seconds=ctx.services.settings.temporal_start_timeout_seconds)
    try:
        desc = await _answered(handle.describe(rpc_timeout=rpc_timeout))
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise NotFound(WORKFLOW_NOT_FOUND) from None
        raise
    attrs = desc.typed_search_attributes
    webhook_id = attrs.get(search.WEBHOOK_ID)
    original = attrs.get(search.REROUTE_OF)
    kind: Literal["event", "events"] | None = None
    if desc.workflow_type == "RerouteEvents":
        kind = "events"
    elif desc.workflow_type == "RouteDelivery" and original:
        kind = "event"
    # Unknown, not a re-route, or another human's: the same not_found.
    if kind is None or webhook_id is None or not await history_of(ctx).owns_webhook(ctx.caller, webhook_id):
        raise NotFound(WORKFLOW_NOT_FOUND)
    status = _STATUS.get(desc.status, "running") if desc.status is not None else "running"
    out = GetRerouteOutput(workflow_id=data.workflow_id, kind=kind, status=status)
    if kind == "events":
        if status == "completed":
            out.progress = RerouteProgress.model_validate(
                await _result(client, data.workflow_id, RerouteProgress, rpc_timeout)
            )
        elif status == "running":
            out.progress = await _progress(handle)
        return out
    if status == "completed":
        assert original is not None
        committed = CommitResult.model_validate(await _result(client, data.workflow_id, CommitResult, rpc_timeout))
        out.result = result_of(original, data.workflow_id, committed)
    return out

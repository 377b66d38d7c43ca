"""RerouteEvents: a bulk re-route, one RouteDelivery child per delivery, at a bounded pace, resumable.

Each delivery is routed again by the same RouteDelivery workflow the receiver starts (the one routing
composition), as a child with a workflow id derived from this re-route's batch nonce and the original event: a
worker that dies mid-way resumes from history, and no delivery is re-routed twice by one batch (the child id is
never reused, and the new event's dedup slot derives from the same nonce). Deliveries go one at a time, oldest
first, so a once-key goes to the oldest delivery as the plan said, and at most ``starts_per_second``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import ChildWorkflowError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from activities.models import LoadRerouteInput
    from activities.reroute import RerouteActivities
    from routing.delivery import DeliveryInput, plain, start_details
    from routing.reroute import RerouteEventsInput, RerouteProgress, RerouteResult, result_of
    from workflows import explain, search
    from workflows.route_delivery import STORE_RETRY, RouteDelivery

# Deliveries one run re-routes before it continues as new (RerouteEventsInput.per_run, 25 by default): each
# child's input (the delivery, body included) is recorded in this history, which must stay well under Temporal's
# size limits whatever the bodies weigh; the server's own suggestion to continue as new is followed too.
PROGRESS_QUERY = "progress"
ZERO = timedelta(0)


def reroute_workflow_id(event_id: str, nonce: str) -> str:
    """The RouteDelivery run of one re-route of an original event."""
    return f"reroute-{event_id}-{nonce}"


def batch_workflow_id(webhook_id: str) -> str:
    """The RerouteEvents workflow of a webhook: one bulk re-route runs at a time (each run has its own batch)."""
    return f"reroute-batch-{webhook_id}"


def reroute_start(delivery: DeliveryInput) -> tuple[TypedSearchAttributes, str, str]:
    """Search attributes, summary line and start details of a re-route's RouteDelivery run (Temporal UI).

    The receiver's own (webhook, source, kind, the producer's delivery id) plus SwitchboardRerouteOf, so a search
    by the producer's id finds the original run and its re-routes. Pure, so RerouteEvents computes the same for
    its children on replay.
    """
    attrs: list[SearchAttributePair[str]] = [
        SearchAttributePair(search.WEBHOOK_ID, delivery.webhook_id),
        SearchAttributePair(search.SOURCE, delivery.source),
    ]
    if delivery.kind:
        attrs.append(SearchAttributePair(search.KIND, delivery.kind[:256]))
    producer_id = delivery.producer_delivery_id
    if producer_id and len(producer_id) <= explain.MAX_ATTRIBUTE_CHARS:
        attrs.append(SearchAttributePair(search.DELIVERY_ID, producer_id))
    if delivery.reroute_of:
        attrs.append(SearchAttributePair(search.REROUTE_OF, delivery.reroute_of))
    details = f"**re-route of** `{plain(delivery.reroute_of or '')}`\n\n{start_details(delivery)}"
    if delivery.release is not None:
        release = delivery.release
        details = f"**released** by `{plain(release.by)}` at {plain(release.at)}\n\n{details}"
    return TypedSearchAttributes(attrs), delivery.summary, details


def tally(data: RerouteEventsInput, results: list[RerouteResult]) -> RerouteProgress:
    """Counts over the re-routes done so far."""
    return RerouteProgress(
        webhook_id=data.webhook_id,
        matched=data.matched,
        changed=data.changed,
        total=len(dict.fromkeys(data.event_ids)),
        done=len(results),
        created=sum(r.created for r in results),
        failed=sum(1 for r in results if r.status == "failed"),
        results=results,
    )


@workflow.defn(name="RerouteEvents")
class RerouteEvents:
    """Re-route the given originals of one webhook, one RouteDelivery child each; the answer is the tally."""

    def __init__(self) -> None:
        self._progress: RerouteProgress | None = None

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> RerouteProgress:
        """How far this re-route is (the results so far included)."""
        # Set before run's first await, so every query (answered after the first workflow task) finds it.
        assert self._progress is not None
        return self._progress

    @workflow.run
    async def run(self, data: RerouteEventsInput) -> RerouteProgress:
        results = list(data.done)
        finished = {r.event_id for r in results}
        todo = [e for e in dict.fromkeys(data.event_ids) if e not in finished]
        self._show(data, results)
        interval = timedelta(seconds=1 / data.starts_per_second) if data.starts_per_second > 0 else None
        last: datetime | None = None
        for n, event_id in enumerate(todo):
            if n >= max(data.per_run, 1) or workflow.info().is_continue_as_new_suggested():
                workflow.continue_as_new(data.model_copy(update={"done": results}))
            # One delivery at a time already bounds the pace; a timer holds it to the rate only when the
            # re-routes run faster than that (a timer costs about a second on the dev server: never waste one).
            if interval is not None and last is not None and (wait := last + interval - workflow.now()) > ZERO:
                await workflow.sleep(wait)
            last = workflow.now()
            results.append(await self._reroute(data, event_id))
            self._show(data, results)
        return tally(data, results)

    def _show(self, data: RerouteEventsInput, results: list[RerouteResult]) -> None:
        self._progress = tally(data, results)
        p = self._progress
        workflow.set_current_details(
            f"{p.done}/{p.total} re-routed ({p.matched} matched, {p.changed} changed); "
            f"{p.created} todos created; {p.failed} failed"
        )

    async def _reroute(self, data: RerouteEventsInput, event_id: str) -> RerouteResult:
        loaded = await workflow.execute_local_activity_method(
            RerouteActivities.load_reroute,
            LoadRerouteInput(
                webhook_id=data.webhook_id,
                event_id=event_id,
                batch=data.batch,
                evaluate_queue_seconds=data.evaluate_queue_seconds,
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=STORE_RETRY,
        )
        if loaded.delivery is None:
            return RerouteResult(event_id=event_id, status="missing", error="the event is no longer stored")
        child_id = reroute_workflow_id(event_id, data.batch)
        attrs, summary, details = reroute_start(loaded.delivery)
        try:
            committed = await workflow.execute_child_workflow(
                RouteDelivery.run,
                loaded.delivery,
                id=child_id,
                search_attributes=attrs,
                static_summary=summary,
                static_details=details,
                # Never a second run under this id: one batch routes one delivery again once.
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                # A delivery half-routed is finished even if this re-route is terminated.
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            )
        except WorkflowAlreadyStartedError:
            error = "a run of this re-route already exists"
            return RerouteResult(event_id=event_id, workflow_id=child_id, status="failed", error=error)
        except ChildWorkflowError as err:
            error = f"{err.cause or err}"[:300]
            return RerouteResult(event_id=event_id, workflow_id=child_id, status="failed", error=error)
        return result_of(event_id, child_id, committed)

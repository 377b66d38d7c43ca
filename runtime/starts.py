"""Delivery starts: the one call that starts (or joins) a delivery's RouteDelivery run, for ingest and the relay."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import Priority, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from routing.delivery import CommitResult, DeliveryInput, FaultCommitInput, start_details
from switchboard.settings import Settings
from workflows.route_delivery import RouteDelivery

log = logging.getLogger("switchboard.temporal")


async def start_delivery(
    client: Client, delivery: DeliveryInput, settings: Settings, *, task_queue: str | None = None
) -> tuple[WorkflowHandle[Any, CommitResult], bool]:
    """Start (or join) a delivery's RouteDelivery run; True when this call started the run.

    The receiver and the inbox relay both start through here, under the delivery's own workflow id: a running
    run is joined (the start fails with WorkflowAlreadyStartedError, which names it), so a producer's retry and
    the relay never double a delivery; a closed one may run again, and its commit finds the stored event.

    No search attributes at start: the run upserts who sent it (webhook, source, kind, the producer's delivery
    id) with its decision, in one command (workflows/route_delivery.py); a running delivery is found by its
    summary line, its workflow id (``WorkflowId STARTS_WITH "delivery-<webhook id>-"``) or its status.
    """
    workflow_id = delivery.workflow_id
    try:
        handle = await client.start_workflow(
            RouteDelivery.run,
            delivery,
            id=workflow_id,
            task_queue=task_queue or settings.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            # What the UI's run page shows; user metadata, not part of what replay compares.
            static_summary=delivery.summary or delivery.source,
            static_details=start_details(delivery),
            rpc_timeout=timedelta(seconds=settings.temporal_start_timeout_seconds),
            # Taken only when this process also hosts a worker on the task queue (switchboard dev / api, the relay).
            request_eager_start=settings.eager_start,
            # The webhook's owning endpoint is the tenant, as for its evaluations: the run's workflow and activity
            # tasks that go through matching are handed out round-robin across endpoints with queued work, so one
            # endpoint's flood (a relay draining its backlog, a re-route batch) cannot hold another's deliveries.
            priority=Priority(fairness_key=delivery.endpoint_id),
        )
    except WorkflowAlreadyStartedError as running:
        joined = client.get_workflow_handle_for(RouteDelivery.run, workflow_id, run_id=running.run_id)
        return joined, False
    return handle, True


def start_refusal(delivery: DeliveryInput, exc: BaseException) -> FaultCommitInput:
    """The faulted event of a delivery whose start Temporal refused (not an outage): the error, never retried."""
    message = exc.message if isinstance(exc, RPCError) else str(exc)
    return FaultCommitInput(
        delivery=delivery,
        cause="start_refused",
        error_type=type(exc).__name__,
        error_message=message[:500],
        workflow_id=delivery.workflow_id,
    )


# Temporal itself is not answering (as opposed to refusing one start).
_OUTAGE_CODES = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.UNKNOWN,
    }
)


def is_outage(exc: BaseException) -> bool:
    """Whether a failed start means Temporal is unreachable or overloaded, rather than refusing this start."""
    if isinstance(exc, RPCError):
        return exc.status in _OUTAGE_CODES
    # Timeouts, and a lazy client that cannot connect (RuntimeError from the bridge).
    return isinstance(exc, (TimeoutError, RuntimeError, ConnectionError, OSError))

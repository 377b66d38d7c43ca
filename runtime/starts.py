"""Delivery starts: the one call that starts (or joins) a delivery's RouteDelivery run, for ingest and the relay."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import (
    Priority,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.service import RPCError, RPCStatusCode

from routing.delivery import CommitResult, DeliveryInput
from switchboard.settings import Settings
from workflows import explain
from workflows.route_delivery import RouteDelivery, workflow_id_for

log = logging.getLogger("switchboard.temporal")


async def start_delivery(
    client: Client, delivery: DeliveryInput, settings: Settings, *, task_queue: str | None = None
) -> tuple[WorkflowHandle[Any, CommitResult], bool]:
    """Start (or join) a delivery's RouteDelivery run; True when this call started the run.

    The receiver and the inbox relay both start through here: same workflow id, USE_EXISTING, so a producer's
    retry and the relay join one run instead of doubling.

    No search attributes at start: the run upserts who sent it (webhook, source, kind, the producer's delivery
    id) with its decision, in one command (workflows/route_delivery.py). On the Temporal dev server any
    attribute at start cost about a tenth of ingest throughput, and one alone as much as all four (sweeps of
    bench/_floor_worker's floors; README "Benchmarks"). A run that fails before it decides has none either: find
    it by ``ExecutionStatus = "Failed"`` and its workflow id. A running delivery is found by its summary line,
    its workflow id (``workflow_id_for``: ``WorkflowId STARTS_WITH "delivery-<webhook id>-"``) or
    ``ExecutionStatus = "Running"``.
    """
    summary, details, producer_id = describe_start(delivery)
    if producer_id is not None and delivery.producer_delivery_id is None:
        delivery = delivery.model_copy(update={"producer_delivery_id": producer_id})
    handle = await client.start_workflow(
        RouteDelivery.run,
        delivery,
        id=workflow_id_for(delivery.webhook_id, delivery.external_id),
        task_queue=task_queue or settings.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        # What the UI's list and the run's page show; user metadata, not part of what replay compares.
        static_summary=summary,
        static_details=details,
        rpc_timeout=timedelta(seconds=settings.temporal_start_timeout_seconds),
        # Taken only when this process also hosts a worker on the task queue (switchboard dev / api, the relay).
        request_eager_start=settings.eager_start,
        # The webhook's owning endpoint is the tenant, as for its evaluations: the run's workflow and activity
        # tasks that go through matching are handed out round-robin across endpoints with queued work, so one
        # endpoint's flood (a relay draining its backlog, a re-route batch) cannot hold another's deliveries.
        priority=Priority(fairness_key=delivery.endpoint_id),
    )
    return handle, started_run(handle)


def describe_start(delivery: DeliveryInput) -> tuple[str, str, str | None]:
    """The run's summary line and start details, and the producer's delivery id when it sent one.

    Display only: a body that cannot be described still starts (its summary is just source and kind).
    """
    try:
        envelope = explain.received_envelope(delivery)
    except Exception:  # a description must never cost a delivery its start
        log.warning("could not describe a delivery for the Temporal UI", exc_info=True)
        envelope = None
    producer_id = explain.delivery_attribute(delivery, envelope)
    return explain.summary_line(delivery, envelope), explain.start_details(delivery), producer_id


def started_run(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether the start that returned this handle created the run (False: it joined a running one).

    The SDK keeps the StartWorkflowExecution response on the handle but exposes no accessor for its `started`
    flag; tests/api/test_inbox.py pins this, so an SDK change fails there rather than in production.
    """
    response = getattr(handle, "_start_workflow_response", None)
    return bool(getattr(response, "started", True))


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

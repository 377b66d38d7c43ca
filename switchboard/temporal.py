"""Temporal client construction and the schedules Switchboard keeps in the namespace."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    WorkflowHandle,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from activities.models import UpkeepInput
from routing.delivery import CommitResult, DeliveryInput
from switchboard.logs import install_masking
from switchboard.metrics import temporal_runtime
from switchboard.settings import Settings
from workflows import explain, search
from workflows.route_delivery import RouteDelivery, workflow_id_for

log = logging.getLogger("switchboard.temporal")

REAPER_SCHEDULE_ID = "switchboard-reaper"
RETENTION_SCHEDULE_ID = "switchboard-retention"


async def connect(settings: Settings, address: str | None = None, *, lazy: bool = False) -> Client:
    """A client with the pydantic data converter, so models cross the wire as JSON."""
    target = address or settings.temporal_address
    if not target:
        raise RuntimeError("SWITCHBOARD_TEMPORAL_ADDRESS is not set")
    return await Client.connect(
        target,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        lazy=lazy,
        # The process's one Runtime: the SDK's metrics (this client's and its workers') join /metrics.
        runtime=temporal_runtime(),
        **connect_security(settings),
    )


def connect_security(settings: Settings) -> dict[str, Any]:
    """The `tls=` and `api_key=` arguments of Client.connect for these settings.

    Fails closed: a configured certificate, key or CA that cannot be read raises (the process refuses to start)
    rather than connecting without it. An API key alone turns on TLS with the system roots (Temporal Cloud).
    """
    options: dict[str, Any] = {}
    if settings.temporal_api_key:
        install_masking([settings.temporal_api_key])  # never in a log line, whoever logs it
        options["api_key"] = settings.temporal_api_key
    ca, cert, key = (
        settings.temporal_tls_ca_file,
        settings.temporal_tls_cert_file,
        settings.temporal_tls_key_file,
    )
    if ca or cert or key or settings.temporal_tls_server_name:
        options["tls"] = TLSConfig(
            server_root_ca_cert=_read_pem(ca, "SWITCHBOARD_TEMPORAL_TLS_CA_FILE") if ca else None,
            domain=settings.temporal_tls_server_name or None,
            client_cert=_read_pem(cert, "SWITCHBOARD_TEMPORAL_TLS_CERT_FILE") if cert else None,
            client_private_key=_read_pem(key, "SWITCHBOARD_TEMPORAL_TLS_KEY_FILE") if key else None,
        )
    elif settings.temporal_tls or settings.temporal_api_key:
        options["tls"] = True
    return options


def _read_pem(path: Path, setting: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RuntimeError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from exc
    if b"-----BEGIN " not in data:
        raise RuntimeError(f"{setting}: {path} is not a PEM file")
    return data


def schedule_ids(task_queue: str) -> dict[str, str]:
    """The schedule id of each upkeep workflow for one task queue."""
    return {
        "ReapTodos": f"{REAPER_SCHEDULE_ID}-{task_queue}",
        "PruneRetention": f"{RETENTION_SCHEDULE_ID}-{task_queue}",
    }


async def ensure_schedules(client: Client, task_queue: str) -> None:
    """Create the upkeep schedules once; an existing schedule is left as the operator configured it."""
    ids = schedule_ids(task_queue)
    schedules = {
        ids["ReapTodos"]: reaper_schedule(ids["ReapTodos"], task_queue),
        # Retention: events and terminal todos past 30 days.
        ids["PruneRetention"]: Schedule(
            action=ScheduleActionStartWorkflow(
                "PruneRetention", UpkeepInput(), id=f"{ids['PruneRetention']}-run", task_queue=task_queue
            ),
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(hours=1))]),
            policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=timedelta(hours=1)),
        ),
    }
    for schedule_id, schedule in schedules.items():
        try:
            await client.create_schedule(schedule_id, schedule)
            log.info("created schedule %s", schedule_id)
        except ScheduleAlreadyRunningError:
            if schedule_id == ids["ReapTodos"]:
                await _upgrade_reaper(client, schedule_id, schedule)


# Lease reaper and due retries: one run an hour that reaps every 30 s (ReapTodos loops on durable timers),
# so reaps keep their 30 s pace while the workflow list gains 24 runs a day instead of 2,880.
REAP_EVERY = timedelta(seconds=30)
REAPER_RUN_EVERY = timedelta(hours=1)
# The one-reap-per-run schedule earlier releases created; ensure_schedules moves exactly that one over.
LEGACY_REAPER_EVERY = timedelta(seconds=30)


def reaper_schedule(schedule_id: str, task_queue: str) -> Schedule:
    """The reaper's schedule: hourly runs of ReapTodos, each reaping every 30 s for the hour."""
    rounds = int(REAPER_RUN_EVERY / REAP_EVERY)
    data = UpkeepInput(rounds=rounds, every_seconds=REAP_EVERY.total_seconds())
    return Schedule(
        action=ScheduleActionStartWorkflow("ReapTodos", data, id=f"{schedule_id}-run", task_queue=task_queue),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=REAPER_RUN_EVERY)]),
        # The run ends one round before the hour; a run still going when the next start is due (a slow worker)
        # is followed straight away instead of skipped, so there is never an hour without reaps. A start
        # missed while the server was down is taken when it is back, within the hour.
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.BUFFER_ONE, catchup_window=REAPER_RUN_EVERY),
    )


async def _upgrade_reaper(client: Client, schedule_id: str, schedule: Schedule) -> None:
    """Move an earlier release's every-30-s reaper schedule to the hourly looping one; any other is left alone."""
    handle = client.get_schedule_handle(schedule_id)
    desc = await handle.describe()
    if [i.every for i in desc.schedule.spec.intervals] != [LEGACY_REAPER_EVERY]:
        return
    await handle.update(lambda _: ScheduleUpdate(schedule=schedule))
    log.info("moved schedule %s to hourly runs that reap every %s s", schedule_id, REAP_EVERY.total_seconds())


async def start_delivery(
    client: Client, delivery: DeliveryInput, settings: Settings, *, task_queue: str | None = None
) -> tuple[WorkflowHandle[Any, CommitResult], bool]:
    """Start (or join) a delivery's RouteDelivery run; True when this call started the run.

    The receiver and the inbox relay both start through here: same workflow id, USE_EXISTING, so a producer's
    retry and the relay join one run instead of doubling.
    """
    attrs: list[Any] = [
        SearchAttributePair(search.WEBHOOK_ID, delivery.webhook_id),
        SearchAttributePair(search.SOURCE, delivery.source),
    ]
    if delivery.kind:
        attrs.append(SearchAttributePair(search.KIND, delivery.kind[:256]))
    summary, details = describe_start(delivery, attrs)
    handle = await client.start_workflow(
        RouteDelivery.run,
        delivery,
        id=workflow_id_for(delivery.webhook_id, delivery.external_id),
        task_queue=task_queue or settings.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=TypedSearchAttributes(attrs),
        # What the UI's list and the run's page show; user metadata, not part of what replay compares.
        static_summary=summary,
        static_details=details,
        rpc_timeout=timedelta(seconds=settings.temporal_start_timeout_seconds),
        # Taken only when this process also hosts a worker on the task queue (switchboard dev / api, the relay).
        request_eager_start=settings.eager_start,
    )
    return handle, started_run(handle)


def describe_start(delivery: DeliveryInput, attrs: list[Any]) -> tuple[str, str]:
    """The run's summary line and start details; adds the producer's delivery id to ``attrs`` when it sent one.

    Display only: a body that cannot be described still starts (its summary is just source and kind).
    """
    try:
        envelope = explain.received_envelope(delivery)
    except Exception:  # a description must never cost a delivery its start
        log.warning("could not describe a delivery for the Temporal UI", exc_info=True)
        envelope = None
    producer_id = explain.delivery_attribute(delivery, envelope)
    if producer_id is not None:
        attrs.append(SearchAttributePair(search.DELIVERY_ID, producer_id))
    return explain.summary_line(delivery, envelope), explain.start_details(delivery)


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

"""The Temporal worker process: the only place the routing workflows meet their activities."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.reroute import RerouteActivities
from activities.route import RouteActivities
from activities.schedules import ScheduleActivities
from activities.upkeep import UpkeepActivities
from routing.sandbox import SandboxPool
from store.crypto import SecretBox
from store.db import Pool, open_pool
from store.deliveries import DeliveryStore
from store.events import EventStore
from store.inbox import InboxStore
from store.schedules import ScheduleStore
from store.todos import TodoStore
from store.webhooks import WebhookStore
from switchboard.metrics import listening, sandbox_observer
from switchboard.relay import running_relay
from switchboard.settings import Settings
from switchboard.temporal import connect, ensure_schedules
from workflows.reroute import RerouteEvents
from workflows.route_delivery import RouteDelivery, evaluate_task_queue
from workflows.schedules import FireSchedule
from workflows.upkeep import PruneRetention, ReapTodos

log = logging.getLogger("switchboard.worker")

WORKFLOWS: list[type] = [RouteDelivery, ReapTodos, PruneRetention, FireSchedule, RerouteEvents]


def make_sandbox(settings: Settings) -> SandboxPool:
    """The jq sandbox pool of this process's evaluate worker: one child per evaluate slot (plus a spare)."""
    return SandboxPool(max_children=settings.sandbox_slots, observer=sandbox_observer("delivery"))


class Workers:
    """The workers of one process, entered and left together: workflows and upkeep, and rule evaluation."""

    def __init__(self, main: Worker, evaluate: Worker) -> None:
        self.main = main
        self.evaluate = evaluate
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Workers:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.main)
            await stack.enter_async_context(self.evaluate)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()


def build_worker(
    client: Client,
    pool: Pool,
    settings: Settings,
    *,
    task_queue: str | None = None,
    sandbox: SandboxPool | None = None,
    commit_delay: float = 0.0,
) -> Workers:
    """Wire workflows and activities for one task queue, and the evaluate worker on its evaluate queue."""
    assert settings.secret_key
    queue = task_queue or settings.task_queue
    box = SecretBox(settings.secret_key)
    route = RouteActivities(WebhookStore(pool, box), DeliveryStore(pool), sandbox, commit_delay=commit_delay)
    upkeep = UpkeepActivities(TodoStore(pool), EventStore(pool))
    schedules = ScheduleActivities(ScheduleStore(pool))
    reroute = RerouteActivities(EventStore(pool))
    main = Worker(
        client,
        task_queue=queue,
        workflows=WORKFLOWS,
        activities=[
            # Also here: local-activity evaluation (SWITCHBOARD_EVALUATE_LOCALLY) and evaluations scheduled on
            # this queue by workflows started before the evaluate queue existed.
            route.evaluate_rules,
            route.load_grant,
            route.commit_delivery,
            route.commit_faulted,
            upkeep.reap_todos,
            upkeep.prune_retention,
            schedules.prepare_fire,
            schedules.record_fire,
            reroute.load_reroute,
        ],
        max_concurrent_activities=50,
        max_concurrent_local_activities=50,
        # Workflows stay sandboxed (determinism guard) but every import passes through: only the workflow
        # module itself is re-executed per run, which halves the sandbox's cost per delivery.
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_all_modules()
        ),
    )
    # Admission is Temporal's: this worker polls only while a sandbox child is free, so a flood waits in the
    # evaluate queue (fair across endpoints) rather than on a local semaphore that faults after a second.
    evaluate = Worker(
        client,
        task_queue=evaluate_task_queue(queue),
        activities=[route.evaluate_rules],
        max_concurrent_activities=sandbox.slots if sandbox is not None else 1,
    )
    return Workers(main, evaluate)


@contextlib.asynccontextmanager
async def running_worker(settings: Settings, *, commit_delay: float = 0.0) -> AsyncIterator[Workers]:
    """Pools, sandbox, workers and inbox relay for the lifetime of the block."""
    assert settings.database_url
    pool = await open_pool(settings.database_url, max_size=settings.db_pool_max)
    sandbox = make_sandbox(settings)
    try:
        client = await connect(settings)
        await ensure_schedules(client, settings.task_queue)
        workers = build_worker(client, pool, settings, sandbox=sandbox, commit_delay=commit_delay)
        async with workers, running_relay(client, InboxStore(pool), settings):
            yield workers
    finally:
        await sandbox.close()
        await pool.close()


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run until stop is set (or forever)."""
    import os

    delay = float(os.environ.get("SWITCHBOARD_FAULT_COMMIT_DELAY", "0") or 0)
    # The worker's own metrics listener (SWITCHBOARD_WORKER_METRICS_PORT; none by default, so several workers
    # share a host): an API process serves /metrics on its HTTP port instead.
    with listening(settings.http_host, settings.worker_metrics_port):
        async with running_worker(settings, commit_delay=delay):
            log.info(
                "worker polling task queues %s and %s", settings.task_queue, evaluate_task_queue(settings.task_queue)
            )
            beat = asyncio.create_task(_liveness(settings.home / LIVENESS_FILE))
            try:
                await (stop or asyncio.Event()).wait()
            finally:
                beat.cancel()


LIVENESS_FILE = "worker.alive"
LIVENESS_PERIOD = 10.0


async def _liveness(path: Path) -> None:
    # Touched while the worker runs; `switchboard worker-health` (the container health check) reads its age.
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    while True:
        await asyncio.to_thread(path.touch)
        await asyncio.sleep(LIVENESS_PERIOD)


def worker_is_alive(home: Path, max_age: float = 3 * LIVENESS_PERIOD) -> bool:
    """Whether a worker under this home touched its liveness file recently."""
    import time

    try:
        return time.time() - (home / LIVENESS_FILE).stat().st_mtime < max_age
    except FileNotFoundError:
        return False

"""The Temporal worker process: the only place the routing workflows meet their activities."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from activities.reconcile import ReconcileActivities
from activities.reroute import RerouteActivities
from activities.route import RouteActivities
from activities.schedules import ScheduleActivities
from activities.triage import TriageActivities
from activities.upkeep import UpkeepActivities
from routing.sandbox import SandboxPool
from runtime.reconcilers import sync_schedules
from runtime.relay import running_relay
from runtime.root import Stores, build_stores, llm_ceilings, worker_resources
from runtime.schedules import ensure_schedules
from runtime.workflow_runner import workflow_runner
from store.db import Pool
from switchboard import tasks
from switchboard.metrics_listener import listening
from switchboard.settings import Settings
from workflows.reconcile import ReconcileWebhook
from workflows.reroute import RerouteEvents
from workflows.route_delivery import RouteDelivery, evaluate_task_queue
from workflows.schedules import FireSchedule
from workflows.upkeep import PruneRetention, ReapTodos

log = logging.getLogger("switchboard.worker")

WORKFLOWS: list[type] = [RouteDelivery, ReapTodos, PruneRetention, FireSchedule, RerouteEvents, ReconcileWebhook]

LIVENESS_FILE = "worker.alive"
LIVENESS_PERIOD = 10.0
# A full garbage collection this often (see _collecting), over what the worker made since it started.
GC_PERIOD = 30.0


class Workers:
    """The workers of one process, entered and left together: workflows and upkeep, and rule evaluation."""

    def __init__(self, main: Worker, evaluate: Worker, stores: Stores) -> None:
        self.main = main
        self.evaluate = evaluate
        self.stores = stores
        self._stack = contextlib.AsyncExitStack()

    @property
    def client(self) -> Client:
        """The Temporal client both workers poll with (an API process hosting them starts deliveries on it)."""
        return self.main.client

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
    evaluate_delay: float = 0.0,
) -> Workers:
    """Wire workflows and activities for one task queue, and the evaluate worker on its evaluate queue."""
    queue = task_queue or settings.task_queue
    stores = build_stores(pool, settings)
    route = RouteActivities(
        stores.webhooks,
        stores.commits,
        sandbox,
        commit_delay=commit_delay,
        evaluate_delay=evaluate_delay,
    )
    upkeep = UpkeepActivities(stores.todos, stores.events)
    schedules = ScheduleActivities(stores.schedules)
    reroute = RerouteActivities(stores.events)
    triage = TriageActivities(stores.llm, lambda: llm_ceilings(settings))
    reconcile = ReconcileActivities(stores.reconcile_ledger, client, settings)
    main = Worker(
        client,
        task_queue=queue,
        workflows=WORKFLOWS,
        activities=[
            # The fast path: a local activity on a free sandbox child, else "not admitted" at once.
            route.evaluate_rules_if_free,
            route.load_grant,
            route.commit_delivery,
            route.commit_faulted,
            upkeep.reap_todos,
            upkeep.prune_retention,
            schedules.prepare_fire,
            schedules.record_fire,
            reroute.load_reroute,
            triage.triage,
            reconcile.begin,
            reconcile.scan_page,
            reconcile.redeliver,
            reconcile.finish,
        ],
        max_concurrent_activities=50,
        max_concurrent_local_activities=50,
        workflow_runner=workflow_runner(),
    )
    # Queued evaluations are admitted by Temporal: this worker has one slot per sandbox child, so a flood waits
    # in the evaluate queue (fair across endpoints) rather than on a local semaphore that faults after a second.
    # The fast path (evaluate_rules_if_free on the main worker) takes a child only when nobody waits for one.
    evaluate = Worker(
        client,
        task_queue=evaluate_task_queue(queue),
        activities=[route.evaluate_rules],
        max_concurrent_activities=sandbox.slots if sandbox is not None else 1,
    )
    return Workers(main, evaluate, stores)


@contextlib.asynccontextmanager
async def running_worker(
    settings: Settings, *, commit_delay: float = 0.0, evaluate_delay: float = 0.0
) -> AsyncIterator[Workers]:
    """The worker role for the lifetime of the block: its resources, the workers, the inbox relay and the liveness
    file. `switchboard worker` runs it, and so does an API process that hosts a worker."""
    async with worker_resources(settings) as resources:
        await ensure_schedules(resources.temporal, settings.task_queue)
        workers = build_worker(
            resources.temporal,
            resources.pool,
            settings,
            sandbox=resources.sandbox,
            commit_delay=commit_delay,
            evaluate_delay=evaluate_delay,
        )
        await sync_schedules(resources.temporal, workers.stores.reconcile_ledger, settings)
        async with (
            workers,
            running_relay(resources.temporal, workers.stores.inbox, workers.stores.commits, settings),
            _beating(settings.home / LIVENESS_FILE),
            _collecting(GC_PERIOD),
        ):
            yield workers


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run until stop is set (or forever)."""
    # Fault injection for the crash tests only (a pause before each commit); zero in production.
    delay = float(os.environ.get("SWITCHBOARD_FAULT_COMMIT_DELAY", "0") or 0)
    # And a pause in the fast path after it evaluated, before it answers (the kill -9 test); zero too.
    evaluate_delay = float(os.environ.get("SWITCHBOARD_FAULT_EVALUATE_DELAY", "0") or 0)
    # The worker's own metrics listener (SWITCHBOARD_WORKER_METRICS_PORT; none by default, so several workers
    # share a host): an API process serves /metrics on its HTTP port instead.
    with listening(settings.http_host, settings.worker_metrics_port):
        async with running_worker(settings, commit_delay=delay, evaluate_delay=evaluate_delay):
            log.info(
                "worker polling task queues %s and %s", settings.task_queue, evaluate_task_queue(settings.task_queue)
            )
            await (stop or asyncio.Event()).wait()


@contextlib.asynccontextmanager
async def _collecting(period: float) -> AsyncIterator[None]:
    """A full garbage collection every ``period`` seconds while the block runs, over what the worker made since it
    started: the objects alive at its start (modules, settings, pools) are frozen out of every pass."""
    # Each finished workflow run leaves reference cycles (its instance, decoded input, activity results). With a
    # heap this size the collector's own full passes are rare, so that garbage would pile up over thousands of
    # deliveries. Frozen, the start-up heap (modules, settings, pools) is not scanned again, so each pass stays small.
    gc.collect()
    gc.freeze()

    async def collect() -> None:
        while True:
            await asyncio.sleep(period)
            began = time.perf_counter()
            found = gc.collect()
            log.debug("gc: %d unreachable objects in %.1f ms", found, (time.perf_counter() - began) * 1000)

    task = asyncio.create_task(collect(), name="worker-gc")
    try:
        yield
    finally:
        task.cancel()
        gc.unfreeze()


@contextlib.asynccontextmanager
async def _beating(path: Path) -> AsyncIterator[None]:
    # Touched while the worker runs; `switchboard worker-health` (the container health check) reads its age.
    async def beat() -> None:
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        while True:
            await asyncio.to_thread(path.touch)
            await asyncio.sleep(LIVENESS_PERIOD)

    task = asyncio.create_task(beat(), name="worker-liveness")
    try:
        yield
    finally:
        await tasks.stop(task)


def worker_is_alive(home: Path, max_age: float = 3 * LIVENESS_PERIOD) -> bool:
    """Whether a worker under this home touched its liveness file recently."""
    try:
        return time.time() - (home / LIVENESS_FILE).stat().st_mtime < max_age
    except FileNotFoundError:
        return False

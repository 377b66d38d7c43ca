"""The composition root: the one place that builds pools, stores, sandbox pools and the Temporal client.

A process plays one or both of two roles, and each role gets its resources here:

- the **worker** role (`worker.running_worker`: `switchboard worker`, and the worker an API process hosts):
  a pool whose callers (activities) wait for a connection, the evaluation sandbox, a connected client;
- the **API** role (`api.app.create_app`'s lifespan): a pool whose callers (requests) give up after
  `SWITCHBOARD_DB_POOL_TIMEOUT` and answer 503, the /healthz probe's own connection, the rule verbs' own sandbox,
  a lazily connected client (the API comes up, and accepts into the inbox, while Temporal is unreachable).

A process hosting both roles (`switchboard dev`, `switchboard api` with SWITCHBOARD_API_WORKER) shares one
Temporal client between them, so ingest's eager starts run on its own worker, but keeps one pool per role, on
purpose: the two want different waits (a request must answer 503 within the pool timeout, a commit should wait
its turn), and a flood of agent calls holding every request connection must not starve the commits that
finish deliveries. Everything else receives what is built here.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from temporalio.client import Client

from routing.sandbox import SandboxPool
from store.collectors import CollectorStore
from store.commits import CommitStore
from store.crypto import SecretBox, check_secret_key
from store.db import Pool, open_pool
from store.doorbell import DoorbellStore
from store.events import EventStore
from store.health import HealthProbe
from store.identity import IdentityStore
from store.inbox import InboxStore
from store.llm import Ceilings, LlmStore
from store.reconcile_ledger import ReconcileLedger
from store.reconcilers import Limits, ReconcilerStore
from store.routes import RouteStore
from store.rules import RuleStore
from store.schedules import ScheduleStore
from store.todos import TodoStore
from store.webhooks import WebhookStore
from switchboard import tracing
from switchboard.metrics import sandbox_observer
from switchboard.settings import Settings
from switchboard.temporal import connect

# Long enough for a dry-run queued behind other callers' backtests (each event at most the 250 ms budget) to wait
# its turn rather than report sandbox_busy.
RULE_TEST_WAIT = 10.0


@dataclass(frozen=True)
class Stores:
    """Every store, over one pool; a role builds them once and hands them to whatever needs one."""

    identities: IdentityStore
    webhooks: WebhookStore
    rules: RuleStore
    routes: RouteStore
    collectors: CollectorStore
    todos: TodoStore
    events: EventStore
    schedules: ScheduleStore
    inbox: InboxStore
    commits: CommitStore
    doorbell: DoorbellStore
    llm: LlmStore
    reconcilers: ReconcilerStore
    reconcile_ledger: ReconcileLedger


def secret_box(settings: Settings) -> SecretBox:
    """The box that seals secrets at rest with the process's key."""
    if not settings.secret_key:
        raise RuntimeError("SWITCHBOARD_SECRET_KEY is not set (Settings.ensure_generated_secrets fills it)")
    return SecretBox(settings.secret_key)


def build_stores(pool: Pool, settings: Settings) -> Stores:
    """Every store over `pool`, secrets at rest sealed with the process's key."""
    box = secret_box(settings)
    webhooks = WebhookStore(pool, box)
    return Stores(
        identities=IdentityStore(pool),
        webhooks=webhooks,
        rules=RuleStore(pool, webhooks),
        routes=RouteStore(pool),
        collectors=CollectorStore(pool, box),
        todos=TodoStore(pool),
        events=EventStore(pool),
        schedules=ScheduleStore(pool),
        inbox=InboxStore(pool),
        commits=CommitStore(pool),
        doorbell=DoorbellStore(pool),
        llm=LlmStore(pool, box, webhooks),
        reconcilers=ReconcilerStore(pool, box, webhooks),
        reconcile_ledger=ReconcileLedger(pool, box),
    )


def llm_ceilings(settings: Settings) -> Ceilings:
    """The operator's caps on LLM triage (SWITCHBOARD_LLM_*), read by the save-time check and the activity alike."""
    return Ceilings(
        per_minute=settings.llm_triage_per_minute_max,
        per_day=settings.llm_triage_per_day_max,
        timeout_seconds=settings.llm_timeout_max_seconds,
    )


def reconcile_limits(settings: Settings) -> Limits:
    """The operator's bounds on what owners may configure for reconciliation (SWITCHBOARD_RECONCILE_*)."""
    return Limits(
        api_urls=settings.reconcile_api_url_set(), interval_min_seconds=settings.reconcile_interval_min_seconds
    )


def evaluation_sandbox(settings: Settings) -> SandboxPool:
    """The jq sandbox of a worker's evaluate queue: one child per evaluate slot (plus a spare)."""
    return SandboxPool(max_children=settings.sandbox_slots, observer=sandbox_observer("delivery"))


def rule_test_sandbox(settings: Settings) -> SandboxPool:
    """The rule verbs' own sandbox (dry-runs, backtests, save-time compiles), never a delivery's.

    Children start on first use; a verb waits up to RULE_TEST_WAIT for one before answering sandbox_busy.
    """
    return SandboxPool(
        max_children=settings.rule_test_slots, acquire_timeout=RULE_TEST_WAIT, observer=sandbox_observer("rule_test")
    )


def _database_url(settings: Settings) -> str:
    if not settings.database_url:
        raise RuntimeError("SWITCHBOARD_DATABASE_URL is not set")
    return settings.database_url


@dataclass(frozen=True)
class WorkerResources:
    """What the worker role runs on."""

    pool: Pool
    sandbox: SandboxPool
    temporal: Client


@contextlib.asynccontextmanager
async def worker_resources(settings: Settings) -> AsyncIterator[WorkerResources]:
    """The worker role's pool, evaluation sandbox and connected Temporal client, for the lifetime of the block."""
    tracing.install(tracing.WORKER)  # before the pool and the client: both are instrumented when they are made
    async with contextlib.AsyncExitStack() as stack:
        pool = await open_pool(_database_url(settings), max_size=settings.db_pool_max)
        stack.push_async_callback(pool.close)
        # Before anything runs: a changed key refuses to start rather than failing every signed delivery.
        await check_secret_key(pool, secret_box(settings))
        sandbox = evaluation_sandbox(settings)
        stack.push_async_callback(sandbox.close)
        yield WorkerResources(pool=pool, sandbox=sandbox, temporal=await connect(settings))


@dataclass(frozen=True)
class ApiResources:
    """What the API role runs on."""

    pool: Pool
    health: HealthProbe
    stores: Stores
    rule_sandbox: SandboxPool
    temporal: Client | None


@contextlib.asynccontextmanager
async def api_resources(settings: Settings, *, temporal: Client | None = None) -> AsyncIterator[ApiResources]:
    """The API role's pools, stores, rule sandbox and Temporal client (`temporal` when given, e.g. the one of
    the worker this process hosts), for the lifetime of the block."""
    url = _database_url(settings)
    tracing.install(tracing.API)  # before the pools and the client: both are instrumented when they are made
    async with contextlib.AsyncExitStack() as stack:
        pool = await open_pool(
            url,
            max_size=settings.db_pool_max,
            pool_timeout=settings.db_pool_timeout,
            statement_timeout=settings.db_statement_timeout,
        )
        stack.push_async_callback(pool.close)
        # Before anything is served: a changed key refuses to start rather than answering 503 to signed deliveries.
        await check_secret_key(pool, secret_box(settings))
        # Lazy: the API comes up (and accepts deliveries into the inbox) even while Temporal is unreachable.
        client = temporal
        if client is None and settings.temporal_address:
            client = await connect(settings, lazy=True)
        rule_sandbox = rule_test_sandbox(settings)
        stack.push_async_callback(rule_sandbox.close)
        # Its own connection, so /healthz answers in bounded time however busy the request pool is.
        health = HealthProbe(url)
        stack.push_async_callback(health.close)
        yield ApiResources(
            pool=pool,
            health=health,
            stores=build_stores(pool, settings),
            rule_sandbox=rule_sandbox,
            temporal=client,
        )

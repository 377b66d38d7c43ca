"""The FastAPI application: ingest, agent verbs, admin verbs, health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from temporalio.client import Client

from api import admin, ingest, stream
from api.agent import agent_router
from api.clientaddr import ClientAddressMiddleware
from api.deps import Services, services
from api.docs import install_docs
from api.doorbell import run_doorbell
from api.errors import install_error_handlers
from api.mcp import McpSurface
from api.metrics import router as metrics_router
from api.middleware import AgentAuthMiddleware, BodyLimitMiddleware, RequestLogMiddleware
from routing.sandbox import SandboxPool
from store.db import open_pool, ping
from store.doorbell import DoorbellStore
from switchboard.logs import install_masking
from switchboard.metrics import sandbox_observer
from switchboard.settings import Settings
from switchboard.temporal import connect

log = logging.getLogger("switchboard.api")

# Longer than a delivery's local wait used to be: a dry-run queued behind other callers' backtests (each event
# at most the 250 ms budget) waits its turn rather than reporting sandbox_busy.
RULE_TEST_WAIT = 10.0

DESCRIPTION = """Switchboard turns webhook deliveries into durable, explainable work for AI agents.

* Producers POST to `/webhooks/w/{ingest_token}`.
* Agents call `POST /v1/{verb}` with `Authorization: Bearer sbk_…`.
* Operators call `POST /admin/v1/{verb}` with the admin token.
"""


def create_app(settings: Settings, *, temporal: Client | None = None) -> FastAPI:
    """Build the app; the lifespan opens the pool, the rule verbs' sandbox and (unless given) the Temporal client.

    The dry-run and backtest verbs, and every rule verb's save-time compile (libjq must never compile a rule in
    this process), get a sandbox pool of their own (SWITCHBOARD_RULE_TEST_SLOTS children), so they can never
    take a slot from a delivery's evaluation, which runs on the evaluate workers.
    """

    # Before anything can log: every record of the process is masked (ingest tokens, credentials, secrets).
    install_masking([settings.admin_token, settings.secret_key])
    mcp = McpSurface(body_max=settings.agent_body_max)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        assert settings.database_url, "SWITCHBOARD_DATABASE_URL is not set"
        settings.ensure_generated_secrets()
        install_masking([settings.admin_token, settings.secret_key])  # generated ones, too
        pool = await open_pool(
            settings.database_url, max_size=settings.db_pool_max, pool_timeout=settings.db_pool_timeout
        )
        # Lazy: the API comes up (and answers 503 on ingest) even while Temporal is unreachable.
        client = temporal
        if client is None and settings.temporal_address:
            client = await connect(settings, lazy=True)
        # Children start on the first dry-run; a verb waits up to RULE_TEST_WAIT for one before sandbox_busy.
        rule_sandbox = SandboxPool(
            max_children=settings.rule_test_slots,
            acquire_timeout=RULE_TEST_WAIT,
            observer=sandbox_observer("rule_test"),
        )
        app.state.services = Services.build(settings, pool, client, rule_sandbox=rule_sandbox)
        # Its own connection, so /healthz answers in bounded time however busy the request pool is.
        health_pool = await open_pool(
            settings.database_url, max_size=1, min_size=1, pool_timeout=settings.health_timeout_seconds
        )
        app.state.services.extras["health_pool"] = health_pool
        hub = app.state.services.doorbell
        hub.watchers.append(mcp)  # a revoke closes the endpoint's MCP sessions too
        try:
            async with (
                run_doorbell(settings.database_url, hub, DoorbellStore(pool)) as listener,
                mcp.running(),
            ):
                app.state.doorbell = listener
                yield
        finally:
            await rule_sandbox.close()
            await health_pool.close()
            await pool.close()

    app = FastAPI(
        title="Switchboard",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        # Served by install_docs with local assets (the defaults load them from a CDN).
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    install_docs(app)
    app.include_router(metrics_router)
    app.include_router(ingest.router)
    app.include_router(agent_router())
    app.include_router(stream.router)
    mcp.install(app)
    app.include_router(admin.router)

    @app.get("/healthz", summary="Ready when PostgreSQL and Temporal answer.", tags=["health"])
    async def healthz(request: Request) -> JSONResponse:
        svc = services(request)
        limit = svc.settings.health_timeout_seconds

        async def postgres() -> None:
            health_pool = svc.extras.get("health_pool", svc.pool)
            await ping(health_pool, wait=limit)

        async def temporal() -> None:
            assert svc.temporal is not None
            if not await svc.temporal.service_client.check_health(timeout=timedelta(seconds=limit)):
                raise RuntimeError("Temporal reports unhealthy")

        async def check(probe: Callable[[], Awaitable[None]]) -> str:
            try:
                async with asyncio.timeout(limit):
                    await probe()
                return "ok"
            except Exception:
                return "unavailable"

        # Both at once, each cut off after the health timeout: the answer comes inside a second whatever is down.
        pg, tp = await asyncio.gather(check(postgres), check(temporal))
        checks = {"postgres": pg, "temporal": tp}
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"status": "ok" if ok else "degraded", **checks}, status_code=200 if ok else 503)

    app.add_middleware(AgentAuthMiddleware)
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.agent_body_max,
        prefixes=("/v1/", "/admin/", "/mcp"),
        json_prefixes=("/v1/", "/admin/"),
    )
    app.add_middleware(RequestLogMiddleware)
    # Outermost, so the logs, the buckets and `source_ip` all see the same client address.
    app.add_middleware(ClientAddressMiddleware, trusted=settings.trusted_proxies())
    return app

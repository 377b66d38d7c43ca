"""The FastAPI application: ingest, agent verbs, admin verbs, health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from temporalio.client import Client

from api import ingest, stream
from api.clientaddr import ClientAddressMiddleware
from api.codec_endpoint import codec_router
from api.deps import HealthDep, Services, SettingsDep, TemporalDep
from api.docs import install_docs
from api.doorbell import run_doorbell
from api.errors import install_error_handlers
from api.fastpath import VerbFastPath
from api.mcp import McpSurface
from api.metrics import router as metrics_router
from api.middleware import AgentAuthMiddleware, BodyLimitMiddleware, RequestLogMiddleware
from api.surface import install_verb_routes
from api.verbs import ADMIN_VERBS, REGISTRY
from runtime.root import api_resources
from switchboard import tracing
from switchboard.logs import install_masking
from switchboard.settings import Settings

log = logging.getLogger("switchboard.api")

DESCRIPTION = """Switchboard turns webhook deliveries into durable, explainable work for AI agents.

* Producers POST to `/webhooks/w/{ingest_token}`.
* Agents call `POST /v1/{verb}` with `Authorization: Bearer sbk_…`.
* Operators call `POST /admin/v1/{verb}` with the admin token.
"""


def create_app(settings: Settings, *, temporal: Client | None = None) -> FastAPI:
    """Build the app; the lifespan gets the API role's resources from the composition root (runtime/root.py):
    pools, stores, the rule verbs' sandbox and (unless given) a lazily connected Temporal client.

    The dry-run and backtest verbs, and every rule verb's save-time compile (libjq must never compile a rule in
    this process), get a sandbox pool of their own (SWITCHBOARD_RULE_TEST_SLOTS children), so they can never
    take a slot from a delivery's evaluation, which runs on the evaluate workers.
    """

    # Before anything can log: every record of the process is masked (ingest tokens, credentials, secrets).
    install_masking([settings.admin_token, settings.secret_key])
    ingest.check_body_cap(settings)
    mcp = McpSurface(body_max=settings.agent_body_max)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        assert settings.database_url, "SWITCHBOARD_DATABASE_URL is not set"
        settings.ensure_generated_secrets()
        install_masking([settings.admin_token, settings.secret_key])  # generated ones, too
        async with api_resources(settings, temporal=temporal) as resources:
            app.state.services = services = Services.build(settings, resources)
            services.doorbell.watchers.append(mcp)  # a revoke closes the endpoint's MCP sessions too
            async with (
                run_doorbell(settings.database_url, services.doorbell, resources.stores.doorbell) as listener,
                mcp.running(),
            ):
                app.state.doorbell = listener
                services.credentials.listener = listener  # from here the credential cache may be trusted
                try:
                    yield
                finally:
                    services.credentials.listener = None

    app = FastAPI(
        title="Switchboard",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        # Served by install_docs with local assets (the defaults load them from a CDN).
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app, {"/v1/": REGISTRY, "/admin/v1/": ADMIN_VERBS})
    install_docs(app)
    app.include_router(metrics_router)
    app.include_router(ingest.router)
    verb_routes = install_verb_routes(app)
    app.include_router(stream.router)
    app.include_router(codec_router(settings))
    mcp.install(app)

    @app.get("/healthz", summary="Ready when PostgreSQL and Temporal answer.", tags=["health"])
    async def healthz(settings: SettingsDep, health: HealthDep, client: TemporalDep) -> JSONResponse:
        limit = settings.health_timeout_seconds

        async def postgres() -> None:
            await health.ping(wait=limit)

        async def temporal() -> None:
            if client is None:
                raise RuntimeError("no Temporal address is configured")
            if not await client.service_client.check_health(timeout=timedelta(seconds=limit)):
                raise RuntimeError("Temporal reports unhealthy")

        async def check(name: str, probe: Callable[[], Awaitable[None]]) -> str:
            try:
                async with asyncio.timeout(limit):
                    await probe()
                return "ok"
            except TimeoutError:
                reason = f"no answer within {limit:g} s"
            except Exception as exc:
                reason = f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
            # Why, every time: a health check that only says "unavailable" sends an operator guessing.
            log.warning("health check: %s unavailable: %s", name, reason[:300])
            return "unavailable"

        # Both at once, each cut off after the health timeout: the answer comes inside a second whatever is down.
        pg, tp = await asyncio.gather(check("postgres", postgres), check("temporal", temporal))
        checks = {"postgres": pg, "temporal": tp}
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"status": "ok" if ok else "degraded", **checks}, status_code=200 if ok else 503)

    # Innermost, once the caller is known: POST /v1/{verb} straight to the verb's route (api/fastpath.py).
    app.add_middleware(VerbFastPath, routes=verb_routes)
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
    # Only with OTEL_EXPORTER_OTLP_ENDPOINT set: the request span wraps everything above (switchboard/tracing.py).
    tracing.instrument_app(app)
    return app

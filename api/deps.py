"""The services of one API process, built once in the app lifespan, and the typed dependencies routes declare."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from temporalio.client import Client

from api.admission import Admission
from api.credentials import CredentialCache
from api.doorbell import DoorbellHub
from api.ratelimit import KeyedLimits, TokenBuckets
from routing.sandbox import SandboxPool
from runtime.root import ApiResources
from store.collectors import CollectorStore
from store.commits import CommitStore
from store.db import Pool
from store.errors import Unauthenticated
from store.events import EventStore
from store.health import HealthProbe
from store.identity import IdentityStore
from store.inbox import InboxStore
from store.llm import LlmStore
from store.models import Caller
from store.reconcilers import ReconcilerStore
from store.routes import RouteStore
from store.rules import RuleStore
from store.schedules import ScheduleStore
from store.todos import TodoStore
from store.webhooks import WebhookStore
from switchboard.settings import Settings

# Per-endpoint verb buckets: "agent" (todo and read verbs), "authoring" (rules, routes, collectors, dry-runs,
# backtests), "webhook_admin" (create/rotate/delete of webhooks and schedules).
RateClass = Literal["agent", "authoring", "webhook_admin"]


@dataclass
class Services:
    """Stores, clients and limiters shared by every request of one API process (built by `Services.build`)."""

    settings: Settings
    pool: Pool
    # Its own connection, so /healthz answers in bounded time however busy the request pool is.
    health: HealthProbe
    temporal: Client | None
    identities: IdentityStore
    webhooks: WebhookStore
    rules: RuleStore
    routes: RouteStore
    collectors: CollectorStore
    todos: TodoStore
    events: EventStore
    schedules: ScheduleStore
    inbox: InboxStore
    # Stores a delivery whose start Temporal refused as a faulted event (api/ingest.py).
    commits: CommitStore
    llm: LlmStore
    reconcilers: ReconcilerStore
    # The rule verbs' own sandbox (dry-run, backtest, save-time compiles); deliveries evaluate on the workers.
    rule_sandbox: SandboxPool
    admission: Admission
    ingest_limits: TokenBuckets
    agent_limits: TokenBuckets
    authoring_limits: TokenBuckets
    webhook_admin_limits: TokenBuckets
    doorbell: DoorbellHub
    # Bearer credential → endpoint, trusted only while the doorbell listener hears revocations (api/credentials.py).
    credentials: CredentialCache
    # One backtest at a time per caller: up to 200 evaluations each, they queue behind their own caller's.
    backtests: KeyedLimits = field(default_factory=lambda: KeyedLimits(1))

    @classmethod
    def build(cls, settings: Settings, resources: ApiResources) -> Services:
        """The API process's services over the resources the composition root built (runtime/root.py)."""
        stores = resources.stores
        doorbell = DoorbellHub()
        credentials = CredentialCache(stores.identities, doorbell)
        doorbell.caches.append(credentials)
        return cls(
            settings=settings,
            pool=resources.pool,
            health=resources.health,
            temporal=resources.temporal,
            identities=stores.identities,
            webhooks=stores.webhooks,
            rules=stores.rules,
            routes=stores.routes,
            collectors=stores.collectors,
            todos=stores.todos,
            events=stores.events,
            schedules=stores.schedules,
            inbox=stores.inbox,
            commits=stores.commits,
            llm=stores.llm,
            reconcilers=stores.reconcilers,
            rule_sandbox=resources.rule_sandbox,
            admission=Admission(settings.ingest_max_inflight, settings.ingest_start_backoff_seconds),
            ingest_limits=TokenBuckets(settings.ingest_rate_per_second, settings.ingest_rate_burst),
            agent_limits=TokenBuckets(settings.agent_rate_per_second, settings.agent_rate_burst),
            authoring_limits=TokenBuckets(settings.authoring_rate_per_second, settings.authoring_rate_burst),
            webhook_admin_limits=TokenBuckets(
                settings.webhook_admin_rate_per_second, settings.webhook_admin_rate_burst
            ),
            doorbell=doorbell,
            credentials=credentials,
        )

    def limits_for(self, rate_class: RateClass) -> TokenBuckets:
        """The per-endpoint bucket map of a verb's rate class (HTTP and MCP both charge here)."""
        if rate_class == "webhook_admin":
            return self.webhook_admin_limits
        if rate_class == "authoring":
            return self.authoring_limits
        return self.agent_limits


def services(request: Request) -> Services:
    """The Services of the running app."""
    svc = request.app.state.services
    assert isinstance(svc, Services)
    return svc


# Typed dependencies (async, so FastAPI resolves them on the event loop, not in its thread pool). Each reads the
# running app's Services at request time.


async def get_services(request: Request) -> Services:
    """The Services of the running app."""
    return services(request)


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_settings(svc: ServicesDep) -> Settings:
    """The process settings."""
    return svc.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


ENDPOINT_SCHEME = "endpoint"
"""The OpenAPI security scheme of the agent routes: an endpoint credential."""

# Security schemes as OpenAPI shows them. AgentAuthMiddleware resolves the endpoint credential before any route
# runs; the admin routes check the admin token in require_admin. Neither answers on its own (auto_error=False):
# every refusal is the API's own 401.
endpoint_bearer = HTTPBearer(
    scheme_name=ENDPOINT_SCHEME,
    bearerFormat="sbk_…",
    description="An endpoint credential, vended once by an operator (`switchboard endpoint vend`).",
    auto_error=False,
)
admin_bearer = HTTPBearer(scheme_name="admin", description="The operator's SWITCHBOARD_ADMIN_TOKEN.", auto_error=False)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)]


async def get_caller(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(endpoint_bearer)]
) -> Caller:
    """The endpoint AgentAuthMiddleware resolved the bearer credential to."""
    caller = getattr(request.state, "caller", None)
    if not isinstance(caller, Caller):  # the middleware answers 401 first; this is a second lock
        raise Unauthenticated("missing bearer credential")
    return caller


CallerDep = Annotated[Caller, Depends(get_caller)]


async def get_temporal(svc: ServicesDep) -> Client | None:
    """The Temporal client (None when no address is configured)."""
    return svc.temporal


TemporalDep = Annotated[Client | None, Depends(get_temporal)]


async def get_health(svc: ServicesDep) -> HealthProbe:
    """The PostgreSQL probe of /healthz."""
    return svc.health


HealthDep = Annotated[HealthProbe, Depends(get_health)]


async def get_doorbell(svc: ServicesDep) -> DoorbellHub:
    """The doorbell hub of this process."""
    return svc.doorbell


DoorbellDep = Annotated[DoorbellHub, Depends(get_doorbell)]


async def require_admin(settings: SettingsDep, bearer: BearerDep) -> None:
    """The admin token must match, compared in constant time."""
    token = bearer.credentials.strip() if bearer is not None else ""
    expected = settings.admin_token or ""
    if not token or not expected or not hmac.compare_digest(token.encode(), expected.encode()):
        raise Unauthenticated("admin token required")

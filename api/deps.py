"""The services a request handler may use, built once in the app lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Request
from temporalio.client import Client

from api.admission import Admission
from api.doorbell import DoorbellHub
from api.ratelimit import KeyedLimits, TokenBuckets
from routing.sandbox import SandboxPool
from store.crypto import SecretBox
from store.db import Pool
from store.identity import IdentityStore
from store.inbox import InboxStore
from store.rules import RuleStore
from store.todos import TodoStore
from store.webhooks import WebhookStore
from switchboard.settings import Settings

# Per-endpoint verb buckets: "agent" (todo and read verbs), "authoring" (rules, routes, collectors, dry-runs,
# backtests), "webhook_admin" (create/rotate/delete of webhooks and schedules).
RateClass = Literal["agent", "authoring", "webhook_admin"]


@dataclass
class Services:
    """Stores, clients and limiters shared by every request of one API process."""

    settings: Settings
    pool: Pool
    temporal: Client | None
    identities: IdentityStore
    webhooks: WebhookStore
    todos: TodoStore
    rules: RuleStore
    inbox: InboxStore
    admission: Admission
    ingest_limits: TokenBuckets
    agent_limits: TokenBuckets
    authoring_limits: TokenBuckets
    webhook_admin_limits: TokenBuckets
    extras: dict[str, Any] = field(default_factory=dict)
    doorbell: DoorbellHub = field(default_factory=DoorbellHub)
    # The dry-run and backtest verbs' own sandbox; deliveries evaluate on the evaluate workers, never here.
    rule_sandbox: SandboxPool | None = None
    # One backtest at a time per caller: up to 200 evaluations each, they queue behind their own caller's.
    backtests: KeyedLimits = field(default_factory=lambda: KeyedLimits(1))

    @classmethod
    def build(
        cls, settings: Settings, pool: Pool, temporal: Client | None, *, rule_sandbox: SandboxPool | None = None
    ) -> Services:
        """Wire stores over one pool."""
        assert settings.secret_key
        box = SecretBox(settings.secret_key)
        webhooks = WebhookStore(pool, box)
        return cls(
            settings=settings,
            pool=pool,
            temporal=temporal,
            identities=IdentityStore(pool),
            webhooks=webhooks,
            todos=TodoStore(pool),
            rules=RuleStore(pool, webhooks),
            inbox=InboxStore(pool),
            admission=Admission(settings.ingest_max_inflight, settings.ingest_start_backoff_seconds),
            ingest_limits=TokenBuckets(settings.ingest_rate_per_second, settings.ingest_rate_burst),
            agent_limits=TokenBuckets(settings.agent_rate_per_second, settings.agent_rate_burst),
            authoring_limits=TokenBuckets(settings.authoring_rate_per_second, settings.authoring_rate_burst),
            webhook_admin_limits=TokenBuckets(
                settings.webhook_admin_rate_per_second, settings.webhook_admin_rate_burst
            ),
            rule_sandbox=rule_sandbox,
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

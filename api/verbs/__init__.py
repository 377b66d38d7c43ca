"""The verbs: importing this package registers every verb (agent and admin) in the one table."""

from __future__ import annotations

from api.verbs import (  # noqa: F401  (registration)
    admin,
    collectors,
    events,
    identity,
    inbox,
    llm_providers,
    quarantine,
    reconcilers,
    reroutes,
    routes,
    rule_compiler,
    rules,
    schedules,
    todos,
    triage,
    webhooks,
)
from api.verbs.registry import ADMIN_VERBS, REGISTRY, VERBS, Verb

__all__ = ["ADMIN_VERBS", "REGISTRY", "VERBS", "Verb"]

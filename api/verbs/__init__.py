"""Agent verbs: importing this package registers every verb in the registry."""

from __future__ import annotations

from api.verbs import (  # noqa: F401  (registration)
    collectors,
    events,
    identity,
    reroutes,
    routes,
    rules,
    schedules,
    todos,
    webhooks,
)
from api.verbs.registry import REGISTRY, Verb

__all__ = ["REGISTRY", "Verb"]

"""Agent verbs: importing this package registers every verb in the registry."""

from __future__ import annotations

from api.verbs import collectors, events, identity, routes, rules, schedules, todos, webhooks  # noqa: F401  (registration)
from api.verbs.registry import REGISTRY, Verb

__all__ = ["REGISTRY", "Verb"]

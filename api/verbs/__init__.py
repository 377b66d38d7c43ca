"""Agent verbs: importing this package registers every verb in the registry."""

from __future__ import annotations

from api.verbs import identity, todos, webhooks  # noqa: F401  (registration side effects)
from api.verbs.registry import REGISTRY, Verb

__all__ = ["REGISTRY", "Verb"]

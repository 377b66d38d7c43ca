"""Agent verbs of the routes family (registered on import by api.verbs)."""

from __future__ import annotations

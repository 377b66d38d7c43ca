"""Agent verbs of the events family (registered on import by api.verbs)."""

from __future__ import annotations

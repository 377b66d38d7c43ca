"""Agent verbs of the schedules family (registered on import by api.verbs)."""

from __future__ import annotations

"""Agent verbs of the rules family (registered on import by api.verbs)."""

from __future__ import annotations

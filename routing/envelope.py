"""The routing envelope: one JSON document built identically by the receiver, dry-run and backtest."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

KIND_HEADERS = ("x-github-event", "x-gitea-event", "x-cairn-event")


def parse_payload(body: bytes) -> Any:
    """The body as exactly one JSON value, or None."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def derive_kind(source: str, headers: Mapping[str, str], payload: Any) -> str | None:
    """cairn: the signed body's kind; otherwise the forge event headers in the spec's order."""
    if source == "cairn":
        if isinstance(payload, dict) and isinstance(payload.get("kind"), str):
            return str(payload["kind"])
        return None
    for name in KIND_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None

"""Request header normalisation: lower-cased and joined for verification, redacted for storage."""

from __future__ import annotations

import re
from collections.abc import Iterable

from routing.sources import SIGNATURE_HEADERS
from routing.text import MAX_HEADER_NAME_CHARS, MAX_HEADER_VALUE_CHARS, MAX_HEADERS_TOTAL_CHARS, cap_text

REDACTED = "«redacted»"

# Named explicitly even though the substring rule below also catches most of them, so that a future
# narrowing of the substring list can never silently start persisting a credential header. Every source
# type's signature headers come from its table row, so a new source type cannot forget them.
REDACTED_NAMES: frozenset[str] = (
    frozenset(
        {
            "authorization",
            "proxy-authorization",
            "cookie",
            "set-cookie",
            "x-api-key",
            "x-webhook-token",
        }
    )
    | SIGNATURE_HEADERS
)

# Producers invent their own credential headers; any name that smells like one is redacted.
REDACTED_SUBSTRINGS: tuple[str, ...] = ("signature", "token", "secret", "api-key", "apikey", "auth")

# A secret-looking query parameter anywhere inside a header value (e.g. a Referer or Link carrying
# ?access_token=…). The lookbehind stops "notsig=" matching as "sig="; the optional "<word>_" prefix
# deliberately widens the list to refresh_token=, client_secret= and friends, since over-redacting a
# stored header costs nothing while under-redacting leaks a credential into the event history.
_SECRET_PARAM = re.compile(
    r"(?<![A-Za-z0-9_.\-])"
    r"((?:[A-Za-z0-9.\-]+_)?(?:access_token|token|api_key|apikey|secret|signature|sig))"
    r"=([^&\s;,#\"'<>]+)",
    re.IGNORECASE,
)


def _joined(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Lower-case names and join repeated headers with ", " in arrival order."""
    out: dict[str, str] = {}
    for name, value in items:
        key = name.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def is_sensitive_header(name: str) -> bool:
    """True when a header's whole value must never be stored."""
    lowered = name.lower()
    return lowered in REDACTED_NAMES or any(s in lowered for s in REDACTED_SUBSTRINGS)


def redact_query_secrets(value: str) -> str:
    """Replace the value of every secret-looking query parameter inside a header value."""
    return _SECRET_PARAM.sub(lambda m: f"{m.group(1)}={REDACTED}", value)


def lower_headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Lower-cased, joined, unredacted headers: the view signature verification needs."""
    return _joined(items)


def sanitize_headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Lower-cased, joined headers with credentials redacted, cleaned and capped: the only form that may be persisted.

    Each name is capped at 256 characters and each value at 8 KiB (routing.text, "…" marks a cut); once the
    names and values reach 64 KiB in total, the remaining headers are left out, in arrival order.
    """
    out: dict[str, str] = {}
    budget = MAX_HEADERS_TOTAL_CHARS
    for raw_name, raw_value in _joined(items).items():
        # Redaction decides on the full name: a cut name must never shed the word that makes it sensitive.
        value = REDACTED if is_sensitive_header(raw_name) else redact_query_secrets(raw_value)
        name = cap_text(raw_name, MAX_HEADER_NAME_CHARS)
        value = cap_text(value, MAX_HEADER_VALUE_CHARS)
        budget -= len(name) + len(value)
        if budget < 0:
            break
        out[name] = value
    return out

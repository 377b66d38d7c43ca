"""Text a delivery or a caller supplies, made storable: the one place that knows what PostgreSQL refuses.

PostgreSQL's text and jsonb types cannot hold NUL (U+0000), and UTF-8 (the database encoding, the sandbox
wire format, Temporal's JSON payloads) cannot encode a lone UTF-16 surrogate (U+D800..U+DFFF), which a JSON
body can smuggle in as an escape such as ``"\\ud800"``. Either one in a column makes the commit fail on every
retry. Every boundary that turns producer input into stored or routed text calls this module:

- producer text (kind, title, delivery id, header names and values, subject keys, envelope projections,
  fault details) is *cleaned*: each NUL or lone surrogate becomes U+FFFD, then it is *capped*; a capped
  value ends with "…" (U+2026) so a reader can tell it was cut;
- a JSON body with a lone surrogate routes on ``.payload`` with each lone surrogate replaced by U+FFFD
  (NUL stays, it is valid JSON), while the raw bytes are what is stored;
- caller input (verb arguments) holding either one is *refused* (invalid_argument), never cleaned, since
  a caller can fix it and a silent rewrite would store something the caller did not send.

It also holds the one JSON depth limit (MAX_JSON_DEPTH) every boundary applies: verb arguments deeper are refused
(too_deep), a delivery body deeper routes and is stored as bytes only, and a stored body deeper is read back as
text.

Pure and stdlib only.
"""

from __future__ import annotations

import json
import re
from typing import Any

REPLACEMENT = "\ufffd"
TRUNCATED = "\u2026"

# Caps for text derived from a delivery (characters unless named bytes). Documented in docs/api.md ("Ingest").
MAX_KIND_CHARS = 256
MAX_TITLE_CHARS = 200
MAX_HEADER_NAME_CHARS = 256
MAX_HEADER_VALUE_CHARS = 8192
# The stored headers of one delivery, names plus values; headers past this budget are left out.
MAX_HEADERS_TOTAL_CHARS = 65536
MAX_DELIVERY_ID_BYTES = 256
MAX_SUBJECT_CHARS = 256
MAX_DETAIL_CHARS = 512

# The deepest JSON accepted anywhere, counted in containers (`{"a": [1]}` is 2 deep); docs/api.md "Limits". No producer
# payload or verb argument comes near it (GitHub's nest under 10), while everything a value passes through handles
# it with room to spare: pydantic parses JSON to about 200 levels and serializes to about 250 (with the models
# around the value), Python's json to about 1,000, libjq to 10,000, PostgreSQL's jsonb to thousands.
MAX_JSON_DEPTH = 64

# In a Python str, a surrogate pair from a JSON escape is already one astral code point, so any code point in
# this range is a lone surrogate.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON escape that can decode to a surrogate; bodies without one cannot carry a lone surrogate (raw
# surrogate bytes are invalid UTF-8, so such a body is not JSON at all).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def clean_text(value: str) -> str:
    """value with each NUL and lone surrogate replaced by U+FFFD."""
    return _UNSTORABLE.sub(REPLACEMENT, value) if _UNSTORABLE.search(value) else value


def cap_text(value: str, limit: int) -> str:
    """value cleaned, and cut to at most limit characters ending in "…" when it was longer."""
    value = clean_text(value)
    if len(value) <= limit:
        return value
    return value[: limit - 1] + TRUNCATED


def cap_bytes(value: str, limit: int) -> str:
    """value cleaned, and cut to at most limit UTF-8 bytes ending in "…" when it was longer."""
    value = clean_text(value)
    raw = value.encode("utf-8")
    if len(raw) <= limit:
        return value
    mark = TRUNCATED.encode("utf-8")
    return raw[: limit - len(mark)].decode("utf-8", "ignore") + TRUNCATED


def clean_optional(value: str | None, limit: int) -> str | None:
    """cap_text for an optional value."""
    return None if value is None else cap_text(value, limit)


def is_storable(value: str) -> bool:
    """True when value holds neither NUL nor a lone surrogate."""
    return _UNSTORABLE.search(value) is None


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {_LONE_SURROGATE.sub(REPLACEMENT, k): _replace_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(v) for v in value]
    return value


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return _LONE_SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def may_hold_surrogate(body: bytes) -> bool:
    """True when a JSON body has an escape that could decode to a lone surrogate (a cheap pre-check)."""
    return _SURROGATE_ESCAPE.search(body) is not None


def replace_lone_surrogates(value: Any) -> tuple[Any, bool]:
    """A parsed JSON value with each lone surrogate in its strings and keys replaced by U+FFFD; and whether any was."""
    if not _has_surrogate(value):
        return value, False
    return _replace_surrogates(value), True


def clean_json(value: Any) -> Any:
    """A JSON-shaped value with every string and key cleaned, for a jsonb column; unchanged values are reused."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    return value


def nests_deeper(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a parsed JSON value nests more than `limit` containers deep (walked level by level, no recursion)."""
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below = []
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, dict | list):
                    below.append(child)
        level = below
    return False


class JsonTooDeep(ValueError):
    """JSON nested deeper than MAX_JSON_DEPTH."""

    def __init__(self) -> None:
        super().__init__(f"nested deeper than {MAX_JSON_DEPTH} levels")


def loads_bounded(text: str | bytes, **hooks: Any) -> Any:
    """json.loads within MAX_JSON_DEPTH: deeper is JsonTooDeep (a ValueError, like every other refusal), never a
    RecursionError, and never a value that a later reader or writer cannot handle."""
    try:
        value = json.loads(text, **hooks)
    except RecursionError:
        raise JsonTooDeep() from None
    if nests_deeper(value):
        raise JsonTooDeep()
    return value


def unstorable_field(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string or key holding NUL or a lone surrogate, or None when all are storable.

    Callers name it in an invalid_argument message; the value itself is never echoed.
    """
    if isinstance(value, str):
        return (path or "value") if not is_storable(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            name = str(key)
            here = f"{path}.{name}" if path else name
            if not is_storable(name):
                # The key itself cannot be shown either: name its parent.
                return f"{path or 'arguments'} (a key)"
            found = unstorable_field(item, here)
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = unstorable_field(item, f"{path}[{index}]" if path else f"[{index}]")
            if found is not None:
                return found
    return None

"""Webhook signature verification and delivery-id derivation. Pure: no I/O, the clock is a parameter."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from routing.text import MAX_DELIVERY_ID_BYTES, clean_text

SIGNED_SOURCES: frozenset[str] = frozenset({"github", "gitea", "stripe", "slack", "cairn"})
SOURCE_TYPES: frozenset[str] = SIGNED_SOURCES | {"generic"}

REPLAY_WINDOW_S = 300

_HEX64 = re.compile(r"[0-9A-Fa-f]{64}")
_UNIX_TS = re.compile(r"[0-9]{1,12}")
# RFC 3339 demands an explicit offset; datetime.fromisoformat alone would accept naive local times,
# which would make the replay window depend on the server's timezone.
_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)


class MissingSecret(Exception):
    """A signed source type has no signing secret configured; the receiver answers 503."""


@dataclass(frozen=True)
class Verification:
    """Outcome of verifying one delivery; detail is a short reason code, never secret material."""

    ok: bool
    verified: bool
    detail: str


@dataclass(frozen=True)
class GenericHmac:
    """Optional HMAC-SHA256 check for a generic webhook: which header carries it and how it is encoded."""

    header: str
    format: Literal["sha256=hex", "hex", "base64"]


def _ok() -> Verification:
    return Verification(ok=True, verified=True, detail="ok")


def _fail(detail: str) -> Verification:
    return Verification(ok=False, verified=False, detail=detail)


def _mac(secret: bytes, message: bytes) -> bytes:
    return hmac.new(secret, message, hashlib.sha256).digest()


def _hex_matches(expected: bytes, candidate: str) -> bool:
    """Constant-time compare of a digest against a hex string of either case."""
    # Decoding to bytes (rather than comparing lower-cased strings) makes case irrelevant without a
    # data-dependent transform of the attacker-supplied value before the compare.
    if not _HEX64.fullmatch(candidate):
        return False
    return hmac.compare_digest(expected, bytes.fromhex(candidate))


def _prefixed_hex(value: str, prefix: str) -> str | None:
    """The hex part of "<prefix><hex>", or None when the prefix is absent."""
    if value[: len(prefix)].lower() != prefix:
        return None
    return value[len(prefix) :]


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _within_window(ts: float, now: float) -> bool:
    return abs(now - ts) <= REPLAY_WINDOW_S


def _verify_sha256_prefixed(secret: bytes, value: str | None, body: bytes) -> Verification:
    """Shared check for the `sha256=<hex>` over-the-body scheme (github, gitea fallback, cairn)."""
    if value is None:
        return _fail("missing_signature")
    hex_part = _prefixed_hex(value, "sha256=")
    if hex_part is None or not _HEX64.fullmatch(hex_part):
        return _fail("malformed_signature")
    if not _hex_matches(_mac(secret, body), hex_part):
        return _fail("signature_mismatch")
    return _ok()


def _verify_github(secret: bytes, headers: Mapping[str, str], body: bytes) -> Verification:
    return _verify_sha256_prefixed(secret, _header(headers, "x-hub-signature-256"), body)


def _verify_gitea(secret: bytes, headers: Mapping[str, str], body: bytes) -> Verification:
    bare = _header(headers, "x-gitea-signature")
    if bare is None:
        # Gitea also sends the GitHub-compatible header; only consult it when its own is absent, so a
        # wrong X-Gitea-Signature can't be rescued by a second header.
        return _verify_github(secret, headers, body)
    if not _HEX64.fullmatch(bare):
        return _fail("malformed_signature")
    if not _hex_matches(_mac(secret, body), bare):
        return _fail("signature_mismatch")
    return _ok()


def _verify_stripe(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> Verification:
    value = _header(headers, "stripe-signature")
    if value is None:
        return _fail("missing_signature")
    timestamps: list[str] = []
    candidates: list[str] = []
    for part in value.split(","):
        key, sep, val = part.partition("=")
        if not sep:
            continue
        key, val = key.strip(), val.strip()
        if key == "t":
            timestamps.append(val)
        elif key == "v1":
            candidates.append(val)
    # Exactly one t: with two, which one was signed would be ambiguous.
    if len(timestamps) != 1 or not _UNIX_TS.fullmatch(timestamps[0]):
        return _fail("malformed_signature")
    if not candidates:
        return _fail("missing_signature")
    t = timestamps[0]
    expected = _mac(secret, t.encode("ascii") + b"." + body)
    # Evaluate every v1 rather than stopping at the first hit, so timing doesn't reveal which matched.
    matched = False
    for candidate in candidates:
        matched = _hex_matches(expected, candidate) or matched
    if not matched:
        return _fail("signature_mismatch")
    # Checked after the MAC so an out-of-window result means "authentic but stale", useful in logs.
    if not _within_window(int(t), now):
        return _fail("timestamp_out_of_window")
    return _ok()


def _verify_slack(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> Verification:
    value = _header(headers, "x-slack-signature")
    ts = _header(headers, "x-slack-request-timestamp")
    if value is None:
        return _fail("missing_signature")
    if ts is None:
        return _fail("missing_timestamp")
    if not _UNIX_TS.fullmatch(ts):
        return _fail("malformed_timestamp")
    hex_part = _prefixed_hex(value, "v0=")
    if hex_part is None or not _HEX64.fullmatch(hex_part):
        return _fail("malformed_signature")
    if not _hex_matches(_mac(secret, b"v0:" + ts.encode("ascii") + b":" + body), hex_part):
        return _fail("signature_mismatch")
    if not _within_window(int(ts), now):
        return _fail("timestamp_out_of_window")
    return _ok()


def parse_rfc3339(value: str) -> datetime | None:
    """An RFC 3339 timestamp with an explicit offset as an aware datetime, or None."""
    m = _RFC3339.fullmatch(value)
    if m is None:
        return None
    date, time, frac, offset = m.groups()
    # fromisoformat takes at most microseconds; RFC 3339 allows any precision.
    iso = f"{date}T{time}"
    if frac:
        iso += "." + frac[:6].ljust(6, "0")
    iso += "+00:00" if offset in ("Z", "z") else offset
    try:
        return datetime.fromisoformat(iso)
    except ValueError:
        return None


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _verify_cairn(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> Verification:
    sig = _verify_sha256_prefixed(secret, _header(headers, "x-cairn-signature"), body)
    if not sig.ok:
        return sig
    # Cairn's replay protection lives inside the signed body, so only now may we trust its fields.
    doc = _json_object(body)
    if doc is None:
        return _fail("invalid_body")
    event_id = doc.get("event_id")
    if not isinstance(event_id, str) or not event_id:
        return _fail("missing_event_id")
    created_raw = doc.get("created_at")
    if not isinstance(created_raw, str) or not created_raw:
        return _fail("missing_created_at")
    created = parse_rfc3339(created_raw)
    if created is None:
        return _fail("invalid_created_at")
    if not _within_window(created.timestamp(), now):
        return _fail("timestamp_out_of_window")
    # The header is unsigned: a mismatch means someone is trying to steer dedup, so refuse outright.
    header_id = headers.get("x-cairn-event-id")
    # surrogatepass: a lone surrogate escape in the signed event_id must compare, not raise.
    if header_id is not None and not hmac.compare_digest(
        header_id.strip().encode("utf-8", "surrogatepass"), event_id.encode("utf-8", "surrogatepass")
    ):
        return _fail("event_id_mismatch")
    return _ok()


def _verify_generic_hmac(secret: bytes, config: GenericHmac, headers: Mapping[str, str], body: bytes) -> Verification:
    value = _header(headers, config.header.lower())
    if value is None:
        return _fail("missing_signature")
    expected = _mac(secret, body)
    if config.format == "base64":
        try:
            given = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return _fail("malformed_signature")
        if len(given) != len(expected):
            return _fail("malformed_signature")
        return _ok() if hmac.compare_digest(expected, given) else _fail("signature_mismatch")
    hex_part = _prefixed_hex(value, "sha256=") if config.format == "sha256=hex" else value
    if hex_part is None or not _HEX64.fullmatch(hex_part):
        return _fail("malformed_signature")
    return _ok() if _hex_matches(expected, hex_part) else _fail("signature_mismatch")


def verify(
    source_type: str,
    secret: bytes | None,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    *,
    generic_hmac: GenericHmac | None = None,
) -> Verification:
    """Verify a delivery against its source type's scheme; headers must already be lower-cased."""
    if source_type not in SOURCE_TYPES:
        raise ValueError(f"unknown source type: {source_type!r}")
    if source_type == "generic" and generic_hmac is None:
        # Token trust: the unguessable URL already authenticated the caller; the body is not verified.
        return Verification(ok=True, verified=False, detail="token")
    # An empty key is an HMAC anyone can compute, so it counts as no secret at all.
    if not secret:
        raise MissingSecret(source_type)
    if source_type == "github":
        return _verify_github(secret, headers, body)
    if source_type == "gitea":
        return _verify_gitea(secret, headers, body)
    if source_type == "stripe":
        return _verify_stripe(secret, headers, body, now)
    if source_type == "slack":
        return _verify_slack(secret, headers, body, now)
    if source_type == "cairn":
        return _verify_cairn(secret, headers, body, now)
    assert generic_hmac is not None
    return _verify_generic_hmac(secret, generic_hmac, headers, body)


def _usable_id(value: object) -> str | None:
    """A candidate id if it is a non-empty string of at most 256 UTF-8 bytes (after cleaning, routing.text)."""
    if not isinstance(value, str):
        return None
    # Cleaned first, so NUL or a lone surrogate becomes U+FFFD and the byte cap measures what is stored.
    value = clean_text(value.strip())
    # Oversized ids are producer-controlled and would bloat the unique index; fall through instead.
    if not value or len(value.encode("utf-8")) > MAX_DELIVERY_ID_BYTES:
        return None
    return value


def _is_structured_cloudevent(headers: Mapping[str, str]) -> bool:
    media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media_type == "application/cloudevents+json"


def _body_field(body: bytes, field: str) -> str | None:
    doc = _json_object(body)
    return _usable_id(doc.get(field)) if doc is not None else None


def body_fallback_id(body: bytes) -> str:
    """The content-addressed delivery id used when the producer supplies none."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def delivery_id(source_type: str, headers: Mapping[str, str], body: bytes) -> str:
    """The producer's delivery id for dedup, or a SHA-256 of the body when there is none usable."""
    if source_type not in SOURCE_TYPES:
        raise ValueError(f"unknown source type: {source_type!r}")
    found: str | None = None
    if source_type == "cairn":
        found = _body_field(body, "event_id")
    elif source_type == "github":
        found = _usable_id(headers.get("x-github-delivery"))
    elif source_type == "gitea":
        found = _usable_id(headers.get("x-gitea-delivery"))
    elif source_type == "stripe":
        found = _body_field(body, "id")
    elif source_type == "slack":
        found = _body_field(body, "event_id")
    else:
        for name in ("x-delivery-id", "webhook-id", "ce-id"):
            found = _usable_id(headers.get(name))
            if found is not None:
                break
        if found is None and _is_structured_cloudevent(headers):
            found = _body_field(body, "id")
    return found if found is not None else body_fallback_id(body)


def sign_github(secret: bytes, body: bytes) -> dict[str, str]:
    """Headers GitHub would send for body signed with secret."""
    return {"x-hub-signature-256": "sha256=" + _mac(secret, body).hex()}


def sign_gitea(secret: bytes, body: bytes) -> dict[str, str]:
    """Headers Gitea would send (its bare-hex header) for body signed with secret."""
    return {"x-gitea-signature": _mac(secret, body).hex()}


def sign_stripe(secret: bytes, body: bytes, t: int) -> dict[str, str]:
    """Headers Stripe would send for body signed with secret at unix time t."""
    digest = _mac(secret, str(t).encode("ascii") + b"." + body).hex()
    return {"stripe-signature": f"t={t},v1={digest}"}


def sign_slack(secret: bytes, body: bytes, ts: int) -> dict[str, str]:
    """Headers Slack would send for body signed with secret at unix time ts."""
    digest = _mac(secret, b"v0:" + str(ts).encode("ascii") + b":" + body).hex()
    return {"x-slack-signature": "v0=" + digest, "x-slack-request-timestamp": str(ts)}


def sign_cairn(secret: bytes, body: bytes) -> dict[str, str]:
    """Headers cairn would send for body signed with secret (event_id/created_at live in the body)."""
    return {"x-cairn-signature": "sha256=" + _mac(secret, body).hex()}


def sign_generic(secret: bytes, body: bytes, config: GenericHmac) -> dict[str, str]:
    """Headers a generic producer configured with config would send for body."""
    digest = _mac(secret, body)
    if config.format == "base64":
        value = base64.b64encode(digest).decode("ascii")
    elif config.format == "hex":
        value = digest.hex()
    else:
        value = "sha256=" + digest.hex()
    return {config.header.lower(): value}

"""Webhook signature schemes, one verifier (and the producer's signer) per scheme. Pure: no I/O, the clock is a
parameter.

Which source type uses which verifier is the source-type table's business (routing/sources.py), and so is
dispatching on a source type: this module knows schemes, not sources.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from routing.text import loads_bounded

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


Verifier = Callable[[bytes, Mapping[str, str], bytes, float], Verification]
"""A scheme's check: (secret, lower-cased headers, raw body, now) → Verification. Schemes without a clock ignore now."""
Signer = Callable[[bytes, bytes, float], dict[str, str]]
"""A scheme's producer side: (secret, raw body, now) → the headers a producer signs it with (lower-cased names).

`switchboard send` signs test deliveries with these; tests/signing.py is a second implementation, written from the
producers' documentation, that the tests hold these to."""


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


def verify_github(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> Verification:
    """GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body; no replay window (GitHub sends no timestamp)."""
    return _verify_sha256_prefixed(secret, _header(headers, "x-hub-signature-256"), body)


def verify_gitea(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> Verification:
    """Gitea: bare-hex `X-Gitea-Signature` over the body, else the GitHub-compatible header; no replay window."""
    bare = _header(headers, "x-gitea-signature")
    if bare is None:
        # Gitea also sends the GitHub-compatible header; only consult it when its own is absent, so a
        # wrong X-Gitea-Signature can't be rescued by a second header.
        return verify_github(secret, headers, body, now)
    if not _HEX64.fullmatch(bare):
        return _fail("malformed_signature")
    if not _hex_matches(_mac(secret, body), bare):
        return _fail("signature_mismatch")
    return _ok()


def _stripe_signed(t: str, body: bytes) -> bytes:
    """What Stripe signs: `<t>.<body>`."""
    return t.encode("ascii") + b"." + body


def _slack_signed(ts: str, body: bytes) -> bytes:
    """What Slack signs: `v0:<ts>:<body>`."""
    return b"v0:" + ts.encode("ascii") + b":" + body


def verify_stripe(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> Verification:
    """Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=…]` over `<t>.<body>`; any v1 may match; t within the window."""
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
    expected = _mac(secret, _stripe_signed(t, body))
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


def verify_slack(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> Verification:
    """Slack: `X-Slack-Signature: v0=<hex>` over `v0:<ts>:<body>`, ts from `X-Slack-Request-Timestamp`, in the window."""
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
    if not _hex_matches(_mac(secret, _slack_signed(ts, body)), hex_part):
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


def json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None; how signed-body fields (cairn's event_id, delivery ids) are read.

    A body nested past MAX_JSON_DEPTH has no fields, as for `.payload` (routing/envelope.py).
    """
    try:
        value = loads_bounded(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def verify_cairn(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> Verification:
    """cairn: `X-Cairn-Signature: sha256=<hex>` over a body that carries event_id and a created_at in the window."""
    sig = _verify_sha256_prefixed(secret, _header(headers, "x-cairn-signature"), body)
    if not sig.ok:
        return sig
    # Cairn's replay protection lives inside the signed body, so only now may we trust its fields.
    doc = json_object(body)
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


def generic_hmac_verifier(config: GenericHmac) -> Verifier:
    """The verifier for a generic collector's configured HMAC-SHA256 (its header and encoding)."""

    def verifier(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> Verification:
        return _verify_generic_hmac(secret, config, headers, body)

    return verifier


def _hex(secret: bytes, message: bytes) -> str:
    return _mac(secret, message).hex()


def sign_github(secret: bytes, body: bytes, now: float) -> dict[str, str]:
    """GitHub's header for body: `X-Hub-Signature-256: sha256=<hex>`."""
    return {"x-hub-signature-256": "sha256=" + _hex(secret, body)}


def sign_gitea(secret: bytes, body: bytes, now: float) -> dict[str, str]:
    """Gitea's headers for body: its bare-hex `X-Gitea-Signature` and the GitHub-compatible one."""
    return {"x-gitea-signature": _hex(secret, body), **sign_github(secret, body, now)}


def sign_stripe(secret: bytes, body: bytes, now: float) -> dict[str, str]:
    """Stripe's header for body sent at now: `Stripe-Signature: t=<unix>,v1=<hex of "<t>.<body>">`."""
    t = str(int(now))
    return {"stripe-signature": f"t={t},v1={_hex(secret, _stripe_signed(t, body))}"}


def sign_slack(secret: bytes, body: bytes, now: float) -> dict[str, str]:
    """Slack's headers for body sent at now: `X-Slack-Signature: v0=<hex of "v0:<ts>:<body>">` and the timestamp."""
    ts = str(int(now))
    return {
        "x-slack-signature": "v0=" + _hex(secret, _slack_signed(ts, body)),
        "x-slack-request-timestamp": ts,
    }


def sign_cairn(secret: bytes, body: bytes, now: float) -> dict[str, str]:
    """cairn's header for body (its event_id and created_at travel inside the signed body)."""
    return {"x-cairn-signature": "sha256=" + _hex(secret, body)}


def generic_hmac_signer(config: GenericHmac) -> Signer:
    """The signer a generic producer configured like config uses: HMAC-SHA256 of the body in its header."""

    def signer(secret: bytes, body: bytes, now: float) -> dict[str, str]:
        digest = _mac(secret, body)
        if config.format == "base64":
            value = base64.b64encode(digest).decode("ascii")
        else:
            value = ("sha256=" if config.format == "sha256=hex" else "") + digest.hex()
        return {config.header.lower(): value}

    return signer

"""The source types: one table row per producer kind, read by every place that needs to know one. Pure.

A row says how a source is trusted and verified, where its producer's own delivery id and its .kind travel,
whether agents may use it, and the few receiver habits it needs. The receiver, the dry-run, the webhook and
collector stores, the vend check and the header redaction all read this table; nothing else names a source
type to decide how to treat it. Adding a source type is one row here, its verifier in routing/signatures.py,
and tests (docs/architecture.md "Source types").
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from routing.signatures import (
    GenericHmac,
    MissingSecret,
    Signer,
    Verification,
    Verifier,
    generic_hmac_verifier,
    sign_cairn,
    sign_gitea,
    sign_github,
    sign_slack,
    sign_stripe,
    verify_cairn,
    verify_gitea,
    verify_github,
    verify_slack,
    verify_stripe,
)
from routing.text import MAX_DELIVERY_ID_BYTES, clean_text

_UNPARSED: Any = object()

TrustMode = Literal["signed", "token", "internal"]
# signed: the body carries the producer's HMAC under a per-webhook secret. token: the unguessable ingest URL is
# the credential and the body is not verified (unless a generic collector configures an HMAC). internal:
# switchboard itself is the producer; no URL resolves for it.

CLOUDEVENTS_STRUCTURED = "application/cloudevents+json"


@dataclass(frozen=True)
class DeliveryIdRule:
    """Where the producer's own delivery id travels: headers tried in order, then a top-level body field.

    body_media_type, when set, makes the body field count only for that media type (a structured CloudEvent's
    id; a plain JSON body's "id" is the producer's data, not a delivery id).
    """

    headers: tuple[str, ...] = ()
    body_field: str | None = None
    body_media_type: str | None = None

    def reads_body(self, headers: Mapping[str, str]) -> bool:
        """Whether the body field applies to a delivery with these (lower-cased) headers."""
        if self.body_field is None:
            return False
        return self.body_media_type is None or media_type(headers.get("content-type")) == self.body_media_type


@dataclass(frozen=True)
class KindRule:
    """Where a delivery's .kind comes from: the first signed-body path holding a string, else the first header.

    A rule with body paths never reads a header: the headers are unsigned, and a verified kind must not change
    with them.
    """

    body_paths: tuple[tuple[str, ...], ...] = ()
    headers: tuple[str, ...] = ()


# SPEC-0020 .kind: "otherwise X-GitHub-Event, then X-Gitea-Event, then X-Cairn-Event". One order for every
# header-kinded source, so a generic webhook fed by a forge gets the forge's event name.
FORGE_KIND = KindRule(headers=("x-github-event", "x-gitea-event", "x-cairn-event"))


@dataclass(frozen=True)
class SourceType:
    """One source type: trust, verification, delivery id, kind and the receiver habits it needs."""

    name: str
    trust_mode: TrustMode
    # The scheme that verifies the body, or None (token trust, or internal).
    verifier: Verifier | None
    # Every header the producer signs with, verified or not: always redacted before storage (routing/headers.py).
    signature_headers: tuple[str, ...]
    delivery_id: DeliveryIdRule
    kind: KindRule = FORGE_KIND
    # Switchboard's own (schedule fires): no agent may vend, create or reach one; its URL never resolves.
    reserved: bool = False
    # Takes a generic collector configuration (an optional HMAC, a kind rule) via configure_webhook.
    collector: bool = False
    # The .issue projection (SPEC-0020): "source" names the provider after the source type, "event_header"
    # after the forge event header the delivery carries (X-Gitea-Event → gitea, else github); None: never.
    issue_provider: Literal["source", "event_header"] | None = None
    # The producer gives up sooner than SWITCHBOARD_INGEST_WAIT_SECONDS: answer within its window (ours).
    wait_cap_seconds: float | None = None
    # Answers Slack's signed url_verification handshake with its challenge, minting nothing.
    url_verification: bool = False
    # The producer's side of the verifier's scheme (`switchboard send`); None where nothing is signed.
    signer: Signer | None = None
    # Who sent the delivery, for .actor and the trust gate (routing/trust.py): "forge" (sender and author logins
    # of a signed forge body), "cairn" (the signed actor_id); None: no actor, no gate.
    actor: Literal["forge", "cairn"] | None = None

    def verifies(self, *, collector_hmac: bool) -> bool:
        """Whether a delivery of this source that passed the receiver was verified (not only token-trusted)."""
        return self.verifier is not None or (self.collector and collector_hmac)


_ROWS = (
    SourceType(
        "github",
        "signed",
        verify_github,
        ("x-hub-signature-256", "x-hub-signature"),
        DeliveryIdRule(headers=("x-github-delivery",)),
        issue_provider="source",
        signer=sign_github,
        actor="forge",
    ),
    SourceType(
        "gitea",
        "signed",
        verify_gitea,
        ("x-gitea-signature", "x-gogs-signature", "x-hub-signature-256", "x-hub-signature"),
        DeliveryIdRule(headers=("x-gitea-delivery",)),
        issue_provider="source",
        # Gitea gives up after 5 s (its DELIVER_TIMEOUT default).
        wait_cap_seconds=4.0,
        signer=sign_gitea,
        actor="forge",
    ),
    SourceType(
        "stripe",
        "signed",
        verify_stripe,
        ("stripe-signature",),
        # The event's id, inside the signed body (ours).
        DeliveryIdRule(body_field="id"),
        # The event's type (payment_intent.succeeded), inside the signed body.
        kind=KindRule(body_paths=(("type",),)),
        signer=sign_stripe,
    ),
    SourceType(
        "slack",
        "signed",
        verify_slack,
        ("x-slack-signature",),
        # The Events API event_id, inside the signed body (ours).
        DeliveryIdRule(body_field="event_id"),
        # Slack gives up after 3 s.
        wait_cap_seconds=2.5,
        url_verification=True,
        # An event_callback's inner event type (app_mention); otherwise the envelope's own type
        # (url_verification, app_rate_limited).
        kind=KindRule(body_paths=(("event", "type"), ("type",))),
        signer=sign_slack,
    ),
    SourceType(
        "cairn",
        "signed",
        verify_cairn,
        ("x-cairn-signature",),
        # The signed event_id; the X-Cairn-Event-Id header is unsigned (the verifier refuses a mismatch).
        DeliveryIdRule(body_field="event_id"),
        # The signed body's kind wins: the X-Cairn-Event header is unsigned and must not change a verified kind.
        kind=KindRule(body_paths=(("kind",),)),
        signer=sign_cairn,
        actor="cairn",
    ),
    SourceType(
        "generic",
        "token",
        None,
        (),
        DeliveryIdRule(
            headers=("x-delivery-id", "webhook-id", "ce-id"),
            body_field="id",
            body_media_type=CLOUDEVENTS_STRUCTURED,
        ),
        collector=True,
        issue_provider="event_header",
    ),
    SourceType(
        "schedule",
        "internal",
        None,
        (),
        # A fire's id is switchboard's own (activities/schedules.py fire_delivery_id), never a producer's.
        DeliveryIdRule(),
        reserved=True,
    ),
)

SOURCES: Mapping[str, SourceType] = MappingProxyType({row.name: row for row in _ROWS})
# Source types agents may vend, create and post to, in table order (error messages list them in this order).
SOURCE_TYPES: tuple[str, ...] = tuple(row.name for row in _ROWS if not row.reserved)
RESERVED_SOURCES: tuple[str, ...] = tuple(row.name for row in _ROWS if row.reserved)
SIGNATURE_HEADERS: frozenset[str] = frozenset(name for row in _ROWS for name in row.signature_headers)


def find_source(name: str) -> SourceType | None:
    """The table row of a source type, or None when this build does not know it."""
    return SOURCES.get(name)


def _public(name: str) -> SourceType:
    """The row of a source type deliveries arrive for; ValueError for an unknown or reserved one."""
    row = SOURCES.get(name)
    if row is None or row.reserved:
        raise ValueError(f"unknown source type: {name!r}")
    return row


def media_type(content_type: str | None) -> str:
    """The lower-cased media type of a Content-Type value, without parameters."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def verify(
    source: str,
    secret: bytes | None,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    *,
    generic_hmac: GenericHmac | None = None,
) -> Verification:
    """Verify a delivery with its source type's verifier; headers must already be lower-cased.

    ValueError for an unknown or reserved source type; MissingSecret when a verifying source has no secret.
    """
    row = _public(source)
    verifier = row.verifier
    if row.collector and generic_hmac is not None:
        verifier = generic_hmac_verifier(generic_hmac)
    if verifier is None:
        # Token trust: the unguessable URL already authenticated the caller; the body is not verified.
        return Verification(ok=True, verified=False, detail="token")
    # An empty key is an HMAC anyone can compute, so it counts as no secret at all.
    if not secret:
        raise MissingSecret(source)
    return verifier(secret, headers, body, now)


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


def _producer_id(rule: DeliveryIdRule, headers: Mapping[str, str], document: Any) -> str | None:
    for name in rule.headers:
        found = _usable_id(headers.get(name))
        if found is not None:
            return found
    if rule.body_field is not None and rule.reads_body(headers) and isinstance(document, dict):
        return _usable_id(document.get(rule.body_field))
    return None


def producer_delivery_id(source: str, headers: Mapping[str, str], document: Any) -> str | None:
    """The producer's own delivery id by the table's rule, or None when it sent none usable.

    headers are lower-cased; document is the parsed JSON body (any value; only an object has fields). A source
    type this build does not know, or a reserved one, has no producer id.
    """
    row = SOURCES.get(source)
    if row is None:
        return None
    return _producer_id(row.delivery_id, headers, document)


def body_fallback_id(body: bytes) -> str:
    """The content-addressed delivery id used when the producer supplies none."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def ingest_wait_seconds(source: str, default: float) -> float:
    """How long the receiver may wait for a delivery of this source before answering pending."""
    row = SOURCES.get(source)
    if row is None or row.wait_cap_seconds is None:
        return default
    return min(default, row.wait_cap_seconds)

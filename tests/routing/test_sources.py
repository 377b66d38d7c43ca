"""The source-type table: what each row says, and that every reader agrees with it."""

from __future__ import annotations

import json

import pytest

from routing.collectors import delivery_kind
from routing.envelope import build_envelope, derive_kind
from routing.headers import REDACTED, REDACTED_NAMES, sanitize_headers
from routing.models import SOURCE_TYPES as MODELS_SOURCE_TYPES
from routing.models import TRUST_BY_SOURCE
from routing.signatures import MissingSecret, Verification
from routing.sources import (
    RESERVED_SOURCES,
    SOURCE_TYPES,
    SOURCES,
    find_source,
    ingest_wait_seconds,
    producer_delivery_id,
    verify,
)

SECRET = b"whsec_" + b"ab" * 32
NOW = 1_700_000_000.0


def test_public_and_reserved_source_types() -> None:
    assert SOURCE_TYPES == ("github", "gitea", "stripe", "slack", "cairn", "generic")
    assert RESERVED_SOURCES == ("schedule",)
    assert set(SOURCES) == {*SOURCE_TYPES, *RESERVED_SOURCES}
    assert find_source("bitbucket") is None


def test_trust_modes_and_the_models_views() -> None:
    assert dict(TRUST_BY_SOURCE) == {
        "github": "signed",
        "gitea": "signed",
        "stripe": "signed",
        "slack": "signed",
        "cairn": "signed",
        "generic": "token",
    }
    assert MODELS_SOURCE_TYPES == SOURCE_TYPES
    assert SOURCES["schedule"].trust_mode == "internal"


@pytest.mark.parametrize("name", SOURCE_TYPES)
def test_signed_rows_have_a_verifier_and_token_rows_do_not(name: str) -> None:
    row = SOURCES[name]
    assert (row.verifier is not None) == (row.trust_mode == "signed")
    assert row.verifies(collector_hmac=False) == (row.trust_mode == "signed")
    if row.trust_mode == "signed":
        with pytest.raises(MissingSecret):
            verify(name, None, {}, b"{}", NOW)
    else:
        assert verify(name, None, {}, b"{}", NOW) == Verification(ok=True, verified=False, detail="token")


def test_only_a_collector_row_is_verified_by_a_collector_hmac() -> None:
    assert [name for name in SOURCE_TYPES if SOURCES[name].collector] == ["generic"]
    assert SOURCES["generic"].verifies(collector_hmac=True)


@pytest.mark.parametrize("name", ["schedule", "bitbucket"])
def test_reserved_and_unknown_sources_are_never_verified_or_keyed(name: str) -> None:
    with pytest.raises(ValueError):
        verify(name, SECRET, {}, b"{}", NOW)
    assert producer_delivery_id(name, {"x-delivery-id": "d"}, {"id": "d"}) is None


@pytest.mark.parametrize("name", [n for n in SOURCE_TYPES if SOURCES[n].trust_mode == "signed"])
def test_every_signature_header_is_redacted(name: str) -> None:
    assert SOURCES[name].signature_headers
    for header in SOURCES[name].signature_headers:
        # Named, not only caught by the "signature" substring rule, and redacted in what is stored.
        assert header in REDACTED_NAMES
        assert sanitize_headers([(header.upper(), "sha256=" + "ab" * 32)]) == {header: REDACTED}


# -- the producer's delivery id, per source (issue 11's lookup key) --------------------------------------------


@pytest.mark.parametrize(
    ("source", "headers", "document", "expected"),
    [
        (
            "github",
            {"x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"},
            {},
            "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        ),
        ("gitea", {"x-gitea-delivery": "gt-1", "x-github-delivery": "gh-1"}, {}, "gt-1"),
        ("stripe", {}, {"id": "evt_1", "object": "event"}, "evt_1"),
        ("slack", {}, {"type": "event_callback", "event_id": "Ev123"}, "Ev123"),
        ("cairn", {"x-cairn-event-id": "unsigned"}, {"event_id": "ce_1"}, "ce_1"),
        ("generic", {"x-delivery-id": "d1", "webhook-id": "w1"}, {}, "d1"),
        ("generic", {"webhook-id": "msg_2"}, {}, "msg_2"),
        ("generic", {"ce-id": "ce-3"}, {}, "ce-3"),
        ("generic", {"content-type": "application/cloudevents+json"}, {"id": "ce-4"}, "ce-4"),
        # Each source reads only its own rule.
        ("github", {"x-gitea-delivery": "gt-1"}, {"id": "x"}, None),
        ("stripe", {"x-delivery-id": "d"}, {"event_id": "x"}, None),
        ("generic", {"content-type": "application/json"}, {"id": "plain"}, None),
        ("generic", {}, ["not", "an", "object"], None),
    ],
)
def test_producer_delivery_id(source: str, headers: dict[str, str], document: object, expected: str | None) -> None:
    assert producer_delivery_id(source, headers, document) == expected


# -- kind, issue projection, receiver habits -----------------------------------------------------------------


def test_kind_rule_per_row() -> None:
    forge = {"x-github-event": "issues", "x-gitea-event": "push", "x-cairn-event": "forged"}
    for name in ("github", "gitea", "generic"):
        assert derive_kind(name, forge, {"kind": "body", "type": "body"}) == "issues"
    assert derive_kind("gitea", {"x-gitea-event": "push", "x-cairn-event": "c"}, None) == "push"
    # cairn's kind is its signed body's; the unsigned header never stands in.
    assert derive_kind("cairn", forge, {"kind": "artifact.created"}) == "artifact.created"
    assert derive_kind("cairn", forge, {}) is None
    # Stripe's is the signed event's type; the forge headers never stand in, whatever a sender adds.
    assert derive_kind("stripe", forge, {"id": "evt_1", "type": "payment_intent.succeeded"}) == (
        "payment_intent.succeeded"
    )
    for unkinded in ({"id": "evt_1"}, {"type": ""}, {"type": 7}, ["type"], None):
        assert derive_kind("stripe", forge, unkinded) is None
    # Slack's is an event_callback's inner event type, else the envelope's own type (the handshake).
    callback = {"type": "event_callback", "event_id": "Ev1", "event": {"type": "app_mention"}}
    assert derive_kind("slack", forge, callback) == "app_mention"
    assert derive_kind("slack", forge, {"type": "url_verification", "challenge": "c"}) == "url_verification"
    assert derive_kind("slack", forge, {"type": "event_callback", "event": "app_mention"}) == "event_callback"
    assert derive_kind("slack", forge, {"event": {"type": 1}}) is None
    # A source this build does not know falls back to the forge headers, as before the table.
    assert derive_kind("bitbucket", forge, None) == "issues"
    assert delivery_kind("generic", None, {"ce-type": "com.example.t", "ce-id": "1"}, None) == "com.example.t"
    assert derive_kind("stripe", {}, {"type": "x" * 300}) == "x" * 255 + "…"


def test_issue_projection_providers() -> None:
    body = json.dumps({"action": "opened", "issue": {"number": 3}, "repository": {"full_name": "o/r"}}).encode()

    def provider(source: str, headers: dict[str, str]) -> object:
        env = build_envelope(
            source=source,
            webhook_id="wh_1",
            trust_mode="signed",
            verified=True,
            content_type=None,
            headers=headers,
            body=body,
        )
        return env["issue"]["provider"] if env["issue"] else None

    assert provider("github", {"X-GitHub-Event": "issues"}) == "github"
    assert provider("gitea", {"X-Gitea-Event": "issues"}) == "gitea"
    assert provider("generic", {"X-Gitea-Event": "issues"}) == "gitea"
    assert provider("generic", {"X-GitHub-Event": "issues"}) == "github"
    for other in ("stripe", "slack", "cairn", "schedule"):
        assert provider(other, {"X-GitHub-Event": "issues"}) is None


def test_ingest_wait_caps() -> None:
    assert ingest_wait_seconds("slack", 5.0) == 2.5
    assert ingest_wait_seconds("gitea", 5.0) == 4.0
    assert ingest_wait_seconds("gitea", 1.0) == 1.0
    for name in ("github", "stripe", "cairn", "generic", "schedule", "bitbucket"):
        assert ingest_wait_seconds(name, 5.0) == 5.0
    assert [name for name in SOURCES if SOURCES[name].url_verification] == ["slack"]

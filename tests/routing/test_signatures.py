"""Signature verification and delivery-id derivation for every source type."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import pytest

from routing.envelope import parse_payload
from routing.signatures import GenericHmac, MissingSecret, Verification
from routing.sources import body_fallback_id, producer_delivery_id, verify
from tests.signing import sign_cairn, sign_generic, sign_gitea, sign_github, sign_slack, sign_stripe

SECRET = b"whsec_" + b"ab" * 32
OTHER = b"whsec_" + b"cd" * 32
NOW = 1_700_000_000.0
BODY = b'{"action":"opened","n":1}'
OK = Verification(ok=True, verified=True, detail="ok")


def _upper_hex(headers: dict[str, str]) -> dict[str, str]:
    """Upper-case only the hex digest part of each signature value."""
    out = {}
    for k, v in headers.items():
        prefix, sep, rest = v.rpartition("=")
        out[k] = f"{prefix}{sep}{rest.upper()}" if len(rest) == 64 else v
    return out


def _cairn_body(event_id: object = "evt_1", created_at: object = None, *, drop: tuple[str, ...] = ()) -> bytes:
    doc: dict[str, object] = {
        "event_id": event_id,
        "kind": "artifact.created",
        "created_at": created_at
        if created_at is not None
        else datetime.fromtimestamp(NOW, UTC).isoformat().replace("+00:00", "Z"),
        "data": {"id": "a1"},
    }
    for key in drop:
        doc.pop(key)
    return json.dumps(doc).encode()


def _iso(offset_s: float) -> str:
    return (datetime.fromtimestamp(NOW, UTC) + timedelta(seconds=offset_s)).isoformat()


# -- github -----------------------------------------------------------------------------------------


def test_github_valid() -> None:
    assert verify("github", SECRET, sign_github(SECRET, BODY), BODY, NOW) == OK


def test_github_upper_hex() -> None:
    assert verify("github", SECRET, _upper_hex(sign_github(SECRET, BODY)), BODY, NOW) == OK


def test_github_wrong_secret() -> None:
    v = verify("github", SECRET, sign_github(OTHER, BODY), BODY, NOW)
    assert v == Verification(ok=False, verified=False, detail="signature_mismatch")


def test_github_tampered_body() -> None:
    v = verify("github", SECRET, sign_github(SECRET, BODY), BODY + b" ", NOW)
    assert not v.ok and v.detail == "signature_mismatch"


def test_github_missing() -> None:
    assert verify("github", SECRET, {}, BODY, NOW).detail == "missing_signature"


@pytest.mark.parametrize("value", ["sha1=" + "a" * 40, "sha256=zz", "a" * 64, "sha256=" + "a" * 63])
def test_github_malformed(value: str) -> None:
    v = verify("github", SECRET, {"x-hub-signature-256": value}, BODY, NOW)
    assert not v.ok and not v.verified and v.detail == "malformed_signature"


def test_github_ignores_clock() -> None:
    assert verify("github", SECRET, sign_github(SECRET, BODY), BODY, NOW + 10**7) == OK


# -- gitea ------------------------------------------------------------------------------------------


def test_gitea_valid_bare_hex() -> None:
    assert verify("gitea", SECRET, sign_gitea(SECRET, BODY), BODY, NOW) == OK


def test_gitea_upper_hex() -> None:
    h = {"x-gitea-signature": sign_gitea(SECRET, BODY)["x-gitea-signature"].upper()}
    assert verify("gitea", SECRET, h, BODY, NOW) == OK


def test_gitea_falls_back_to_hub_header() -> None:
    assert verify("gitea", SECRET, sign_github(SECRET, BODY), BODY, NOW) == OK


def test_gitea_wrong_own_header_not_rescued_by_hub_header() -> None:
    h = {**sign_gitea(OTHER, BODY), **sign_github(SECRET, BODY)}
    assert verify("gitea", SECRET, h, BODY, NOW).detail == "signature_mismatch"


def test_gitea_invalid_and_missing() -> None:
    assert verify("gitea", SECRET, sign_gitea(OTHER, BODY), BODY, NOW).detail == "signature_mismatch"
    assert verify("gitea", SECRET, {}, BODY, NOW).detail == "missing_signature"
    assert verify("gitea", SECRET, {"x-gitea-signature": "nothex"}, BODY, NOW).detail == "malformed_signature"


# -- stripe -----------------------------------------------------------------------------------------


def test_stripe_valid() -> None:
    assert verify("stripe", SECRET, sign_stripe(SECRET, BODY, int(NOW)), BODY, NOW) == OK


def test_stripe_upper_hex() -> None:
    assert verify("stripe", SECRET, _upper_hex(sign_stripe(SECRET, BODY, int(NOW))), BODY, NOW) == OK


def test_stripe_invalid() -> None:
    v = verify("stripe", SECRET, sign_stripe(OTHER, BODY, int(NOW)), BODY, NOW)
    assert v.detail == "signature_mismatch" and not v.ok


def test_stripe_missing() -> None:
    assert verify("stripe", SECRET, {}, BODY, NOW).detail == "missing_signature"
    h = {"stripe-signature": f"t={int(NOW)}"}
    assert verify("stripe", SECRET, h, BODY, NOW).detail == "missing_signature"


@pytest.mark.parametrize("value", ["v1=" + "a" * 64, "t=abc,v1=" + "a" * 64, "t=1,t=2,v1=" + "a" * 64])
def test_stripe_malformed(value: str) -> None:
    assert verify("stripe", SECRET, {"stripe-signature": value}, BODY, NOW).detail == "malformed_signature"


def test_stripe_signed_string_includes_timestamp() -> None:
    # A valid signature for one t must not verify under a header claiming another t.
    sig = sign_stripe(SECRET, BODY, int(NOW))["stripe-signature"].split(",")[1]
    h = {"stripe-signature": f"t={int(NOW) + 1},{sig}"}
    assert verify("stripe", SECRET, h, BODY, NOW).detail == "signature_mismatch"


@pytest.mark.parametrize("offset", [-300, 0, 300])
def test_stripe_window_edges_accepted(offset: int) -> None:
    h = sign_stripe(SECRET, BODY, int(NOW) + offset)
    assert verify("stripe", SECRET, h, BODY, NOW) == OK


@pytest.mark.parametrize("offset", [-301, 301, -86400])
def test_stripe_expired_or_future(offset: int) -> None:
    h = sign_stripe(SECRET, BODY, int(NOW) + offset)
    v = verify("stripe", SECRET, h, BODY, NOW)
    assert v == Verification(ok=False, verified=False, detail="timestamp_out_of_window")


def test_stripe_secret_rotation_second_v1_matches() -> None:
    t = int(NOW)
    old = sign_stripe(OTHER, BODY, t)["stripe-signature"].split(",")[1]
    new = sign_stripe(SECRET, BODY, t)["stripe-signature"].split(",")[1]
    h = {"stripe-signature": f"t={t},{old},{new},v0=" + "0" * 64}
    assert verify("stripe", SECRET, h, BODY, NOW) == OK
    assert verify("stripe", OTHER, h, BODY, NOW) == OK


def test_stripe_rotation_none_match() -> None:
    t = int(NOW)
    h = {"stripe-signature": f"t={t},v1={'a' * 64},v1=junk"}
    assert verify("stripe", SECRET, h, BODY, NOW).detail == "signature_mismatch"


# -- slack ------------------------------------------------------------------------------------------


def test_slack_valid() -> None:
    assert verify("slack", SECRET, sign_slack(SECRET, BODY, int(NOW)), BODY, NOW) == OK


def test_slack_upper_hex() -> None:
    assert verify("slack", SECRET, _upper_hex(sign_slack(SECRET, BODY, int(NOW))), BODY, NOW) == OK


def test_slack_invalid() -> None:
    assert verify("slack", SECRET, sign_slack(OTHER, BODY, int(NOW)), BODY, NOW).detail == "signature_mismatch"


def test_slack_missing_signature_and_timestamp() -> None:
    h = sign_slack(SECRET, BODY, int(NOW))
    assert verify("slack", SECRET, {}, BODY, NOW).detail == "missing_signature"
    no_ts = {"x-slack-signature": h["x-slack-signature"]}
    assert verify("slack", SECRET, no_ts, BODY, NOW).detail == "missing_timestamp"
    bad_ts = {**h, "x-slack-request-timestamp": "soon"}
    assert verify("slack", SECRET, bad_ts, BODY, NOW).detail == "malformed_timestamp"
    bad_sig = {**h, "x-slack-signature": "v1=" + "a" * 64}
    assert verify("slack", SECRET, bad_sig, BODY, NOW).detail == "malformed_signature"


def test_slack_timestamp_is_signed() -> None:
    h = {**sign_slack(SECRET, BODY, int(NOW)), "x-slack-request-timestamp": str(int(NOW) + 1)}
    assert verify("slack", SECRET, h, BODY, NOW).detail == "signature_mismatch"


@pytest.mark.parametrize("offset", [-300, 300])
def test_slack_window_edges_accepted(offset: int) -> None:
    assert verify("slack", SECRET, sign_slack(SECRET, BODY, int(NOW) + offset), BODY, NOW) == OK


@pytest.mark.parametrize("offset", [-301, 301])
def test_slack_expired_or_future(offset: int) -> None:
    v = verify("slack", SECRET, sign_slack(SECRET, BODY, int(NOW) + offset), BODY, NOW)
    assert not v.ok and v.detail == "timestamp_out_of_window"


# -- cairn ------------------------------------------------------------------------------------------


def test_cairn_valid() -> None:
    body = _cairn_body()
    assert verify("cairn", SECRET, sign_cairn(SECRET, body), body, NOW) == OK


def test_cairn_valid_with_matching_header_and_upper_hex() -> None:
    body = _cairn_body()
    h = {**_upper_hex(sign_cairn(SECRET, body)), "x-cairn-event-id": "evt_1"}
    assert verify("cairn", SECRET, h, body, NOW) == OK


def test_cairn_invalid_and_missing() -> None:
    body = _cairn_body()
    assert verify("cairn", SECRET, sign_cairn(OTHER, body), body, NOW).detail == "signature_mismatch"
    assert verify("cairn", SECRET, {}, body, NOW).detail == "missing_signature"


def test_cairn_header_event_id_mismatch() -> None:
    body = _cairn_body()
    h = {**sign_cairn(SECRET, body), "x-cairn-event-id": "evt_other"}
    assert verify("cairn", SECRET, h, body, NOW) == Verification(False, False, "event_id_mismatch")


@pytest.mark.parametrize("event_id", [None, "", 42])
def test_cairn_missing_event_id(event_id: object) -> None:
    body = _cairn_body(drop=("event_id",)) if event_id is None else _cairn_body(event_id=event_id)
    assert verify("cairn", SECRET, sign_cairn(SECRET, body), body, NOW).detail == "missing_event_id"


def test_cairn_missing_created_at() -> None:
    body = _cairn_body(drop=("created_at",))
    assert verify("cairn", SECRET, sign_cairn(SECRET, body), body, NOW).detail == "missing_created_at"


@pytest.mark.parametrize("created_at", ["yesterday", "2023-11-14T22:13:20", "2023-11-14", "2023-13-40T00:00:00Z"])
def test_cairn_invalid_created_at(created_at: str) -> None:
    body = _cairn_body(created_at=created_at)
    assert verify("cairn", SECRET, sign_cairn(SECRET, body), body, NOW).detail == "invalid_created_at"


@pytest.mark.parametrize("offset", [-301, 301, -3600])
def test_cairn_created_at_out_of_window(offset: int) -> None:
    body = _cairn_body(created_at=_iso(offset))
    assert verify("cairn", SECRET, sign_cairn(SECRET, body), body, NOW).detail == "timestamp_out_of_window"


@pytest.mark.parametrize(
    "created_at",
    [
        _iso(-300),
        _iso(300),
        "2023-11-14T22:13:20.123456789Z",
        "2023-11-15T00:13:20+02:00",
        "2023-11-14t22:13:20z",
    ],
)
def test_cairn_created_at_accepted_forms(created_at: str) -> None:
    body = _cairn_body(created_at=created_at)
    assert verify("cairn", SECRET, sign_cairn(SECRET, body), body, NOW) == OK


def test_cairn_non_object_body() -> None:
    body = b"[1,2]"
    assert verify("cairn", SECRET, sign_cairn(SECRET, body), body, NOW).detail == "invalid_body"


# -- generic ----------------------------------------------------------------------------------------


def test_generic_is_token_trust() -> None:
    assert verify("generic", None, {}, BODY, NOW) == Verification(ok=True, verified=False, detail="token")


@pytest.mark.parametrize("fmt", ["sha256=hex", "hex", "base64"])
def test_generic_hmac_valid_invalid_missing(fmt: str) -> None:
    cfg = GenericHmac(header="X-Signature", format=fmt)  # type: ignore[arg-type]
    assert verify("generic", SECRET, sign_generic(SECRET, BODY, cfg), BODY, NOW, generic_hmac=cfg) == OK
    bad = verify("generic", SECRET, sign_generic(OTHER, BODY, cfg), BODY, NOW, generic_hmac=cfg)
    assert bad == Verification(False, False, "signature_mismatch")
    assert verify("generic", SECRET, {}, BODY, NOW, generic_hmac=cfg).detail == "missing_signature"
    junk = verify("generic", SECRET, {"x-signature": "!!"}, BODY, NOW, generic_hmac=cfg)
    assert junk.detail == "malformed_signature"


def test_generic_hmac_requires_secret() -> None:
    cfg = GenericHmac(header="x-signature", format="hex")
    with pytest.raises(MissingSecret):
        verify("generic", None, {}, BODY, NOW, generic_hmac=cfg)


# -- cross-cutting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["github", "gitea", "stripe", "slack", "cairn"])
@pytest.mark.parametrize("secret", [None, b""])
def test_signed_sources_without_secret_raise(source: str, secret: bytes | None) -> None:
    with pytest.raises(MissingSecret):
        verify(source, secret, {}, BODY, NOW)


def test_unknown_source_type() -> None:
    with pytest.raises(ValueError):
        verify("bitbucket", SECRET, {}, BODY, NOW)


def _all_failures() -> list[Verification]:
    t = int(NOW)
    cairn = _cairn_body()
    return [
        verify("github", SECRET, sign_github(OTHER, BODY), BODY, NOW),
        verify("github", SECRET, {}, BODY, NOW),
        verify("gitea", SECRET, sign_gitea(OTHER, BODY), BODY, NOW),
        verify("stripe", SECRET, sign_stripe(OTHER, BODY, t), BODY, NOW),
        verify("stripe", SECRET, sign_stripe(SECRET, BODY, t - 999), BODY, NOW),
        verify("slack", SECRET, sign_slack(OTHER, BODY, t), BODY, NOW),
        verify("slack", SECRET, sign_slack(SECRET, BODY, t + 999), BODY, NOW),
        verify("cairn", SECRET, sign_cairn(OTHER, cairn), cairn, NOW),
        verify("cairn", SECRET, {**sign_cairn(SECRET, cairn), "x-cairn-event-id": "x"}, cairn, NOW),
    ]


def test_detail_never_contains_secret_or_signature_material() -> None:
    forbidden = [
        SECRET.decode(),
        OTHER.decode(),
        "ab" * 32,
        sign_github(SECRET, BODY)["x-hub-signature-256"][7:],
        sign_github(OTHER, BODY)["x-hub-signature-256"][7:],
    ]
    for v in _all_failures():
        assert not v.ok and not v.verified
        assert v.detail.isidentifier() and len(v.detail) < 40
        for f in forbidden:
            assert f not in v.detail and f not in repr(v)


# -- delivery ids -----------------------------------------------------------------------------------


def _fallback(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _delivery_id(source: str, headers: dict[str, str], body: bytes) -> str:
    """The id the receiver keys a delivery on: the producer's own, else the body's SHA-256 (body_fallback_id)."""
    return producer_delivery_id(source, headers, parse_payload(body)) or body_fallback_id(body)


def test_delivery_id_cairn_uses_signed_event_id() -> None:
    assert _delivery_id("cairn", {"x-cairn-event-id": "hdr"}, _cairn_body("evt_9")) == "evt_9"


def test_delivery_id_github_and_gitea() -> None:
    assert _delivery_id("github", {"x-github-delivery": "gh-1"}, BODY) == "gh-1"
    assert _delivery_id("gitea", {"x-gitea-delivery": "gt-1"}, BODY) == "gt-1"
    # Each source only trusts its own header.
    assert _delivery_id("github", {"x-gitea-delivery": "gt-1"}, BODY) == _fallback(BODY)


def test_delivery_id_stripe_and_slack_from_body() -> None:
    assert _delivery_id("stripe", {}, b'{"id":"evt_stripe","type":"x"}') == "evt_stripe"
    assert _delivery_id("slack", {}, b'{"event_id":"Ev123","type":"event_callback"}') == "Ev123"


def test_delivery_id_generic_precedence() -> None:
    all_h = {"x-delivery-id": "a", "webhook-id": "b", "ce-id": "c"}
    assert _delivery_id("generic", all_h, BODY) == "a"
    assert _delivery_id("generic", {"webhook-id": "b", "ce-id": "c"}, BODY) == "b"
    assert _delivery_id("generic", {"ce-id": "c"}, BODY) == "c"


def test_delivery_id_generic_structured_cloudevent() -> None:
    body = b'{"specversion":"1.0","id":"ce-42","type":"t","source":"s"}'
    h = {"content-type": "application/cloudevents+json; charset=utf-8"}
    assert _delivery_id("generic", h, body) == "ce-42"
    # A plain JSON body's id is not a delivery id.
    assert _delivery_id("generic", {"content-type": "application/json"}, body) == _fallback(body)


def test_delivery_id_256_byte_rule() -> None:
    ok = "x" * 256
    too_long = "x" * 257
    assert _delivery_id("github", {"x-github-delivery": ok}, BODY) == ok
    assert _delivery_id("github", {"x-github-delivery": too_long}, BODY) == _fallback(BODY)
    assert _delivery_id("generic", {"x-delivery-id": too_long, "webhook-id": "w"}, BODY) == "w"
    # Bytes, not characters: 86 three-byte characters are 258 bytes.
    assert _delivery_id("generic", {"webhook-id": "€" * 86}, BODY) == _fallback(BODY)
    body = json.dumps({"id": too_long}).encode()
    assert _delivery_id("stripe", {}, body) == _fallback(body)


def test_delivery_id_empty_candidates_ignored() -> None:
    assert _delivery_id("generic", {"x-delivery-id": "", "webhook-id": "  ", "ce-id": "c"}, BODY) == "c"
    assert _delivery_id("gitea", {"x-gitea-delivery": ""}, BODY) == _fallback(BODY)
    body = b'{"event_id":""}'
    assert _delivery_id("slack", {}, body) == _fallback(body)


@pytest.mark.parametrize("source", ["github", "gitea", "stripe", "slack", "cairn", "generic"])
@pytest.mark.parametrize("body", [b"", b"not json", b'{"id": 5, "event_id": ["x"]}'])
def test_delivery_id_fallback(source: str, body: bytes) -> None:
    assert _delivery_id(source, {}, body) == _fallback(body)


# -- the producer side: the signers `switchboard send` uses -------------------------------------------------


def test_every_signed_source_has_a_signer_its_verifier_accepts() -> None:
    from routing.sources import SOURCES

    signed = {name for name, row in SOURCES.items() if row.verifier is not None}
    assert signed == {name for name, row in SOURCES.items() if row.signer is not None}
    assert signed == {"github", "gitea", "stripe", "slack", "cairn"}
    body = _cairn_body()  # carries what cairn signs; the other schemes sign any body
    for name in sorted(signed):
        signer = SOURCES[name].signer
        assert signer is not None
        headers = signer(SECRET, body, NOW)
        assert all(k == k.lower() for k in headers), name
        assert verify(name, SECRET, headers, body, NOW) == OK, name
        assert verify(name, OTHER, headers, body, NOW).detail == "signature_mismatch", name


def test_the_signers_sign_as_the_producers_documented_schemes() -> None:
    from routing import signatures

    # tests/signing.py is written from the producers' documentation, independently of routing/signatures.py.
    assert signatures.sign_github(SECRET, BODY, NOW) == sign_github(SECRET, BODY)
    assert signatures.sign_gitea(SECRET, BODY, NOW) == {**sign_gitea(SECRET, BODY), **sign_github(SECRET, BODY)}
    assert signatures.sign_stripe(SECRET, BODY, NOW + 0.9) == sign_stripe(SECRET, BODY, int(NOW))
    assert signatures.sign_slack(SECRET, BODY, NOW) == sign_slack(SECRET, BODY, int(NOW))
    assert signatures.sign_cairn(SECRET, BODY, NOW) == sign_cairn(SECRET, BODY)
    for fmt in ("sha256=hex", "hex", "base64"):
        config = GenericHmac(header="X-Sig", format=fmt)  # type: ignore[arg-type]
        assert signatures.generic_hmac_signer(config)(SECRET, BODY, NOW) == sign_generic(SECRET, BODY, config)

"""Published and independently computed signature vectors: the verifiers against the producers' own schemes.

Every other signature test signs with tests/signing.py; a bug shared by a signer and a verifier (a wrong
separator, a decoded secret) would pass those. Here the expected values come from the producers' documentation
(GitHub's and Slack's published examples) or are computed in the test itself with hmac/hashlib from the
documented construction, and the signers are pinned to the same published values.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable

import pytest

from routing.signatures import GenericHmac, Verification
from routing.sources import verify
from tests.signing import sign_github, sign_slack

OK = Verification(ok=True, verified=True, detail="ok")

# GitHub, "Validating webhook deliveries" → "Testing the webhook payload validation".
GITHUB_SECRET = b"It's a Secret to Everybody"
GITHUB_PAYLOAD = b"Hello, World!"
GITHUB_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

# Slack, "Verifying requests from Slack": the documented slash-command request, timestamp and signature.
SLACK_SECRET = b"8f742231b10e8888abcd99yyyzzz85a5"
SLACK_TIMESTAMP = 1531420618
SLACK_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V"
    b"&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text="
    b"&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
    b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
SLACK_SIGNATURE = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"

SECRET = b"whsec_" + b"5e" * 32
NOW = 1_700_000_000


def _hmac_hex(key: bytes, message: bytes, digest: str = "sha256") -> str:
    return hmac.new(key, message, digest).hexdigest()


# -- github -----------------------------------------------------------------------------------------


def test_github_documented_example_verifies() -> None:
    headers = {"x-hub-signature-256": GITHUB_SIGNATURE}
    assert verify("github", GITHUB_SECRET, headers, GITHUB_PAYLOAD, NOW) == OK


def test_github_documented_example_fails_when_anything_changes() -> None:
    headers = {"x-hub-signature-256": GITHUB_SIGNATURE}
    assert verify("github", GITHUB_SECRET, headers, b"Hello, World?", NOW).detail == "signature_mismatch"
    assert verify("github", b"It's a Secret to Everyone", headers, GITHUB_PAYLOAD, NOW).detail == "signature_mismatch"
    flipped = {"x-hub-signature-256": GITHUB_SIGNATURE[:-1] + "8"}
    assert verify("github", GITHUB_SECRET, flipped, GITHUB_PAYLOAD, NOW).detail == "signature_mismatch"


def test_github_signer_reproduces_the_documented_example() -> None:
    assert sign_github(GITHUB_SECRET, GITHUB_PAYLOAD) == {"x-hub-signature-256": GITHUB_SIGNATURE}


# -- gitea ------------------------------------------------------------------------------------------


def test_gitea_signature_is_the_same_hmac_as_github_bare_hex() -> None:
    # Gitea signs the body exactly as GitHub does and sends the digest bare in X-Gitea-Signature, so GitHub's
    # documented example is a Gitea vector too.
    bare = GITHUB_SIGNATURE.removeprefix("sha256=")
    assert verify("gitea", GITHUB_SECRET, {"x-gitea-signature": bare}, GITHUB_PAYLOAD, NOW) == OK
    tampered = verify("gitea", GITHUB_SECRET, {"x-gitea-signature": bare}, b"Hello, World?", NOW)
    assert tampered.detail == "signature_mismatch"


def test_gitea_full_header_set_verifies() -> None:
    # Every signature header Gitea's webhook deliverer adds to one delivery, computed here from the body.
    body = json.dumps({"action": "opened", "number": 7}).encode()
    sha256 = _hmac_hex(SECRET, body)
    headers = {
        "x-gitea-signature": sha256,
        "x-gogs-signature": sha256,
        "x-hub-signature": "sha1=" + _hmac_hex(SECRET, body, "sha1"),
        "x-hub-signature-256": "sha256=" + sha256,
        "x-gitea-delivery": "f6266f16-1bf3-46a5-9ea4-602e06ead473",
        "x-gitea-event": "issues",
    }
    assert verify("gitea", SECRET, headers, body, NOW) == OK


# -- stripe -----------------------------------------------------------------------------------------


def _stripe_header(secret: bytes, body: bytes, t: int) -> str:
    # Stripe's documented construction: signed_payload = "<t>." + raw body, keyed with the endpoint secret as
    # given (whsec_ prefix and all, not decoded), hex; sent as t=<t>,v1=<hex>. Test mode adds a v0 entry.
    v1 = _hmac_hex(secret, f"{t}.".encode() + body)
    return f"t={t},v1={v1},v0={'6f' * 32}"


def test_stripe_documented_scheme_verifies() -> None:
    body = json.dumps({"id": "evt_1NG8Du2eZvKYlo2CUI79vXWy", "object": "event", "type": "invoice.paid"}).encode()
    headers = {"stripe-signature": _stripe_header(SECRET, body, NOW)}
    assert verify("stripe", SECRET, headers, body, NOW) == OK


def test_stripe_key_is_the_secret_as_given_and_the_timestamp_is_signed() -> None:
    body = b'{"id":"evt_2","object":"event"}'
    # A receiver that stripped whsec_ before keying would accept this; the documented scheme does not.
    stripped = {"stripe-signature": _stripe_header(SECRET.removeprefix(b"whsec_"), body, NOW)}
    assert verify("stripe", SECRET, stripped, body, NOW).detail == "signature_mismatch"
    # Body alone (no "<t>." prefix) is GitHub's scheme, not Stripe's.
    body_only = {"stripe-signature": f"t={NOW},v1={_hmac_hex(SECRET, body)}"}
    assert verify("stripe", SECRET, body_only, body, NOW).detail == "signature_mismatch"


def test_stripe_documented_tolerance_is_five_minutes() -> None:
    body = b'{"id":"evt_3"}'
    assert verify("stripe", SECRET, {"stripe-signature": _stripe_header(SECRET, body, NOW - 300)}, body, NOW) == OK
    late = verify("stripe", SECRET, {"stripe-signature": _stripe_header(SECRET, body, NOW - 301)}, body, NOW)
    assert late.detail == "timestamp_out_of_window"


# -- slack ------------------------------------------------------------------------------------------


def _slack_headers(signature: str, ts: int) -> dict[str, str]:
    return {"x-slack-signature": signature, "x-slack-request-timestamp": str(ts)}


def test_slack_documented_example_verifies() -> None:
    headers = _slack_headers(SLACK_SIGNATURE, SLACK_TIMESTAMP)
    assert verify("slack", SLACK_SECRET, headers, SLACK_BODY, SLACK_TIMESTAMP + 60) == OK


def test_slack_documented_example_fails_when_anything_changes() -> None:
    headers = _slack_headers(SLACK_SIGNATURE, SLACK_TIMESTAMP)
    assert verify("slack", SLACK_SECRET, headers, SLACK_BODY + b"&x=1", SLACK_TIMESTAMP).detail == "signature_mismatch"
    moved = _slack_headers(SLACK_SIGNATURE, SLACK_TIMESTAMP + 1)
    assert verify("slack", SLACK_SECRET, moved, SLACK_BODY, SLACK_TIMESTAMP).detail == "signature_mismatch"
    # Authentic but replayed after the documented five minutes.
    stale = verify("slack", SLACK_SECRET, headers, SLACK_BODY, SLACK_TIMESTAMP + 301)
    assert stale.detail == "timestamp_out_of_window"


def test_slack_signer_reproduces_the_documented_example() -> None:
    assert sign_slack(SLACK_SECRET, SLACK_BODY, SLACK_TIMESTAMP) == _slack_headers(SLACK_SIGNATURE, SLACK_TIMESTAMP)


def test_slack_documented_scheme_on_a_json_event() -> None:
    body = json.dumps({"type": "event_callback", "event_id": "Ev08MFMKH6", "event": {"type": "app_mention"}}).encode()
    signature = "v0=" + _hmac_hex(SECRET, b"v0:" + str(NOW).encode() + b":" + body)
    assert verify("slack", SECRET, _slack_headers(signature, NOW), body, NOW) == OK


# -- cairn and generic: switchboard's own schemes (docs/architecture.md "Source types") ---------------------


def test_cairn_scheme_computed_independently() -> None:
    body = json.dumps(
        {"event_id": "ce_1", "kind": "artifact.created", "created_at": "2023-11-14T22:13:20Z", "data": {"id": "a1"}}
    ).encode()
    headers = {"x-cairn-signature": "sha256=" + _hmac_hex(SECRET, body), "x-cairn-event-id": "ce_1"}
    assert verify("cairn", SECRET, headers, body, NOW) == OK


@pytest.mark.parametrize(
    ("fmt", "encode"),
    [
        ("sha256=hex", lambda d: "sha256=" + d.hex()),
        ("hex", lambda d: d.hex()),
        ("base64", lambda d: base64.b64encode(d).decode()),
    ],
)
def test_generic_hmac_formats_computed_independently(fmt: str, encode: Callable[[bytes], str]) -> None:
    body = b'{"ping":true}'
    value = encode(hmac.new(SECRET, body, hashlib.sha256).digest())
    config = GenericHmac(header="X-Signature", format=fmt)  # type: ignore[arg-type]
    assert verify("generic", SECRET, {"x-signature": value}, body, NOW, generic_hmac=config) == OK

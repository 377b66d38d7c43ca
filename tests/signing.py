"""Sign deliveries the way each producer does, for tests and benchmarks.

Written from the producers' documented schemes with hmac/hashlib, never with the verifiers' code, so a
round trip through the verifier checks two implementations against each other; the published vectors in
tests/routing/test_signature_vectors.py pin these signers to the producers' own examples.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from routing.signatures import GenericHmac


def _hex(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign_github(secret: bytes, body: bytes) -> dict[str, str]:
    """Headers GitHub would send for body signed with secret (X-Hub-Signature-256: sha256=<hex>)."""
    return {"x-hub-signature-256": "sha256=" + _hex(secret, body)}


def sign_gitea(secret: bytes, body: bytes) -> dict[str, str]:
    """Headers Gitea would send (its bare-hex X-Gitea-Signature) for body signed with secret."""
    return {"x-gitea-signature": _hex(secret, body)}


def sign_stripe(secret: bytes, body: bytes, t: int) -> dict[str, str]:
    """Headers Stripe would send for body signed with secret at unix time t (v1 = HMAC of "<t>.<body>")."""
    return {"stripe-signature": f"t={t},v1={_hex(secret, str(t).encode('ascii') + b'.' + body)}"}


def sign_slack(secret: bytes, body: bytes, ts: int) -> dict[str, str]:
    """Headers Slack would send for body signed with secret at unix time ts (v0 = HMAC of "v0:<ts>:<body>")."""
    digest = _hex(secret, b"v0:" + str(ts).encode("ascii") + b":" + body)
    return {"x-slack-signature": "v0=" + digest, "x-slack-request-timestamp": str(ts)}


def sign_cairn(secret: bytes, body: bytes) -> dict[str, str]:
    """Headers cairn would send for body signed with secret (event_id/created_at live in the body)."""
    return {"x-cairn-signature": "sha256=" + _hex(secret, body)}


def sign_generic(secret: bytes, body: bytes, config: GenericHmac) -> dict[str, str]:
    """Headers a generic producer configured with config would send: an HMAC-SHA256 of body, encoded as told."""
    digest = hmac.new(secret, body, hashlib.sha256).digest()
    if config.format == "base64":
        value = base64.b64encode(digest).decode("ascii")
    elif config.format == "hex":
        value = digest.hex()
    else:
        value = "sha256=" + digest.hex()
    return {config.header.lower(): value}

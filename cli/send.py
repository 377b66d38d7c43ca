"""`switchboard send SOURCE`: one test delivery to a webhook's ingest URL, signed as its producer signs it.

The signature scheme, where the producer's delivery id travels and which sources sign at all are the source-type
table's (routing/sources.py, routing/signatures.py): this module only picks a sample body and says which header a
forge names its event in. Every send is a new delivery (a fresh delivery id) unless `--delivery-id` repeats one,
so a producer's redelivery can be tried too.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from cli.client import CliError, Response, post
from routing.signatures import GenericHmac, generic_hmac_signer
from routing.sources import SOURCE_TYPES, SOURCES

INGEST_URL_ENV = "SWITCHBOARD_INGEST_URL"
SECRET_ENV = "SWITCHBOARD_WEBHOOK_SECRET"  # noqa: S105 - the variable's name
HMAC_FORMATS = ("sha256=hex", "hex", "base64")

EVENT_HEADERS = {"github": ("x-github-event",), "gitea": ("x-gitea-event", "x-github-event")}
"""The headers a forge names its event in (the delivery's .kind); the other sources carry their type in the body."""
DEFAULT_EVENT = "issues"


def _rfc3339(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def sample(source: str, now: float, fresh: str) -> dict[str, Any]:
    """A small body of the kind the source's producer sends: an opened issue, a payment, a mention, a handoff."""
    if source in EVENT_HEADERS:
        return {
            "action": "opened",
            "issue": {
                "number": 1,
                "title": "Hello from switchboard send",
                "state": "open",
                "labels": [],
                "user": {"login": "octocat"},
            },
            "repository": {"full_name": "acme/app"},
            "sender": {"login": "octocat"},
        }
    if source == "stripe":
        return {
            "id": f"evt_{fresh}",
            "object": "event",
            "type": "payment_intent.succeeded",
            "created": int(now),
            "data": {"object": {"id": f"pi_{fresh}", "object": "payment_intent", "amount": 2000, "currency": "usd"}},
        }
    if source == "slack":
        return {
            "type": "event_callback",
            "event_id": f"Ev{fresh}",
            "event_time": int(now),
            "event": {"type": "app_mention", "user": "U0", "channel": "C0", "text": "hello from switchboard send"},
        }
    if source == "cairn":
        return {
            "event_id": f"ce_{fresh}",
            "kind": "artifact.created",
            "created_at": _rfc3339(now),
            "data": {"id": f"art_{fresh}", "title": "Hello from switchboard send", "tags": ["handoff"]},
        }
    return {"message": "hello from switchboard send"}


def _header_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise CliError("invalid_argument", f"--header {text!r}: expected 'Name: value'")
    return name.strip().lower(), value.strip()


def prepare(
    source: str,
    secret: str | None,
    *,
    body: bytes | None = None,
    event: str | None = None,
    delivery_id: str | None = None,
    headers: list[str] | None = None,
    hmac: GenericHmac | None = None,
    now: float | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one delivery of `source`, signed with `secret` where the source signs."""
    row = SOURCES.get(source)
    if row is None or row.reserved:
        raise CliError("invalid_argument", f"unknown source type {source!r} (one of {', '.join(SOURCE_TYPES)})")
    if event is not None and source not in EVENT_HEADERS:
        raise CliError(
            "invalid_argument", f"--event is a forge's event header; a {source} delivery's kind is in its body"
        )
    now = time.time() if now is None else now
    fresh = secrets.token_hex(8)
    wanted = delivery_id or f"send-{fresh}"
    out: dict[str, str] = {"content-type": "application/json", "user-agent": "switchboard-send"}
    rule = row.delivery_id
    if body is None:
        document: Any = sample(source, now, fresh)
    else:
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            document = None
    if rule.headers:
        out[rule.headers[0]] = wanted
    elif rule.body_field is not None and isinstance(document, dict):
        # The producer's id travels in the signed body: kept when the body has one, unless --delivery-id says.
        if delivery_id is not None or not document.get(rule.body_field):
            document[rule.body_field] = wanted
            body = None
    if source == "cairn" and isinstance(document, dict) and not document.get("created_at"):
        document["created_at"] = _rfc3339(now)  # cairn signs its replay window into the body
        body = None
    raw = body if body is not None else json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    for name in EVENT_HEADERS.get(source, ()):
        out[name] = event or DEFAULT_EVENT
    signer = generic_hmac_signer(hmac) if hmac is not None else row.signer
    if hmac is not None and not row.collector:
        raise CliError("invalid_argument", "--hmac-header is for a generic webhook with a collector HMAC")
    if signer is not None:
        if not secret:
            raise CliError(
                "missing_secret",
                f"a {source} delivery is signed: pass --secret whsec_… or set {SECRET_ENV}"
                " (`switchboard webhooks create … --export` sets it)",
            )
        out.update(signer(secret.encode(), raw, now))
    for text in headers or []:
        name, value = _header_pair(text)
        out[name] = value
    return raw, out


def send(url: str, raw: bytes, headers: dict[str, str], *, timeout: float = 30.0) -> Response:
    """POST the delivery to the ingest URL; the answer, whatever its status."""
    if not url:
        raise CliError(
            "missing_ingest_url",
            f"no ingest URL: pass --ingest-url or set {INGEST_URL_ENV} (`switchboard webhooks create … --export` sets it)",
        )
    return post(url, raw, headers, timeout=timeout, hint=f"check --ingest-url / {INGEST_URL_ENV}")

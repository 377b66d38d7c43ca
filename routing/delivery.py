"""A verified delivery as it travels from the receiver through the workflow to the commit.

The receiver derives everything the start, the Temporal UI and the workflow need once (``DeliveryInput``);
the body travels as its exact bytes in base64, so the workflow input is bounded by the ingest cap whatever the
body holds (``max_input_bytes``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from routing.envelope import build_envelope, parse_payload_checked
from routing.models import Decision, EventDisposition
from routing.text import MAX_HEADERS_TOTAL_CHARS
from routing.trust import QuarantineReason, Release

# committed: the delivery is an event (whatever its disposition); gone: the webhook no longer exists;
# no_targets: it has no live target, so nothing was stored.
CommitStatus = Literal["committed", "gone", "no_targets"]

# Temporal refuses a payload over its blob size limit (the server's `limit.blobSize.error`, 2 MiB by default).
TEMPORAL_PAYLOAD_LIMIT = 2 * 1024 * 1024
# Everything in a DeliveryInput besides its body and headers (ids, kind, summary, detail), JSON-escaped, is far
# under this; the headers are capped at MAX_HEADERS_TOTAL_CHARS characters, each at most 6 bytes once escaped.
_FIELDS_BYTES = 16 * 1024
_HEADERS_BYTES = 6 * MAX_HEADERS_TOTAL_CHARS


def max_input_bytes(body_max: int) -> int:
    """The most bytes a DeliveryInput for a body of at most ``body_max`` bytes serializes to."""
    return 4 * math.ceil(body_max / 3) + _HEADERS_BYTES + _FIELDS_BYTES


def workflow_id_for(webhook_id: str, external_id: str) -> str:
    """The delivery's RouteDelivery workflow id: deterministic, so concurrent redeliveries join one run."""
    digest = hashlib.sha256(external_id.encode()).hexdigest()[:40]
    return f"delivery-{webhook_id}-{digest}"


class Received(Protocol):
    """What the receiver established about a delivery, as its routing envelope is built from it."""

    @property
    def source(self) -> str: ...
    @property
    def webhook_id(self) -> str: ...
    @property
    def trust_mode(self) -> str: ...
    @property
    def verified(self) -> bool: ...
    @property
    def content_type(self) -> str | None: ...
    @property
    def headers(self) -> dict[str, str]: ...
    @property
    def kind(self) -> str | None: ...
    @property
    def body(self) -> bytes:
        """The raw body, exactly as received."""
        ...

    @property
    def release(self) -> Release | None:
        """A person's release of the quarantined delivery this routes, if it is one."""
        ...


def envelope_of(received: Received, trusted_actors: Any = None) -> dict[str, Any]:
    """The routing envelope of a delivery, in flight or stored: what rules, dry-run and backtest see.

    ``trusted_actors`` is the webhook's gate (Grant.trusted_actors), which sets .actor's trust flags.
    """
    release = received.release
    return build_envelope(
        source=received.source,
        webhook_id=received.webhook_id,
        trust_mode=received.trust_mode,
        verified=received.verified,
        content_type=received.content_type,
        headers=received.headers,
        body=received.body,
        # The receiver's own kind (a collector's kind rule may have set it), never re-derived.
        kind=received.kind,
        trusted_actors=trusted_actors,
        release=release.envelope() if release is not None else None,
    )


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")
# Only what builds links, images, HTML or code spans; "#" mid-line and "_" stay readable in the CLI's raw view.
_MARKDOWN = re.compile(r"([\\`\[\]()<>])")
MAX_SUMMARY_CHARS = 200
MAX_FIELD_CHARS = 120


def plain(value: object, limit: int = MAX_FIELD_CHARS) -> str:
    """Producer text as one escaped markdown line of at most ``limit`` characters (before escaping).

    What the Temporal UI shows: a delivery cannot put links, images or layout into an operator's UI.
    """
    text = _CONTROL.sub(" ", str(value)).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return _MARKDOWN.sub(r"\\\1", text)


def _subject(source: str, payload: Any) -> str | None:
    """owner/repo#number for an issue or pull request, cairn:<id> for an artifact, else the repository."""
    if not isinstance(payload, Mapping):
        return None
    if source == "cairn":
        data = payload.get("data")
        artifact_id = data.get("id") if isinstance(data, Mapping) else None
        return f"cairn:{artifact_id}" if isinstance(artifact_id, str) and artifact_id else None
    repository = payload.get("repository")
    repo = repository.get("full_name") if isinstance(repository, Mapping) else None
    number = None
    for name in ("pull_request", "issue"):
        item = payload.get(name)
        if isinstance(item, Mapping) and isinstance(item.get("number"), int) and not isinstance(item["number"], bool):
            number = item["number"]
            break
    if isinstance(repo, str) and repo:
        return f"{repo}#{number}" if number is not None else repo
    return None


def summary_line(source: str, kind: str | None, payload: Any) -> str:
    """One line for the Temporal UI: source, kind, action and subject (``github issues opened acme/app#12``)."""
    parts = [source]
    if kind:
        parts.append(kind)
    action = payload.get("action") if isinstance(payload, Mapping) else None
    if isinstance(action, str) and action:
        parts.append(action)
    subject = _subject(source, payload)
    if subject:
        parts.append(subject)
    return plain(" ".join(parts), MAX_SUMMARY_CHARS)


def start_details(delivery: DeliveryInput) -> str:
    """Fixed markdown details of the delivery as received (Temporal UI): webhook, producer id, trust, size."""
    lines = [
        f"**webhook** `{plain(delivery.webhook_id)}` · endpoint `{plain(delivery.endpoint_id)}`",
        f"**delivery** `{plain(delivery.external_id)}`",
        f"**trust** {plain(delivery.trust_mode)} · verified {'yes' if delivery.verified else 'no'}"
        f" ({plain(delivery.verify_detail)})",
        f"**body** {len(delivery.body)} bytes, {plain(delivery.content_type or 'no content type')}",
        f"**received** {plain(delivery.received_at)}",
    ]
    return "\n\n".join(lines)


class DeliveryInput(BaseModel):
    """Everything the receiver established before any write: the RouteDelivery workflow's input."""

    # The body travels as base64 of its exact bytes: 4/3 of its size whatever it holds (a JSON escape of text
    # can grow six-fold), so what the ingest cap admits always fits Temporal's payload limit.
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    webhook_id: str
    endpoint_id: str
    source: str
    kind: str | None
    external_id: str
    trust_mode: str
    verified: bool
    verify_detail: str
    content_type: str | None
    headers: dict[str, str]
    body: bytes
    source_ip: str | None
    received_at: str
    # The Temporal UI's line for the run (summary_line), derived once by the receiver.
    summary: str = ""
    # How long the evaluation may wait in Temporal for a free evaluate worker slot before it faults as
    # sandbox_busy (SWITCHBOARD_EVALUATE_QUEUE_SECONDS); a flood queues within this bound instead of faulting.
    evaluate_queue_seconds: float = 120.0
    # A re-route (reroute_webhook_event/s): the original event this routes again. The new event row has a dedup
    # slot of its own (external_id carries the re-route's mark), while its todos keep the original delivery's
    # idempotency key, so one delivery never holds two live todos on one endpoint (todos_live_idem_idx).
    reroute_of: str | None = None
    idempotency_key: str | None = None
    # The producer's own delivery id (X-GitHub-Delivery, a Stripe event id, ...), upserted by the run as
    # SwitchboardDeliveryId with its decision.
    producer_delivery_id: str | None = None
    # A release (release_webhook_event): the person's decision that lets this delivery past the trust gate,
    # shown to rules as .release. Its dedup slot derives from the quarantined event, so a second release of the
    # same event finds it taken and mints nothing.
    release: Release | None = None

    @property
    def workflow_id(self) -> str:
        """The RouteDelivery workflow id of this delivery."""
        return workflow_id_for(self.webhook_id, self.external_id)

    def payload_checked(self) -> tuple[Any, bool]:
        """The body parsed as JSON (or None), and whether a lone surrogate in it was replaced."""
        return parse_payload_checked(self.body)

    def todo_key(self) -> str:
        """The idempotency key of the todos this delivery mints: the delivery's own, also when re-routed."""
        return self.idempotency_key or self.external_id

    def envelope(self, trusted_actors: Any = None) -> dict[str, Any]:
        """The routing envelope of this delivery under the webhook's gate, as rules, dry-run and backtest see it."""
        return envelope_of(self, trusted_actors)


class CommitInput(BaseModel):
    """The commit activity's input: the delivery and the router's decision."""

    delivery: DeliveryInput
    decision: Decision
    workflow_id: str | None = None
    # The RouteDelivery run committing; stored on the event so a retry of this commit recognises its own work.
    run_id: str | None = None


class FaultCommitInput(BaseModel):
    """A delivery whose commit (or start) failed deterministically: store it as faulted with the error."""

    delivery: DeliveryInput
    # commit_failed: the store refused the commit; start_refused: Temporal refused to start its run.
    cause: Literal["commit_failed", "start_refused"] = "commit_failed"
    error_type: str
    error_message: str
    faults: list[dict[str, Any]] = Field(default_factory=list)
    workflow_id: str | None = None


class TodoRef(BaseModel):
    """One todo a delivery produced (or found, on a redelivery)."""

    id: str = Field(description="the todo (td_…)")
    endpoint_id: str = Field(description="the endpoint it is for")
    queue: str = Field(description="the queue it is in")
    created: bool = Field(description="this call created it; false on a redelivery")


class DeliveryAnswer(BaseModel):
    """The producer's 202 for a routed delivery: what it made or found, never the routing trace.

    Each of duplicate, dropped, repeat, faulted and quarantined is present only when it holds.
    """

    model_config = ConfigDict(extra="forbid")

    event_id: str | None = Field(
        description="the stored event (ev_…); null only when not even the faulted event could be stored"
    )
    todos: list[TodoRef] = Field(description="the todos the delivery made, or found on a redelivery")
    created: int = Field(description="how many todos this call created: 0 on a redelivery")
    verified: bool = Field(description="the signature was verified (false for a token-URL `generic` webhook)")
    trust_mode: str = Field(description="signed (an HMAC was checked) or token (the URL is the credential)")
    duplicate: bool = Field(False, description="a redelivery: the todos are the first delivery's")
    dropped: bool = Field(False, description="a rule (or the default action) dropped it: no todos")
    repeat: bool = Field(False, description="its once-key was already claimed: no todos")
    faulted: bool = Field(False, description="held at a rule fault (on_fault hold) or a refused commit: no todos")
    quarantined: bool = Field(False, description="held for a person (the trust gate, a quarantine action): no todos")


class CommitResult(BaseModel):
    """What the receiver tells the producer, and what the workflow returns."""

    status: CommitStatus = "committed"
    event_id: str | None = None
    todos: list[TodoRef] = Field(default_factory=list)
    created: int = 0
    duplicate: bool = False
    dropped: bool = False
    repeat: bool = False
    faulted: bool = False  # on_fault "hold" stopped at a fault, or the commit failed deterministically
    quarantined: bool = False  # held for a person: the trust gate, or a quarantine action
    verified: bool = False
    trust_mode: str = ""
    disposition: EventDisposition = "routed"
    rule_id: str | None = None
    # Why a quarantined delivery was held: untrusted_actor (the trust gate) or rule_action.
    quarantine_reason: QuarantineReason | None = None

    def joined(self) -> CommitResult:
        """The outcome as a redelivery that joined another call's run reports it: nothing created by it."""
        if self.status != "committed":
            return self
        todos = [t.model_copy(update={"created": False}) for t in self.todos]
        return self.model_copy(update={"duplicate": True, "created": 0, "todos": todos})

    def response_body(self) -> dict[str, Any]:
        """The documented 202 body (DeliveryAnswer); never echoes the trace."""
        answer = DeliveryAnswer(
            event_id=self.event_id,
            todos=self.todos,
            created=self.created,
            verified=self.verified,
            trust_mode=self.trust_mode,
            duplicate=self.duplicate,
            dropped=self.dropped,
            repeat=self.repeat,
            faulted=self.faulted,
            quarantined=self.quarantined,
        )
        return answer.model_dump(exclude_defaults=True)

"""A verified delivery as it travels from the receiver through the workflow to the commit."""

from __future__ import annotations

import base64
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from routing.envelope import build_envelope
from routing.models import Decision, EventDisposition

# committed: the delivery is an event (whatever its disposition); gone: the webhook no longer exists;
# no_targets: it has no live target, so nothing was stored.
CommitStatus = Literal["committed", "gone", "no_targets"]


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
    def body(self) -> bytes:
        """The raw body, exactly as received."""
        ...


def envelope_of(received: Received) -> dict[str, Any]:
    """The routing envelope of a delivery, in flight or stored: what rules, dry-run and backtest see."""
    return build_envelope(
        source=received.source,
        webhook_id=received.webhook_id,
        trust_mode=received.trust_mode,
        verified=received.verified,
        content_type=received.content_type,
        headers=received.headers,
        body=received.body(),
        # The receiver's own kind (a collector's kind rule may have set it), never re-derived.
        kind=received.kind,
    )


class DeliveryInput(BaseModel):
    """Everything the receiver established before any write: the RouteDelivery workflow's input."""

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
    body_b64: str
    source_ip: str | None
    received_at: str
    # Run rule evaluation as a local activity (no extra workflow task; a dead worker is then noticed by the
    # workflow task timeout rather than a heartbeat timeout). Decided by the receiver, recorded in history.
    evaluate_locally: bool = False
    # How long the evaluation may wait in Temporal for a free evaluate worker slot before it faults as
    # sandbox_busy (SWITCHBOARD_EVALUATE_QUEUE_SECONDS); a flood queues within this bound instead of faulting.
    evaluate_queue_seconds: float = 120.0
    # A re-route (reroute_webhook_event/s): the original event this routes again. The new event row has a dedup
    # slot of its own (external_id carries the re-route's mark), while its todos keep the original delivery's
    # idempotency key, so one delivery never holds two live todos on one endpoint (todos_live_idem_idx).
    reroute_of: str | None = None
    idempotency_key: str | None = None

    def body(self) -> bytes:
        """The raw body, exactly as received."""
        return base64.b64decode(self.body_b64)

    def todo_key(self) -> str:
        """The idempotency key of the todos this delivery mints: the delivery's own, also when re-routed."""
        return self.idempotency_key or self.external_id

    def envelope(self) -> dict[str, Any]:
        """The routing envelope of this delivery, as rules, dry-run and backtest see it."""
        return envelope_of(self)


class CommitInput(BaseModel):
    """The commit activity's input: the delivery and the router's decision."""

    delivery: DeliveryInput
    decision: Decision
    workflow_id: str | None = None
    # The RouteDelivery run committing; stored on the event so a retry of this commit recognises its own work.
    run_id: str | None = None


class FaultCommitInput(BaseModel):
    """A delivery whose commit failed deterministically: store it as faulted with the error, nothing else."""

    delivery: DeliveryInput
    error_type: str
    error_message: str
    faults: list[dict[str, Any]] = Field(default_factory=list)
    workflow_id: str | None = None


class TodoRef(BaseModel):
    """One todo a delivery produced (or found, on a redelivery)."""

    id: str
    endpoint_id: str
    queue: str
    created: bool


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
    verified: bool = False
    trust_mode: str = ""
    disposition: EventDisposition = "routed"
    rule_id: str | None = None

    def joined(self) -> CommitResult:
        """The outcome as a redelivery that joined another call's run reports it: nothing created by it."""
        if self.status != "committed":
            return self
        todos = [t.model_copy(update={"created": False}) for t in self.todos]
        return self.model_copy(update={"duplicate": True, "created": 0, "todos": todos})

    def response_body(self) -> dict[str, Any]:
        """The documented 202 body; never echoes the trace."""
        body: dict[str, Any] = {
            "event_id": self.event_id,
            "todos": [t.model_dump() for t in self.todos],
            "created": self.created,
            "verified": self.verified,
            "trust_mode": self.trust_mode,
        }
        if self.duplicate:
            body["duplicate"] = True
        if self.dropped:
            body["dropped"] = True
        if self.repeat:
            body["repeat"] = True
        if self.faulted:
            body["faulted"] = True
        return body

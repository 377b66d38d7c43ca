"""A verified delivery as it travels from the receiver through the workflow to the commit."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field, model_validator

from routing.envelope import build_envelope, parse_payload, parse_payload_checked
from routing.models import Decision, EventDisposition

# committed: the delivery is an event (whatever its disposition); gone: the webhook no longer exists;
# no_targets: it has no live target, so nothing was stored.
CommitStatus = Literal["committed", "gone", "no_targets"]
# Where RouteDelivery evaluates rules (SWITCHBOARD_EVALUATE): local first with fair overflow, the queue, local.
EvaluatePath = Literal["auto", "queue", "local"]


def workflow_id_for(webhook_id: str, external_id: str) -> str:
    """The RouteDelivery workflow id of a delivery: deterministic, so concurrent redeliveries join one run."""
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
    def body(self) -> bytes:
        """The raw body, exactly as received."""
        ...


def envelope_of(received: Received, parsed: tuple[Any, int] | None = None) -> dict[str, Any]:
    """The routing envelope of a delivery, in flight or stored: what rules, dry-run and backtest see.

    ``parsed`` is the body's parse_payload value and byte size when the caller holds them already.
    """
    return build_envelope(
        source=received.source,
        webhook_id=received.webhook_id,
        trust_mode=received.trust_mode,
        verified=received.verified,
        content_type=received.content_type,
        headers=received.headers,
        body=received.body() if parsed is None else None,
        parsed=parsed,
        # The receiver's own kind (a collector's kind rule may have set it), never re-derived.
        kind=received.kind,
    )


# How a JSON body is laid out, as json.dumps arguments: a body laid out one of these ways travels as its parsed
# value (readable in the Temporal UI, and parsed once), and its exact bytes come back by dumping that value.
_LAYOUTS: dict[str, dict[str, Any]] = {
    "compact": {"separators": (",", ":")},
    "spaced": {},
    "indent2": {"indent": 2},
    "indent4": {"indent": 4},
}
# Temporal's pydantic converter refuses values nested much deeper (about 250 levels, with the models around the
# body); a deeper body travels as text.
MAX_CARRIED_DEPTH = 64
_UNPARSED: Any = object()


def _dump(value: Any, layout: str) -> bytes:
    """The exact bytes of a body carried as JSON, from its value and layout (``name[+ascii][+lf]``)."""
    name, *flags = layout.split("+")
    text = json.dumps(value, ensure_ascii="ascii" in flags, allow_nan=False, **_LAYOUTS[name])
    return (text + ("\n" if "lf" in flags else "")).encode()


def _shallow(value: Any) -> bool:
    """Whether ``value`` nests at most MAX_CARRIED_DEPTH containers deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_CARRIED_DEPTH:
            return False
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return True


def _layout_of(body: bytes, payload: Any) -> str | None:
    """The layout whose dump of ``payload`` is exactly ``body``, if one is."""
    if not isinstance(payload, dict | list) or not _shallow(payload):
        return None
    core, lf = (body[:-1], "+lf") if body.endswith(b"\n") else (body, "")
    ascii_ = "+ascii" if core.isascii() else ""
    head = core[:256]
    names = ("indent2", "indent4") if b"\n" in head else ("spaced",) if b'": ' in head else ("compact",)
    for name in names:
        layout = name + ascii_ + lf
        if _dump(payload, layout) == body:
            return layout
    return None


def carried_body(body: bytes, payload: Any = _UNPARSED) -> dict[str, Any]:
    """The DeliveryInput fields that carry ``body`` (``payload`` is its parse_payload, when already parsed).

    Once in the workflow's history and readable there: a JSON object or array whose exact bytes come back from
    its value as its parsed value, other UTF-8 as text, anything else as base64.
    """
    if payload is _UNPARSED:
        payload = parse_payload(body)
    layout = _layout_of(body, payload)
    if layout is not None:
        return {"body_json": payload, "body_layout": layout, "body_size": len(body)}
    try:
        return {"body_text": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_b64": base64.b64encode(body).decode()}


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
    # The body, in exactly one of three forms (carried_body): its JSON value with the layout that gives back its
    # exact bytes, its UTF-8 text, or base64 (every delivery recorded before the first two existed).
    body_b64: str | None = None
    body_text: str | None = None
    body_json: Any = None
    body_layout: str | None = None
    body_size: int | None = None
    source_ip: str | None
    received_at: str
    # Run rule evaluation as a local activity (no extra workflow task; a dead worker is then noticed by the
    # workflow task timeout rather than a heartbeat timeout). Decided by the receiver, recorded in history.
    evaluate_locally: bool = False
    # The evaluate path (SWITCHBOARD_EVALUATE): "auto" evaluates on the worker's free sandbox child when there is
    # one and overflows to the fair evaluate queue, "queue" always queues, "local" is evaluate_locally. Inputs
    # recorded before the field read "auto", and their runs replay on the path their history took.
    evaluate_path: EvaluatePath = "auto"
    # How long the evaluation may wait in Temporal for a free evaluate worker slot before it faults as
    # sandbox_busy (SWITCHBOARD_EVALUATE_QUEUE_SECONDS); a flood queues within this bound instead of faulting.
    evaluate_queue_seconds: float = 120.0
    # Written True by every receiver (ingest, re-route, schedule fire): the run takes the local-first path (when
    # evaluate_path is "auto") without asking the evaluate-local-first patch, whose marker and TemporalChangeVersion
    # upsert cost every delivery with rules a history event and a visibility write (2-3 ms of the dev server's CPU
    # per delivery, bench/ingest_rules.py). Inputs recorded before read False and ask the patch, as they did.
    local_first: bool = False
    # A re-route (reroute_webhook_event/s): the original event this routes again. The new event row has a dedup
    # slot of its own (external_id carries the re-route's mark), while its todos keep the original delivery's
    # idempotency key, so one delivery never holds two live todos on one endpoint (todos_live_idem_idx).
    reroute_of: str | None = None
    idempotency_key: str | None = None
    # The producer's own delivery id (X-GitHub-Delivery, a Stripe event id, ...), found by the start
    # (runtime/starts.py) and upserted by the run as SwitchboardDeliveryId with its decision.
    producer_delivery_id: str | None = None

    @model_validator(mode="after")
    def _one_body(self) -> DeliveryInput:
        forms = [self.body_b64 is not None, self.body_text is not None, self.body_layout is not None]
        if sum(forms) != 1:
            raise ValueError("a delivery carries its body in exactly one of body_b64, body_text, body_json")
        if self.body_layout is not None and (self.body_size is None or self.body_layout.split("+")[0] not in _LAYOUTS):
            raise ValueError("body_json needs a known body_layout and its body_size")
        return self

    def body(self) -> bytes:
        """The raw body, exactly as received."""
        if self.body_layout is not None:
            data = _dump(self.body_json, self.body_layout)
            if len(data) != self.body_size:
                # Never store or route bytes other than the producer's: fail the step instead (visible, retried).
                raise ValueError(f"body_json does not give back the body's {self.body_size} bytes")
            return data
        if self.body_text is not None:
            return self.body_text.encode()
        return base64.b64decode(self.body_b64 or "")

    def payload_checked(self, body: bytes) -> tuple[Any, bool]:
        """parse_payload_checked of this delivery's ``body`` (from body()); a body carried as JSON is not parsed again."""
        if self.body_layout is not None:
            # Its bytes are a dump of this value, so nothing in it was replaced: it is the parse, and not lossy.
            return self.body_json, False
        return parse_payload_checked(body)

    def size(self) -> int:
        """The body's length in bytes, without rebuilding it."""
        if self.body_size is not None:
            return self.body_size
        if self.body_text is not None:
            return len(self.body_text.encode())
        return len(base64.b64decode(self.body_b64 or ""))

    def todo_key(self) -> str:
        """The idempotency key of the todos this delivery mints: the delivery's own, also when re-routed."""
        return self.idempotency_key or self.external_id

    def envelope(self) -> dict[str, Any]:
        """The routing envelope of this delivery, as rules, dry-run and backtest see it."""
        if self.body_layout is None:
            return envelope_of(self)
        # The body travelled as its parsed value (carried_body): route on it, never dump and parse it again.
        return envelope_of(self, parsed=(self.body_json, self.size()))


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

"""Event history verbs: what arrived on the caller's human's webhooks and how each delivery was routed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from api.verbs.registry import READ, AnyJson, CliArg, CliCommand, Context, VerbInput, verb
from routing.models import EVENT_DISPOSITIONS, EventDisposition
from routing.trust import QuarantineReason, quarantine_reason
from store.events import EventDetail, EventSummary, QuarantineState

EVENTS_HELP = "event history and re-routes (as the webhooks' owner)"


class ListEventsInput(VerbInput):
    webhook_id: str | None = Field(default=None, max_length=1000, description="only this webhook's events")
    kind: str | None = Field(default=None, max_length=256, description="only this .kind, e.g. issues or push")
    disposition: EventDisposition | None = Field(
        default=None,
        description=(
            "only events routed, dropped, repeat (once key already claimed), faulted (on_fault hold) or quarantined"
            " (held for a person: the trust gate or a quarantine action)"
        ),
    )
    quarantine_state: QuarantineState | None = Field(
        default=None,
        description="only quarantined events still held, released (routed again) or dismissed",
    )
    since: datetime | None = Field(default=None, description="only events received at or after this instant")
    limit: int = Field(default=50, ge=1, le=200, description="the most events on one page")
    cursor: str | None = Field(default=None, max_length=1000, description="next_cursor of the previous page")
    delivery_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description=(
            "the producer's delivery id (X-GitHub-Delivery, X-Gitea-Delivery, the Stripe or Slack event id, the"
            " cairn event_id, X-Delivery-Id / Webhook-Id / the CloudEvents id, or the sha256:… body hash used"
            " when none was sent): exactly the events of that delivery, its re-routes included"
        ),
    )


class QuarantineOut(BaseModel):
    """Why an event was quarantined and what a person decided (release_webhook_event, dismiss_webhook_event)."""

    state: QuarantineState
    reason: QuarantineReason = Field(description="untrusted_actor (the trust gate) or rule_action")
    reviewed_by: str | None = Field(default=None, description='who released or dismissed it: "endpoint:<id>"')
    reviewed_at: datetime | None = None
    note: str | None = None
    release_event_id: str | None = Field(default=None, description="the event its release routed")


class EventOut(BaseModel):
    id: str
    source: str
    kind: str | None
    trust_mode: str
    verified: bool
    payload_size: int
    received_at: datetime
    webhook_id: str
    disposition: EventDisposition
    routing: dict[str, Any] = Field(description="the routing trace: rule, action, faults, once-key")
    todo_ids: list[str]
    reroute_of: str | None = Field(default=None, description="the original event, when this event is a re-route")
    quarantine: QuarantineOut | None = Field(
        default=None, description="a quarantined event's review: held, or released / dismissed by whom and when"
    )
    release: dict[str, Any] | None = Field(
        default=None,
        description="the release that routed this event past the trust gate ({by, at, event_id}), when it is one",
    )


class ListEventsOutput(BaseModel):
    events: list[EventOut]
    next_cursor: str | None = None


class GetEventInput(VerbInput):
    event_id: str = Field(max_length=1000, description="the event's id (ev_…), from list_webhook_events or a todo")


class EventDetailOut(EventOut):
    external_id: str
    content_type: str | None
    headers: dict[str, Any] = Field(description="as received, lower-cased, credentials redacted")
    payload: AnyJson = Field(description="decoded JSON when the body parses, else text (or base64)")
    payload_encoding: Literal["json", "text", "base64"]


def _quarantine(e: EventSummary) -> QuarantineOut | None:
    if e.quarantine_state is None:
        return None
    return QuarantineOut(
        state=e.quarantine_state,
        reason=quarantine_reason(e.routing),
        reviewed_by=e.reviewed_by,
        reviewed_at=e.reviewed_at,
        note=e.review_note,
        release_event_id=e.release_event_id,
    )


def _summary(e: EventSummary) -> EventOut:
    return EventOut.model_validate({**e.model_dump(), "quarantine": _quarantine(e)})


@verb(
    "list_webhook_events",
    input=ListEventsInput,
    output=ListEventsOutput,
    family="events",
    summary="Events on your human's webhooks, newest first, with their routing traces; pages by cursor.",
    hints=READ,
    cli=CliCommand(
        "events",
        EVENTS_HELP,
        "list",
        "list_webhook_events: your webhooks' events, newest first",
        (
            CliArg("webhook_id", "--webhook", help="only this webhook's (wh_…)"),
            CliArg("kind", "--kind", help="only this kind, e.g. issues"),
            CliArg("disposition", "--disposition", choices=EVENT_DISPOSITIONS),
            CliArg("quarantine_state", "--quarantine-state", choices=("held", "released", "dismissed")),
            CliArg("since", "--since", help="received at or after (ISO 8601)"),
            CliArg("delivery_id", "--delivery-id", help="only the events of this producer delivery"),
            CliArg("limit", "--limit", type="int", help="the most events (≤ 200, default 50)"),
            CliArg("cursor", "--cursor", help="next_cursor of the previous page"),
        ),
        columns=("id", "received_at", "source", "kind", "disposition", "webhook_id", "todo_ids"),
    ),
)
async def list_webhook_events(ctx: Context, data: ListEventsInput) -> ListEventsOutput:
    page = await ctx.services.events.list(
        ctx.caller,
        webhook_id=data.webhook_id,
        kind=data.kind,
        disposition=data.disposition,
        quarantine_state=data.quarantine_state,
        # A naive instant is read as UTC rather than as the database session's zone.
        since=data.since.replace(tzinfo=UTC) if data.since and data.since.tzinfo is None else data.since,
        limit=data.limit,
        cursor=data.cursor,
        # Stripped as the receiver strips the producer's id before it becomes part of the idempotency key.
        delivery_id=data.delivery_id.strip() if data.delivery_id is not None else None,
    )
    return ListEventsOutput(events=[_summary(e) for e in page.events], next_cursor=page.next_cursor)


@verb(
    "get_webhook_event",
    input=GetEventInput,
    output=EventDetailOut,
    family="events",
    summary="One event: summary, sanitized headers, payload and routing trace.",
    hints=READ,
    cli=CliCommand(
        "events",
        EVENTS_HELP,
        "show",
        "get_webhook_event: one event with its headers, payload and routing trace",
        (CliArg("event_id", help="the event (ev_…)"),),
    ),
)
async def get_webhook_event(ctx: Context, data: GetEventInput) -> EventDetailOut:
    found: EventDetail = await ctx.services.events.get(ctx.caller, data.event_id)
    return EventDetailOut.model_validate({**found.model_dump(), "quarantine": _quarantine(found)})

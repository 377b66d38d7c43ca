"""Re-routing stored deliveries, the pure parts: the new input, and the per-event plan of a (bulk) re-route.

A re-route runs a stored delivery through RouteDelivery again, with the webhook's current rules, params,
on_fault and grant, as a new event row naming the original (``reroute_of``); the original never changes. What a
re-route would do is the backtest's stored-vs-new comparison (routing.backtest) against the delivery's *current*
outcome: its latest re-route, else the original. Routing itself is routing.router's; the reads are the store's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from routing.backtest import History, Outcome, once_keys, replay_events, simulate_once
from routing.delivery import MAX_SUMMARY_CHARS, CommitResult, DeliveryInput, TodoRef, plain, summary_line
from routing.envelope import parse_payload
from routing.models import Grant
from routing.router import Evaluate
from routing.sources import producer_delivery_id
from routing.trust import Release

# Marks a re-route's own dedup slot in events.external_id: "<the original's key>#reroute:<nonce>". Lookups by
# delivery id never parse it: they follow reroute_of (store/events.py).
REROUTE_MARK = "#reroute:"
REROUTE_MAX = 200


class StoredDelivery(BaseModel):
    """An original event as the receiver stored it: what its re-route's RouteDelivery input is built from."""

    id: str
    webhook_id: str
    endpoint_id: str
    source: str
    kind: str | None
    external_id: str
    trust_mode: str
    verified: bool
    verify_detail: str | None
    content_type: str | None
    headers: dict[str, str]
    payload: bytes
    source_ip: str | None
    received_at: datetime
    # The delivery's release, once a person released it (release_webhook_event): its re-routes carry it, so a
    # released delivery is never held at the gate again.
    release: Release | None = None


# A release's nonce: derived from the quarantined event it releases, so its dedup slot and its run are the same
# for every release of that event (a second release joins the run or finds the slot taken; it mints nothing).
RELEASE_NONCE = "release-"


def release_workflow_id(event_id: str) -> str:
    """The RouteDelivery run of the release of a quarantined event (a re-route id: get_reroute follows it)."""
    return f"reroute-{event_id}-release"


def reroute_input(
    stored: StoredDelivery, nonce: str, *, evaluate_queue_seconds: float, release: Release | None = None
) -> DeliveryInput:
    """RouteDelivery's input for one re-route of a stored original: the delivery as received, a slot of its own.

    ``release`` is a person's release of it (release_input); a plain re-route carries the delivery's own, if any.
    """
    payload = parse_payload(stored.payload)
    release = release or stored.release
    what = "release" if nonce.startswith(RELEASE_NONCE) else "re-route"
    return DeliveryInput(
        webhook_id=stored.webhook_id,
        endpoint_id=stored.endpoint_id,
        source=stored.source,
        kind=stored.kind,
        external_id=f"{stored.external_id}{REROUTE_MARK}{nonce}",
        # Verification is not redone: the stored verdict is what the receiver established when it arrived (a
        # Stripe or Slack replay window would refuse every re-route otherwise).
        trust_mode=stored.trust_mode,
        verified=stored.verified,
        verify_detail=stored.verify_detail or "",
        content_type=stored.content_type,
        headers=stored.headers,
        body=stored.payload,
        source_ip=stored.source_ip,
        # The delivery's own arrival: a re-route sorts, filters and is retained with its original.
        received_at=stored.received_at.isoformat(),
        summary=plain(f"{what} {summary_line(stored.source, stored.kind, payload)}", MAX_SUMMARY_CHARS),
        evaluate_queue_seconds=evaluate_queue_seconds,
        reroute_of=stored.id,
        idempotency_key=stored.external_id,
        producer_delivery_id=producer_delivery_id(stored.source, stored.headers, payload),
        release=release,
    )


def release_input(stored: StoredDelivery, release: Release, *, evaluate_queue_seconds: float) -> DeliveryInput:
    """RouteDelivery's input for the release of a quarantined event of ``stored`` (``release.event_id``)."""
    assert release.event_id is not None
    nonce = RELEASE_NONCE + release.event_id
    return reroute_input(stored, nonce, evaluate_queue_seconds=evaluate_queue_seconds, release=release)


class PlannedEvent(BaseModel):
    """One delivery of a re-route: its current outcome beside what routing it again decides."""

    event_id: str = Field(description="the original event (what is re-routed)")
    current_event_id: str = Field(description="the event whose outcome stands: the latest re-route, else the original")
    received_at: datetime
    kind: str | None
    stored: Outcome = Field(description="the current outcome")
    candidate: Outcome = Field(description="what routing it again with the webhook's current configuration decides")
    changed: bool = Field(description="the disposition or the (endpoint, queue) todos differ: a re-route would act")


def holds_its_work_order(stored: Outcome, candidate: Outcome) -> bool:
    """The delivery already claimed the once-key the re-route would claim: a repeat of itself, not a change."""
    return (
        stored.disposition == "routed"
        and candidate.disposition == "repeat"
        and stored.once_key is not None
        and stored.once_key == candidate.once_key
    )


async def plan(
    history: History, grant: Grant, selected: Sequence[tuple[str, str]], evaluate: Evaluate
) -> list[PlannedEvent]:
    """Route each selected delivery (original, current event), newest first, again under ``grant``; write nothing.

    Once-keys are simulated oldest first as the backtest does, except that every standing claim holds, the
    window's own included: re-routing a delivery never re-runs a work order someone (itself too) claimed.
    """
    originals = {current: original for original, current in selected}
    replayed = await replay_events(history, grant, [current for _, current in selected], evaluate)
    claims = await history.once_claims(grant.webhook_id, once_keys(replayed))
    rows = simulate_once(replayed, set(claims))
    planned = [
        PlannedEvent(
            event_id=originals[row.event_id],
            current_event_id=row.event_id,
            received_at=row.received_at,
            kind=row.kind,
            stored=row.stored,
            candidate=row.candidate,
            changed=row.changed and not holds_its_work_order(row.stored, row.candidate),
        )
        for row in rows
    ]
    planned.reverse()
    return planned


class RerouteResult(BaseModel):
    """What re-routing one delivery did (or why it did not)."""

    event_id: str = Field(description="the original event")
    workflow_id: str | None = Field(default=None, description="the re-route's RouteDelivery run")
    reroute_event_id: str | None = Field(default=None, description="the new event row (reroute_of = event_id)")
    status: str = Field(default="committed", description="committed | gone | no_targets | missing | failed")
    disposition: str | None = None
    todos: list[TodoRef] = Field(default_factory=list)
    created: int = 0
    error: str | None = None


def result_of(event_id: str, workflow_id: str, committed: CommitResult) -> RerouteResult:
    """A re-route's answer from its RouteDelivery result."""
    return RerouteResult(
        event_id=event_id,
        workflow_id=workflow_id,
        reroute_event_id=committed.event_id,
        status=committed.status,
        disposition=committed.disposition if committed.status == "committed" else None,
        todos=committed.todos,
        created=committed.created,
    )


class RerouteEventsInput(BaseModel):
    """The bulk re-route workflow's input: the originals to re-route, oldest first (once-keys in arrival order)."""

    webhook_id: str
    event_ids: list[str]
    batch: str = Field(description="this re-route's nonce: each re-route's workflow id and dedup slot derive from it")
    matched: int = 0
    changed: int = 0
    evaluate_queue_seconds: float = 120.0
    starts_per_second: float = 10.0
    # Deliveries one run re-routes before it continues as new (workflows/reroute.py says why).
    per_run: int = 25
    # Carried across continue-as-new: what the earlier runs of this re-route did.
    done: list[RerouteResult] = Field(default_factory=list)


class RerouteProgress(BaseModel):
    """How far a bulk re-route is: visible by query while it runs, and its final answer."""

    webhook_id: str
    matched: int = 0
    changed: int = 0
    total: int = Field(default=0, description="events to re-route (the changed ones)")
    done: int = 0
    created: int = Field(default=0, description="todos the re-routes minted")
    failed: int = Field(default=0, description="re-routes whose RouteDelivery run failed (status failed)")
    results: list[RerouteResult] = Field(default_factory=list)

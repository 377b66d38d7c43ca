"""Quarantine verbs of the events family: a person releases a held delivery (routed again past the trust gate, as
a new event, once) or dismisses it (closed without routing). docs/trust-gate.md has the whole picture."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from api.verbs.events import EVENTS_HELP
from api.verbs.registry import CliArg, CliCommand, Context, Hints, VerbInput, verb
from api.verbs.reroutes import FAMILY, WAIT_DEFAULT, WAIT_DOC, WAIT_MAX, current_grant, route_again
from api.verbs.rules import history_of
from routing.reroute import RerouteResult, release_input, release_workflow_id
from routing.trust import Release
from store.events import Review


class ReviewInput(VerbInput):
    event_id: str = Field(
        min_length=1, max_length=1000, description="a quarantined event of one of your human's webhooks"
    )
    note: str | None = Field(default=None, max_length=1000, description="why, for the record (shown on the event)")


class ReleaseEventInput(ReviewInput):
    wait_seconds: float = Field(default=WAIT_DEFAULT, ge=0, le=WAIT_MAX, description=WAIT_DOC)


class ReviewOut(BaseModel):
    """A quarantined event's review as it stands."""

    event_id: str = Field(description="the quarantined event")
    state: Literal["held", "released", "dismissed"]
    reason: Literal["untrusted_actor", "rule_action"] = Field(
        description="why it was held: the trust gate, or a quarantine rule or default"
    )
    reviewed_by: str | None = Field(default=None, description='who decided: "endpoint:<id>"')
    reviewed_at: datetime | None = None
    note: str | None = None
    release_event_id: str | None = Field(default=None, description="the event its release routed")


class ReleaseEventOutput(BaseModel):
    review: ReviewOut
    workflow_id: str | None = Field(
        default=None, description="the release's RouteDelivery run (search attribute SwitchboardRerouteOf)"
    )
    pending: bool = Field(default=False, description="not routed within wait_seconds: poll get_reroute")
    result: RerouteResult | None = Field(
        default=None, description="the release's outcome: a second release of the event mints nothing (created 0)"
    )


def _review_out(review: Review) -> ReviewOut:
    return ReviewOut(
        event_id=review.event_id,
        state=review.state,
        reason=review.reason,
        reviewed_by=review.reviewed_by,
        reviewed_at=review.reviewed_at,
        note=review.note,
        release_event_id=review.release_event_id,
    )


def _by(ctx: Context) -> str:
    """Who decides a review through the agent surface: the calling endpoint of the webhook owner's human."""
    return f"endpoint:{ctx.caller.endpoint_id}"


@verb(
    "release_webhook_event",
    input=ReleaseEventInput,
    output=ReleaseEventOutput,
    family=FAMILY,
    summary="Release a quarantined event: route it again past the trust gate as a new event (.release set), once.",
    rate_class="authoring",
    hints=Hints(idempotent=True),
    cli=CliCommand(
        group="events",
        group_help=EVENTS_HELP,
        action="release",
        help="release_webhook_event: route a quarantined event again past the trust gate, once",
        args=(
            CliArg("event_id", help="the quarantined event (ev_…)"),
            CliArg("note", "--note", help="why, for the record"),
        ),
    ),
)
async def release_webhook_event(ctx: Context, data: ReleaseEventInput) -> ReleaseEventOutput:
    history = history_of(ctx)
    original = await history.original_delivery(ctx.caller, data.event_id)
    await current_grant(ctx, original.webhook_id)  # a deleted webhook has nothing to route a release with
    review = await history.review(ctx.caller, data.event_id, "released", _by(ctx), data.note)
    assert review.reviewed_by is not None and review.reviewed_at is not None
    # The release as first recorded, whoever repeats it: a second release is the same delivery in the same slot.
    at = review.reviewed_at.astimezone(UTC).isoformat()
    release = Release(by=review.reviewed_by, at=at, event_id=review.event_id)
    settings = ctx.services.settings
    delivery = release_input(original, release, evaluate_queue_seconds=settings.evaluate_queue_seconds)
    workflow_id = release_workflow_id(review.event_id)
    answer = ReleaseEventOutput(review=_review_out(review), workflow_id=workflow_id)
    answer.result = await route_again(
        ctx,
        delivery,
        workflow_id,
        original.id,
        data.wait_seconds,
        # A run of this release still going is joined; a closed one runs again and finds its event stored.
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    answer.pending = answer.result is None
    if answer.result is not None and answer.result.reroute_event_id and answer.review.release_event_id is None:
        answer.review.release_event_id = answer.result.reroute_event_id
    return answer


@verb(
    "dismiss_webhook_event",
    input=ReviewInput,
    output=ReviewOut,
    family=FAMILY,
    summary="Dismiss a quarantined event: close it without routing it (a repeat changes nothing).",
    rate_class="authoring",
    hints=Hints(idempotent=True),
    cli=CliCommand(
        group="events",
        group_help=EVENTS_HELP,
        action="dismiss",
        help="dismiss_webhook_event: close a quarantined event without routing it",
        args=(
            CliArg("event_id", help="the quarantined event (ev_…)"),
            CliArg("note", "--note", help="why, for the record"),
        ),
    ),
)
async def dismiss_webhook_event(ctx: Context, data: ReviewInput) -> ReviewOut:
    return _review_out(await history_of(ctx).review(ctx.caller, data.event_id, "dismissed", _by(ctx), data.note))

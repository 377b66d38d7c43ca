"""LLM triage verbs of the webhooks family (SPEC-0020 Phase 2): an owner's opt-in, bounded triage stage.

Members of the rule family: the same allowlist (the endpoint's verb scope), the same ownership (the caller's
human owns the webhook; another tenant's webhook is the same not_found as an unknown one), validated at save
like a rule action (a queue outside the webhook's grant is not_granted, answered as forbidden). The stage runs
in RouteDelivery only when no rule matched; dry-runs and backtests never call the model (their trace marks
the stage "not_run"). preview_llm_triage runs a candidate stage over stored events at authoring time, through
the delivery's own call (activities.triage.ask_model: budget, prompt, schema, client) and judge
(routing.triage.judge), so a model that cannot tell the queues apart shows before it is enabled.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, StrictBool

from activities.triage import ask_model
from api.verbs.llm_providers import LLM_HELP
from api.verbs.registry import READ, CliArg, CliCommand, Context, Hints, VerbInput, verb
from api.verbs.rules import FAMILY, WebhookInput, history_of
from routing.backtest import REPLAY_BATCH
from routing.models import TriageConfig, TriageQueue
from routing.triage import NOT_RUN, TriageInput, judge, projection
from runtime.root import llm_ceilings
from store.errors import InvalidArgument
from store.llm import MAX_DESCRIPTION_CHARS, MAX_TRIAGE_QUEUES, Ceilings, TriageSetting

PREVIEW_DEFAULT = 10
PREVIEW_MAX = 50
PREVIEW_SECONDS = 120.0
"""A preview's whole run: events not asked by then are "not_run", so a hung provider cannot hold the verb."""


class TriageQueueIn(VerbInput):
    queue: str = Field(min_length=1, max_length=200, description="a queue of the webhook's grant")
    description: str = Field(
        default="", max_length=MAX_DESCRIPTION_CHARS, description="what belongs there, in the owner's words"
    )


class SetLlmTriageInput(WebhookInput):
    provider: str = Field(min_length=1, max_length=63, description="a registered provider (list_llm_providers)")
    model: str = Field(min_length=1, max_length=200, description="one of the provider's models")
    queues: list[TriageQueueIn] = Field(
        min_length=1, max_length=MAX_TRIAGE_QUEUES, description="the only queues the model may choose, described"
    )
    threshold: float = Field(ge=0, le=1, description="answers less confident than this take the default")
    per_minute: int = Field(ge=0, description="this webhook's triage calls per minute (≤ the operator ceiling)")
    per_day: int = Field(ge=0, description="this webhook's triage calls per UTC day (≤ the operator ceiling)")
    include_payload: StrictBool = Field(
        default=False, description="send the payload text (capped) to the provider too; recorded when enabled"
    )
    timeout_seconds: float | None = Field(
        default=None, gt=0, description="per-call timeout; omitted: the provider's (≤ the operator ceiling)"
    )


class CeilingsOut(BaseModel):
    """The operator's caps: calls per endpoint (all its webhooks together) per minute and per day, longest call."""

    per_minute: int
    per_day: int
    timeout_seconds: float


class LlmTriageOutput(BaseModel):
    webhook_id: str
    triage: TriageConfig | None = Field(
        description="the saved stage (include_payload_set_at/by record who enabled payload text); null: off"
    )
    ceilings: CeilingsOut


class ClearLlmTriageOutput(LlmTriageOutput):
    cleared: bool = Field(description="false when no stage was configured (still a success)")


def _ceilings(ctx: Context) -> CeilingsOut:
    c = llm_ceilings(ctx.services.settings)
    return CeilingsOut(per_minute=c.per_minute, per_day=c.per_day, timeout_seconds=c.timeout_seconds)


@verb(
    "set_llm_triage",
    input=SetLlmTriageInput,
    output=LlmTriageOutput,
    family=FAMILY,
    summary="Turn on (or replace) a webhook's LLM triage stage: when no rule matches, a model picks one of"
    " these granted queues, within budget and timeout, or the default decides.",
    rate_class="authoring",
    hints=Hints(destructive=True, idempotent=True),
)
async def set_llm_triage(ctx: Context, data: SetLlmTriageInput) -> LlmTriageOutput:
    setting = TriageSetting(
        provider=data.provider,
        model=data.model,
        queues=[TriageQueue(queue=q.queue, description=q.description) for q in data.queues],
        threshold=data.threshold,
        per_minute=data.per_minute,
        per_day=data.per_day,
        include_payload=data.include_payload,
        timeout_seconds=data.timeout_seconds,
    )
    saved = await ctx.services.llm.set_triage(ctx.caller, data.webhook_id, setting, llm_ceilings(ctx.services.settings))
    return LlmTriageOutput(webhook_id=data.webhook_id, triage=saved, ceilings=_ceilings(ctx))


@verb(
    "get_llm_triage",
    input=WebhookInput,
    output=LlmTriageOutput,
    family=FAMILY,
    summary="A webhook's LLM triage stage (null when off) and the operator's ceilings.",
    hints=READ,
)
async def get_llm_triage(ctx: Context, data: WebhookInput) -> LlmTriageOutput:
    saved = await ctx.services.llm.get_triage(ctx.caller, data.webhook_id)
    return LlmTriageOutput(webhook_id=data.webhook_id, triage=saved, ceilings=_ceilings(ctx))


@verb(
    "clear_llm_triage",
    input=WebhookInput,
    output=ClearLlmTriageOutput,
    family=FAMILY,
    summary="Turn a webhook's LLM triage off: unmatched deliveries take the default again, with no model call.",
    rate_class="authoring",
    hints=Hints(destructive=True, idempotent=True),
)
async def clear_llm_triage(ctx: Context, data: WebhookInput) -> ClearLlmTriageOutput:
    cleared = await ctx.services.llm.clear_triage(ctx.caller, data.webhook_id)
    return ClearLlmTriageOutput(webhook_id=data.webhook_id, triage=None, ceilings=_ceilings(ctx), cleared=cleared)


class PreviewLlmTriageInput(WebhookInput):
    provider: str | None = Field(
        default=None, min_length=1, max_length=63, description="omitted: the saved stage's provider"
    )
    model: str | None = Field(
        default=None, min_length=1, max_length=200, description="omitted: the saved stage's model (same provider)"
    )
    queues: list[TriageQueueIn] | None = Field(
        default=None, min_length=1, max_length=MAX_TRIAGE_QUEUES, description="omitted: the saved stage's queues"
    )
    threshold: float | None = Field(default=None, ge=0, le=1, description="omitted: the saved stage's, else 0")
    limit: int = Field(default=PREVIEW_DEFAULT, ge=1, le=PREVIEW_MAX, description="most recent events to ask about")


class PreviewedEvent(BaseModel):
    """One stored event asked about: what the model answered and what a delivery would make of it."""

    event_id: str
    received_at: datetime
    kind: str | None
    title: str = Field(description="the title the model saw")
    queue: str | None = Field(description="the queue the answer named (null: no answer)")
    confidence: float | None
    reason: str | None
    outcome: str = Field(
        description="chosen, llm_low_confidence, llm_rejected, llm_timeout, llm_error, budget_exhausted, or not_run"
        " (the preview's time ran out first)"
    )
    detail: str | None
    latency_ms: int | None


class PreviewSummary(BaseModel):
    events: int
    by_queue: dict[str, int] = Field(description="the queue each answer named, whatever its outcome")
    chosen: dict[str, int] = Field(description="the queues deliveries would have been routed to by the model")
    by_outcome: dict[str, int]
    note: str | None = Field(description="set when every answer named the same queue of several")


class PreviewLlmTriageOutput(BaseModel):
    webhook_id: str
    events: list[PreviewedEvent] = Field(description="newest first")
    summary: PreviewSummary
    triage: TriageConfig = Field(description="the candidate stage as tried (nothing was saved)")
    ceilings: CeilingsOut


def _candidate(data: PreviewLlmTriageInput, saved: TriageConfig | None, ceilings: Ceilings) -> TriageSetting:
    """The stage to try: each given field over the saved stage; budgets are always the saved ones (or the caps)."""
    provider = data.provider or (saved.provider if saved is not None else None)
    same = saved is not None and provider == saved.provider
    model = data.model or (saved.model if saved is not None and same else None)
    if data.queues is not None:
        queues = [TriageQueue(queue=q.queue, description=q.description) for q in data.queues]
    elif saved is not None:
        queues = saved.queues
    else:
        queues = []
    if provider is None or model is None or not queues:
        raise InvalidArgument(
            "nothing to preview: give provider, model and queues, or configure triage on this webhook (set_llm_triage)"
        )
    return TriageSetting(
        provider=provider,
        model=model,
        queues=queues,
        threshold=data.threshold if data.threshold is not None else (saved.threshold if saved is not None else 0.0),
        per_minute=saved.per_minute if saved is not None else ceilings.per_minute,
        per_day=saved.per_day if saved is not None else ceilings.per_day,
        # The owner's egress decision names a provider: payload text goes only to the one it names.
        include_payload=saved is not None and same and saved.include_payload,
        timeout_seconds=saved.timeout_seconds if saved is not None and same else None,
    )


def _summary(rows: list[PreviewedEvent], stage: TriageConfig) -> PreviewSummary:
    by_queue = Counter(r.queue for r in rows if r.queue is not None)
    note = None
    if len(by_queue) == 1 and len(stage.queues) > 1 and sum(by_queue.values()) > 1:
        [(queue, n)] = by_queue.items()
        note = f"all {n} answers named {queue}: this model may not tell the queues apart"
    return PreviewSummary(
        events=len(rows),
        by_queue=dict(by_queue),
        chosen=dict(Counter(r.queue for r in rows if r.outcome == "chosen" and r.queue is not None)),
        by_outcome=dict(Counter(r.outcome for r in rows)),
        note=note,
    )


@verb(
    "preview_llm_triage",
    input=PreviewLlmTriageInput,
    output=PreviewLlmTriageOutput,
    family=FAMILY,
    summary="Ask a candidate (or the saved) triage stage about the webhook's latest stored events, as deliveries"
    " would, and show each answer and outcome and their distribution; budget counted, nothing saved.",
    rate_class="authoring",
    hints=READ,
    cli=CliCommand(
        "llm",
        LLM_HELP,
        "preview",
        "preview_llm_triage: a triage stage over a webhook's latest events (as its owner); saves nothing",
        (
            CliArg("webhook_id", help="the webhook (wh_…)"),
            CliArg("provider", "--provider", help="default: the saved stage's"),
            CliArg("model", "--model", help="default: the saved stage's"),
            CliArg(
                "queues",
                "--queues",
                type="json_file",
                metavar="FILE",
                help='JSON file (- for stdin): [{"queue": …, "description": …}, …]; default: the saved stage\'s',
            ),
            CliArg("threshold", "--threshold", type="float", help="default: the saved stage's, else 0"),
            CliArg("limit", "--limit", type="int", help=f"most recent events (≤ {PREVIEW_MAX})"),
        ),
        columns=("event_id", "kind", "queue", "confidence", "outcome", "title"),
    ),
)
async def preview_llm_triage(ctx: Context, data: PreviewLlmTriageInput) -> PreviewLlmTriageOutput:
    llm, ceilings = ctx.services.llm, llm_ceilings(ctx.services.settings)
    # Ownership first: another human's webhook is the same not_found as an unknown one, before any read.
    saved = await llm.get_triage(ctx.caller, data.webhook_id)
    stage, grant = await llm.candidate_triage(ctx.caller, data.webhook_id, _candidate(data, saved, ceilings), ceilings)
    history = history_of(ctx)
    ids = await history.recent_event_ids(data.webhook_id, data.limit)
    deadline = time.monotonic() + PREVIEW_SECONDS
    rows: list[PreviewedEvent] = []
    for start in range(0, len(ids), REPLAY_BATCH):
        for event in await history.stored_events(data.webhook_id, ids[start : start + REPLAY_BATCH]):
            seen = projection(event.envelope(), include_payload=stage.include_payload)
            row: dict[str, Any] = {
                "event_id": event.id,
                "received_at": event.received_at,
                "kind": event.kind,
                "title": str(seen.get("title", "")),
            }
            left = deadline - time.monotonic()
            if left <= 0:
                detail = f"the preview's {PREVIEW_SECONDS:g} s ran out before this event"
                rows.append(
                    PreviewedEvent(
                        **row, queue=None, confidence=None, reason=None, outcome=NOT_RUN, detail=detail, latency_ms=None
                    )
                )
                continue
            # The delivery's own call and judgement; the budget is the webhook owner's, as a delivery spends it.
            asked = TriageInput(
                webhook_id=data.webhook_id, endpoint_id=grant.owner_endpoint_id, config=stage, projection=seen
            )
            result = await ask_model(llm, ceilings, asked, within=left)
            record = judge(stage, result, grant.queues()).record
            answer = record.get("answer") or {}
            confidence = answer.get("confidence")
            rows.append(
                PreviewedEvent(
                    **row,
                    queue=answer.get("queue") if isinstance(answer.get("queue"), str) else None,
                    confidence=confidence if isinstance(confidence, int | float) else None,
                    reason=answer.get("reason"),
                    outcome=record["outcome"],
                    detail=record.get("detail"),
                    latency_ms=result.latency_ms,
                )
            )
    return PreviewLlmTriageOutput(
        webhook_id=data.webhook_id, events=rows, summary=_summary(rows, stage), triage=stage, ceilings=_ceilings(ctx)
    )

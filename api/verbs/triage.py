"""LLM triage verbs of the webhooks family (SPEC-0020 Phase 2): an owner's opt-in, bounded triage stage.

Members of the rule family: the same allowlist (the endpoint's verb scope), the same ownership (the caller's
human owns the webhook; another tenant's webhook is the same not_found as an unknown one), validated at save
like a rule action (a queue outside the webhook's grant is not_granted, answered as forbidden). The stage runs
in RouteDelivery only when no rule matched; dry-runs and backtests never call the model (their trace marks
the stage "not_run").
"""

from __future__ import annotations

from pydantic import BaseModel, Field, StrictBool

from api.verbs.registry import READ, Context, Hints, VerbInput, verb
from api.verbs.rules import FAMILY, WebhookInput
from routing.models import TriageConfig, TriageQueue
from runtime.root import llm_ceilings
from store.llm import MAX_DESCRIPTION_CHARS, MAX_TRIAGE_QUEUES, TriageSetting


class TriageQueueIn(VerbInput):
    queue: str = Field(min_length=1, max_length=200, description="a queue of the webhook's grant")
    description: str = Field(
        default="", max_length=MAX_DESCRIPTION_CHARS, description="what belongs there, in the owner's words"
    )


class SetLlmTriageInput(WebhookInput):
    provider: str = Field(min_length=1, max_length=63, description="a registered provider, or 'embedded'")
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

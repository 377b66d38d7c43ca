"""Operator verbs of the delivery inbox: the deliveries a relay parked because their start kept failing while
Temporal answered, and giving one back to the relays (docs/production.md)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from api.verbs.admin import AdminInput, OkOutput
from api.verbs.registry import AdminContext, CliArg, CliCommand, admin_verb
from store.errors import NotFound


class ListParkedInput(AdminInput):
    limit: int = Field(default=100, ge=1, le=1000, description="at most this many rows, oldest parked first")


class ParkedDeliveryOut(BaseModel):
    workflow_id: str
    webhook_id: str
    reason: str = Field(description="why it went to the inbox (temporal_unavailable, admission, rate)")
    enqueued_at: datetime
    parked_at: datetime
    attempts: int = Field(description="starts that failed while Temporal answered")
    last_error: str | None


class ListParkedOutput(BaseModel):
    deliveries: list[ParkedDeliveryOut]


class RequeueParkedInput(AdminInput):
    workflow_id: str = Field(min_length=1, max_length=200, description="the parked delivery's workflow id")


@admin_verb(
    "list_parked_deliveries",
    input=ListParkedInput,
    output=ListParkedOutput,
    summary="Inbox deliveries a relay parked: their start kept failing while Temporal answered, with the error.",
    cli=CliCommand(
        "inbox",
        "the delivery inbox",
        "parked",
        "list parked inbox deliveries and their last error",
        (CliArg("limit", "--limit", type="int", default=100),),
    ),
)
async def list_parked_deliveries(ctx: AdminContext, data: ListParkedInput) -> ListParkedOutput:
    rows = await ctx.services.inbox.parked(data.limit)
    return ListParkedOutput(deliveries=[ParkedDeliveryOut.model_validate(r.model_dump()) for r in rows])


@admin_verb(
    "requeue_parked_delivery",
    input=RequeueParkedInput,
    output=OkOutput,
    summary="Give a parked inbox delivery back to the relays (due now, its failures forgotten).",
    cli=CliCommand(
        "inbox", "the delivery inbox", "requeue", "requeue a parked inbox delivery", (CliArg("workflow_id"),)
    ),
)
async def requeue_parked_delivery(ctx: AdminContext, data: RequeueParkedInput) -> OkOutput:
    if not await ctx.services.inbox.requeue(data.workflow_id):
        raise NotFound("no parked delivery with that workflow id")
    return OkOutput()

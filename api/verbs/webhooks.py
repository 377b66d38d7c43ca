"""Webhook self-management within the endpoint's vended ceiling."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from api.verbs.registry import Context, VerbInput, verb


class CreateWebhookInput(VerbInput):
    source_type: str = Field(min_length=1, max_length=32)
    target_queue: str = Field(min_length=1, max_length=128)


class CreateWebhookOutput(BaseModel):
    webhook_id: str
    source_type: str
    target_queue: str
    ingest_url: str
    trust_mode: str
    secret: str | None = Field(default=None, description="shown once, for signed source types")


class ListWebhooksInput(VerbInput):
    pass


class WebhookOut(BaseModel):
    webhook_id: str
    source_type: str
    target_queue: str
    trust_mode: str
    ingest_url: str
    created_at: datetime
    rule_count: int


class CeilingOut(BaseModel):
    max: int
    allowed_source_types: list[str]
    allowed_queues: list[str]
    used: int


class ListWebhooksOutput(BaseModel):
    webhooks: list[WebhookOut]
    ceiling: CeilingOut


def ingest_url(ctx: Context, token: str) -> str:
    """The URL a producer posts to."""
    return f"{ctx.services.settings.base_url()}/webhooks/w/{token}"


@verb(
    "create_webhook",
    input=CreateWebhookInput,
    output=CreateWebhookOutput,
    family="webhooks",
    summary="Create a webhook within the ceiling; a signed type's secret is shown once.",
    rate_class="webhook_admin",
)
async def create_webhook(ctx: Context, data: CreateWebhookInput) -> CreateWebhookOutput:
    made: dict[str, Any] = await ctx.services.webhooks.create(ctx.caller, data.source_type, data.target_queue)
    return CreateWebhookOutput(
        webhook_id=made["webhook_id"],
        source_type=made["source_type"],
        target_queue=made["target_queue"],
        ingest_url=ingest_url(ctx, made["ingest_token"]),
        trust_mode=made["trust_mode"],
        secret=made["secret"],
    )


@verb(
    "list_webhooks",
    input=ListWebhooksInput,
    output=ListWebhooksOutput,
    family="webhooks",
    summary="This endpoint's webhooks and its ceiling; never secrets.",
)
async def list_webhooks(ctx: Context, data: ListWebhooksInput) -> ListWebhooksOutput:
    rows = await ctx.services.webhooks.list_for_endpoint(ctx.caller)
    c = ctx.caller
    return ListWebhooksOutput(
        webhooks=[
            WebhookOut(
                webhook_id=w.id,
                source_type=w.source_type,
                target_queue=w.target_queue,
                trust_mode=w.trust_mode,
                ingest_url=ingest_url(ctx, w.ingest_token),
                created_at=w.created_at,
                rule_count=len(w.routing_rules),
            )
            for w in rows
        ],
        ceiling=CeilingOut(
            max=c.webhook_max,
            allowed_source_types=c.webhook_source_types,
            allowed_queues=c.webhook_queues,
            used=len(rows),
        ),
    )

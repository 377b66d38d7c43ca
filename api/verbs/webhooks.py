"""Webhook self-management within the endpoint's vended ceiling."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, StrictBool

from api.verbs.registry import READ, CliArg, CliCommand, CliExport, Context, Hints, VerbInput, verb
from api.verbs.rule_schema import TrustedActorsJSON
from routing.sources import SOURCE_TYPES
from routing.trust import GATED_SOURCES

WEBHOOKS_HELP = "webhooks (as their owning endpoint)"
_TRUST_DOC = (
    f"the trust gate ({', '.join(GATED_SOURCES)} webhooks): a delivery whose sender or author it does not trust is"
    ' quarantined before any rule. {"allow_all": true} | {"logins": [...], "match": "sender" | "author" | "both"}'
    ' (forges; logins compare ASCII case-insensitively; match defaults to both) | {"actor_ids": [...]} (cairn);'
    " an empty list trusts no one; null: no gate"
)


class CreateWebhookInput(VerbInput):
    # The enum is advertised, not enforced here: the webhook store refuses an unknown type (invalid_argument)
    # and a reserved one (forbidden_source_type) with their own codes.
    source_type: str = Field(
        min_length=1,
        max_length=32,
        json_schema_extra={"enum": list(SOURCE_TYPES)},
        description="the producer: signed types get a secret; generic trusts its unguessable URL",
    )
    target_queue: str = Field(
        min_length=1, max_length=128, description="the queue deliveries land on by default (within your ceiling)"
    )
    trusted_actors: TrustedActorsJSON | None = Field(default=None, description=_TRUST_DOC)


class CreateWebhookOutput(BaseModel):
    webhook_id: str
    source_type: str
    target_queue: str
    ingest_url: str
    trust_mode: str
    secret: str | None = Field(default=None, description="shown once, for signed source types")
    trusted_actors: dict[str, Any] | None = Field(default=None, description="the trust gate, as stored")


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
    trusted_actors: dict[str, Any] | None = Field(default=None, description="the trust gate; null: none")


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
    cli=CliCommand(
        "webhooks",
        WEBHOOKS_HELP,
        "create",
        "create_webhook: a webhook of yours; prints its ingest URL and (signed types) its secret once",
        (
            CliArg("source_type", choices=SOURCE_TYPES, help="the producer"),
            CliArg("target_queue", "--queue", required=True, help="the queue deliveries land on by default"),
        ),
        # `switchboard send` reads the last two.
        exports=(
            CliExport("webhook_id", "WEBHOOK_ID"),
            CliExport("ingest_url", "SWITCHBOARD_INGEST_URL"),
            CliExport("secret", "SWITCHBOARD_WEBHOOK_SECRET"),
        ),
    ),
)
async def create_webhook(ctx: Context, data: CreateWebhookInput) -> CreateWebhookOutput:
    made: dict[str, Any] = await ctx.services.webhooks.create(
        ctx.caller, data.source_type, data.target_queue, data.trusted_actors
    )
    return CreateWebhookOutput(
        webhook_id=made["webhook_id"],
        source_type=made["source_type"],
        target_queue=made["target_queue"],
        ingest_url=ingest_url(ctx, made["ingest_token"]),
        trust_mode=made["trust_mode"],
        secret=made["secret"],
        trusted_actors=made["trusted_actors"],
    )


@verb(
    "list_webhooks",
    input=ListWebhooksInput,
    output=ListWebhooksOutput,
    family="webhooks",
    summary="This endpoint's webhooks and its ceiling; never secrets.",
    hints=READ,
    cli=CliCommand(
        "webhooks",
        WEBHOOKS_HELP,
        "list",
        "list_webhooks: your endpoint's webhooks (ingest URLs, never secrets) and its ceiling",
        columns=("webhook_id", "source_type", "target_queue", "trust_mode", "rule_count", "created_at", "ingest_url"),
    ),
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
                trusted_actors=w.trusted_actors,
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


class RotateWebhookInput(VerbInput):
    webhook_id: str = Field(max_length=1000, description="one of your webhooks (list_webhooks)")
    new_ingest_token: StrictBool = Field(
        default=False, description="also replace the ingest URL (always replaced for token-trust webhooks)"
    )


class RotateWebhookOutput(BaseModel):
    webhook_id: str
    ingest_url: str
    trust_mode: str
    secret: str | None = Field(default=None, description="the new secret, shown once, for signed source types")


class DeleteWebhookInput(VerbInput):
    webhook_id: str = Field(max_length=1000, description="one of your webhooks (list_webhooks)")


class DeleteWebhookOutput(BaseModel):
    webhook_id: str
    deleted: bool = True


@verb(
    "rotate_webhook",
    input=RotateWebhookInput,
    output=RotateWebhookOutput,
    family="webhooks",
    summary="Mint a new signing secret (shown once; the old one stops verifying at once), optionally a new URL.",
    rate_class="webhook_admin",
    hints=Hints(destructive=True),
    cli=CliCommand(
        "webhooks",
        WEBHOOKS_HELP,
        "rotate",
        "rotate_webhook: a new signing secret, shown once (the old one stops at once)",
        (
            CliArg("webhook_id", help="the webhook (wh_…)"),
            CliArg("new_ingest_token", "--new-url", switch=True, help="also replace the ingest URL"),
        ),
        exports=(
            CliExport("ingest_url", "SWITCHBOARD_INGEST_URL"),
            CliExport("secret", "SWITCHBOARD_WEBHOOK_SECRET"),
        ),
    ),
)
async def rotate_webhook(ctx: Context, data: RotateWebhookInput) -> RotateWebhookOutput:
    made: dict[str, Any] = await ctx.services.webhooks.rotate(
        ctx.caller, data.webhook_id, replace_token=data.new_ingest_token
    )
    return RotateWebhookOutput(
        webhook_id=made["webhook_id"],
        ingest_url=ingest_url(ctx, made["ingest_token"]),
        trust_mode=made["trust_mode"],
        secret=made["secret"],
    )


@verb(
    "delete_webhook",
    input=DeleteWebhookInput,
    output=DeleteWebhookOutput,
    family="webhooks",
    summary="Tear a webhook down: its URL answers 404, its routes go, its ceiling slot frees; a repeat is not_found.",
    rate_class="webhook_admin",
    hints=Hints(destructive=True, idempotent=True),
)
async def delete_webhook(ctx: Context, data: DeleteWebhookInput) -> DeleteWebhookOutput:
    await ctx.services.webhooks.delete(ctx.caller, data.webhook_id)
    return DeleteWebhookOutput(webhook_id=data.webhook_id)


class SetTrustedActorsInput(VerbInput):
    webhook_id: str = Field(min_length=1, max_length=128, description="one of your human's webhooks")
    # Required, so a call that forgets it never removes a gate: null is said on purpose.
    trusted_actors: TrustedActorsJSON | None = Field(description=_TRUST_DOC)


class SetTrustedActorsOutput(BaseModel):
    webhook_id: str
    trusted_actors: dict[str, Any] | None = Field(description="the trust gate as stored; null: none")


@verb(
    "set_webhook_trusted_actors",
    input=SetTrustedActorsInput,
    output=SetTrustedActorsOutput,
    family="webhooks",
    summary="Set (or, with null, remove) a webhook's trust gate; only the webhook's owner may.",
    rate_class="authoring",
    hints=Hints(destructive=True, idempotent=True),
    cli=CliCommand(
        "webhooks",
        WEBHOOKS_HELP,
        "trust",
        "set_webhook_trusted_actors: quarantine deliveries whose sender or author the webhook does not trust",
        (
            CliArg("webhook_id", help="the webhook (wh_…)"),
            CliArg("logins", "--logins", help="trusted forge logins, comma-separated (empty: nobody)"),
            CliArg("match", "--match", choices=("sender", "author", "both"), help="who must be trusted (default both)"),
            CliArg("actor_ids", "--actor-ids", help="trusted cairn actor ids, comma-separated"),
            CliArg("allow_all", "--allow-all", switch=True, help="trust everyone (the gate is open)"),
            CliArg("clear", "--clear", switch=True, help="remove the gate"),
        ),
        complete="trust_flags",
    ),
)
async def set_webhook_trusted_actors(ctx: Context, data: SetTrustedActorsInput) -> SetTrustedActorsOutput:
    stored = await ctx.services.webhooks.set_trusted_actors(ctx.caller, data.webhook_id, data.trusted_actors)
    return SetTrustedActorsOutput(webhook_id=data.webhook_id, trusted_actors=stored)

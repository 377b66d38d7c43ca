"""configure_webhook: a new external source is configuration (kind rule, HMAC, subject path), not code."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, StrictBool

from api.verbs.registry import Context, Hints, VerbInput, verb
from routing.collectors import CollectorConfig


class ConfigureWebhookInput(VerbInput):
    webhook_id: str = Field(max_length=1000, description="one of your webhooks (list_webhooks)")
    collector: CollectorConfig = Field(
        description=(
            "replaces the webhook's collector configuration: hmac {header, format} and kind"
            " {mode: fixed|header|json_path, value, default?} (generic only), subject_path (a dotted path"
            " into the payload that keys coalescing for sources without an issue or cairn subject)"
        )
    )
    rotate_hmac_secret: StrictBool = Field(default=False, description="mint a new HMAC secret even if one exists")


class ConfigureWebhookOutput(BaseModel):
    webhook_id: str
    source_type: str
    collector: dict[str, Any]
    hmac_secret: str | None = Field(
        default=None, description="the collector's HMAC signing secret, shown once when minted"
    )


@verb(
    "configure_webhook",
    input=ConfigureWebhookInput,
    output=ConfigureWebhookOutput,
    family="webhooks",
    summary="Configure a webhook's collector: kind rule, optional HMAC (secret shown once), subject path.",
    rate_class="authoring",
    hints=Hints(destructive=True),
)
async def configure_webhook(ctx: Context, data: ConfigureWebhookInput) -> ConfigureWebhookOutput:
    done = await ctx.services.collectors.configure(
        ctx.caller, data.webhook_id, data.collector, rotate_secret=data.rotate_hmac_secret
    )
    return ConfigureWebhookOutput.model_validate(done)

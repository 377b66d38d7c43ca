"""Route verbs: which endpoints a webhook fans out to, under ownership and friendship (SPEC-0006)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field

from api.verbs.registry import READ, Context, Hints, VerbInput, verb
from store.routes import RouteStore

# Ids are free text up to a bound: a malformed id must meet the same refusal as an unknown one, so the shape
# is not validated here beyond its length.
AnyId = Annotated[str, Field(max_length=1000)]


class RouteInput(VerbInput):
    webhook_id: Annotated[AnyId, Field(description="one of your webhooks (list_webhooks)")]
    target_endpoint_id: Annotated[
        AnyId, Field(description="an endpoint of your human, or of a human who approved your deliveries")
    ]


class RouteChangeOutput(BaseModel):
    webhook_id: str
    target_endpoint_id: str
    implicit: bool = Field(description="the target is the webhook's owning endpoint, always a target")
    changed: bool = Field(description="this call added (or removed) the route; false on a repeat")


class ListRoutesInput(VerbInput):
    webhook_id: Annotated[AnyId, Field(description="one of your webhooks (list_webhooks)")]


class RouteOut(BaseModel):
    endpoint_id: str
    implicit: bool = Field(description="the owning endpoint: listed first, cannot be removed")
    live: bool = Field(description="a delivery now would reach it (endpoint live, friendship still approved)")
    granted_at: datetime | None = None


class ListRoutesOutput(BaseModel):
    webhook_id: str
    routes: list[RouteOut]


def _store(ctx: Context) -> RouteStore:
    return RouteStore(ctx.services.pool)


@verb(
    "add_webhook_route",
    input=RouteInput,
    output=RouteChangeOutput,
    family="webhooks",
    summary="Fan a webhook out to another endpoint of yours or of a human who approved your deliveries.",
    rate_class="authoring",
    hints=Hints(idempotent=True),
)
async def add_webhook_route(ctx: Context, data: RouteInput) -> RouteChangeOutput:
    done = await _store(ctx).add(ctx.caller, data.webhook_id, data.target_endpoint_id)
    return RouteChangeOutput.model_validate(done.model_dump())


@verb(
    "list_webhook_routes",
    input=ListRoutesInput,
    output=ListRoutesOutput,
    family="webhooks",
    summary="A webhook's fan-out set: the owning endpoint first, then every route in target order.",
    hints=READ,
)
async def list_webhook_routes(ctx: Context, data: ListRoutesInput) -> ListRoutesOutput:
    rows = await _store(ctx).list(ctx.caller, data.webhook_id)
    return ListRoutesOutput(webhook_id=data.webhook_id, routes=[RouteOut.model_validate(r.model_dump()) for r in rows])


@verb(
    "remove_webhook_route",
    input=RouteInput,
    output=RouteChangeOutput,
    family="webhooks",
    summary="Stop fanning a webhook out to an endpoint; a no-op for the owner or a route already gone.",
    rate_class="authoring",
    hints=Hints(destructive=True, idempotent=True),
)
async def remove_webhook_route(ctx: Context, data: RouteInput) -> RouteChangeOutput:
    done = await _store(ctx).remove(ctx.caller, data.webhook_id, data.target_endpoint_id)
    return RouteChangeOutput.model_validate(done.model_dump())

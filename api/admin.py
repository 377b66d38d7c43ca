"""Operator verbs over POST /admin/v1/{verb}, guarded by the admin token."""

from __future__ import annotations

import hmac
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from api.deps import Services, services
from api.verbs.registry import VerbInput
from routing.sources import SOURCE_TYPES
from store.errors import InvalidArgument, Unauthenticated


class AdminInput(VerbInput):
    """Admin verb inputs share the agent verbs' input rules (unknown fields, unstorable text)."""


class CreateHumanInput(AdminInput):
    name: str = Field(min_length=1, max_length=200, description="a display name")


class CreateHumanOutput(BaseModel):
    human_id: str


class CreateAgentInput(AdminInput):
    human_id: str = Field(description="the human who owns the agent (hu_…)")
    name: str = Field(min_length=1, max_length=200, description="a display name")


class CreateAgentOutput(BaseModel):
    agent_id: str


class VendEndpointInput(AdminInput):
    agent_id: str = Field(description="the agent the endpoint acts for (ag_…)")
    queues: list[str] = Field(min_length=1, description="the queues the endpoint may see and drain (its scope)")
    verbs: list[str] = Field(min_length=1, description="the verbs (and MCP tools) the endpoint may call")
    webhook_max: int = Field(default=0, ge=0, le=10_000, description="how many webhooks it may create; 0: none")
    # The enum is advertised; the handler refuses unknown or reserved names with its own message.
    webhook_source_types: list[Annotated[str, Field(json_schema_extra={"enum": list(SOURCE_TYPES)})]] = Field(
        default_factory=list, description="source types its webhooks may have"
    )
    webhook_queues: list[str] = Field(default_factory=list, description="queues its webhooks may target")


class VendEndpointOutput(BaseModel):
    endpoint_id: str
    credential: str = Field(description="shown exactly once")
    credential_prefix: str
    agent_id: str
    queues: list[str]
    verbs: list[str]
    webhook_max: int
    webhook_source_types: list[str]
    webhook_queues: list[str]


class RevokeEndpointInput(AdminInput):
    endpoint_id: str = Field(description="the endpoint to revoke (ep_…); its credential stops at once")


class OkOutput(BaseModel):
    ok: bool = True


class FriendEdgeInput(AdminInput):
    from_human_id: str = Field(description="the human whose agents would deliver (hu_…)")
    to_human_id: str = Field(description="the human whose endpoints would receive (hu_…)")
    state: Literal["pending", "approved", "denied", "revoked"] = Field(
        description="approved lets from_human's webhooks route to to_human's endpoints; anything else stops it"
    )


class SetWebhookRateInput(AdminInput):
    webhook_id: str = Field(description="the webhook to pace (wh_…)")
    rate_per_second: float | None = Field(
        ge=0, le=10_000, description="deliveries/s; 0 = unpaced; null = back to SWITCHBOARD_WEBHOOK_RATE_PER_SECOND"
    )


def require_admin(request: Request) -> Services:
    """The admin token must match, compared in constant time."""
    svc = services(request)
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else ""
    expected = svc.settings.admin_token or ""
    if not token or not expected or not hmac.compare_digest(token.encode(), expected.encode()):
        raise Unauthenticated("admin token required")
    return svc


router = APIRouter(prefix="/admin/v1", tags=["admin"])


@router.post("/create_human", response_model=CreateHumanOutput, summary="Create a human.")
async def create_human(body: CreateHumanInput, svc: Services = Depends(require_admin)) -> CreateHumanOutput:
    return CreateHumanOutput(human_id=await svc.identities.create_human(body.name))


@router.post("/create_agent", response_model=CreateAgentOutput, summary="Create an agent owned by a human.")
async def create_agent(body: CreateAgentInput, svc: Services = Depends(require_admin)) -> CreateAgentOutput:
    return CreateAgentOutput(agent_id=await svc.identities.create_agent(body.human_id, body.name))


@router.post(
    "/vend_endpoint",
    response_model=VendEndpointOutput,
    summary="Vend an endpoint; the credential is shown once.",
)
async def vend_endpoint(body: VendEndpointInput, svc: Services = Depends(require_admin)) -> VendEndpointOutput:
    from api.verbs import REGISTRY
    from routing.models import SOURCE_TYPES

    # A typo in a scope would silently vend a useless endpoint: refuse unknown names instead.
    unknown_verbs = sorted(set(body.verbs) - set(REGISTRY))
    if unknown_verbs:
        raise InvalidArgument(f"unknown verbs: {', '.join(unknown_verbs)}")
    unknown_sources = sorted(set(body.webhook_source_types) - set(SOURCE_TYPES))
    if unknown_sources:
        raise InvalidArgument(f"unknown or reserved source types: {', '.join(unknown_sources)}")
    made = await svc.identities.vend_endpoint(
        agent_id=body.agent_id,
        queues=body.queues,
        verbs=body.verbs,
        webhook_max=body.webhook_max,
        webhook_source_types=body.webhook_source_types,
        webhook_queues=body.webhook_queues,
    )
    return VendEndpointOutput.model_validate(made)


@router.post("/revoke_endpoint", response_model=OkOutput, summary="Revoke an endpoint at once.")
async def revoke_endpoint(body: RevokeEndpointInput, svc: Services = Depends(require_admin)) -> OkOutput:
    await svc.identities.revoke_endpoint(body.endpoint_id)
    return OkOutput()


@router.post("/set_friend_edge", response_model=OkOutput, summary="Set the directional friend edge between two humans.")
async def set_friend_edge(body: FriendEdgeInput, svc: Services = Depends(require_admin)) -> OkOutput:
    await svc.identities.set_friend_edge(body.from_human_id, body.to_human_id, body.state)
    return OkOutput()


@router.post(
    "/set_webhook_rate",
    response_model=OkOutput,
    summary="Pace one webhook: deliveries past its rate wait in the inbox and are released at that rate.",
)
async def set_webhook_rate(body: SetWebhookRateInput, svc: Services = Depends(require_admin)) -> OkOutput:
    await svc.webhooks.set_rate(body.webhook_id, body.rate_per_second)
    return OkOutput()

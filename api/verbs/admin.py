"""Operator verbs (`POST /admin/v1/{verb}` behind the admin token) and the `switchboard` commands that call them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from api.verbs.registry import REGISTRY, AdminContext, CliArg, CliCommand, CliExport, VerbInput, admin_verb
from routing.sources import SOURCE_TYPES
from store.errors import InvalidArgument

FRIEND_STATES = ("pending", "approved", "denied", "revoked")


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


LIST_DEFAULT = 50
LIST_MAX = 500


class ListInput(AdminInput):
    limit: int = Field(default=LIST_DEFAULT, ge=1, le=LIST_MAX, description="the most rows on one page")
    cursor: str | None = Field(default=None, max_length=1000, description="next_cursor of the previous page")


class ListHumansInput(ListInput):
    pass


class HumanOut(BaseModel):
    human_id: str
    name: str
    created_at: datetime
    agents: int = Field(description="how many agents the human owns")


class ListHumansOutput(BaseModel):
    humans: list[HumanOut]
    next_cursor: str | None = Field(default=None, description="pass as cursor for the next page; absent at the end")


class ListAgentsInput(ListInput):
    human_id: str | None = Field(default=None, max_length=100, description="only this human's agents (hu_…)")


class AgentOut(BaseModel):
    agent_id: str
    human_id: str
    name: str
    created_at: datetime
    live_endpoints: int


class ListAgentsOutput(BaseModel):
    agents: list[AgentOut]
    next_cursor: str | None = Field(default=None, description="pass as cursor for the next page; absent at the end")


class ListEndpointsInput(ListInput):
    agent_id: str | None = Field(default=None, max_length=100, description="only this agent's endpoints (ag_…)")
    human_id: str | None = Field(default=None, max_length=100, description="only endpoints of this human's agents")
    state: Literal["live", "revoked"] | None = Field(default=None, description="only live or only revoked ones")


class EndpointOut(BaseModel):
    """An endpoint's scope and state; its credential is never shown again, only the prefix that names it."""

    endpoint_id: str
    agent_id: str
    human_id: str
    credential_prefix: str = Field(description="the credential's first 12 characters, as vend_endpoint showed")
    state: Literal["live", "revoked"]
    queues: list[str]
    verbs: list[str]
    webhook_max: int
    webhook_source_types: list[str]
    webhook_queues: list[str]
    webhooks: int = Field(description="how many live webhooks it owns")
    created_at: datetime
    revoked_at: datetime | None


class ListEndpointsOutput(BaseModel):
    endpoints: list[EndpointOut]
    next_cursor: str | None = Field(default=None, description="pass as cursor for the next page; absent at the end")


def _paging(noun: str) -> tuple[CliArg, ...]:
    return (
        CliArg("limit", "--limit", type="int", default=LIST_DEFAULT, help=f"the most {noun} (≤ {LIST_MAX})"),
        CliArg("cursor", "--cursor", help="next_cursor of the previous page"),
    )


@admin_verb(
    "create_human",
    input=CreateHumanInput,
    output=CreateHumanOutput,
    summary="Create a human.",
    cli=CliCommand(
        "human",
        "humans",
        "create",
        "create a human",
        (CliArg("name", "--name", required=True),),
        exports=(CliExport("human_id", "HUMAN_ID"),),
    ),
)
async def create_human(ctx: AdminContext, data: CreateHumanInput) -> CreateHumanOutput:
    return CreateHumanOutput(human_id=await ctx.services.identities.create_human(data.name))


@admin_verb(
    "create_agent",
    input=CreateAgentInput,
    output=CreateAgentOutput,
    summary="Create an agent owned by a human.",
    cli=CliCommand(
        "agent",
        "agents",
        "create",
        "create an agent",
        (CliArg("human_id", "--human", required=True), CliArg("name", "--name", required=True)),
        exports=(CliExport("agent_id", "AGENT_ID"),),
    ),
)
async def create_agent(ctx: AdminContext, data: CreateAgentInput) -> CreateAgentOutput:
    return CreateAgentOutput(agent_id=await ctx.services.identities.create_agent(data.human_id, data.name))


@admin_verb(
    "vend_endpoint",
    input=VendEndpointInput,
    output=VendEndpointOutput,
    summary="Vend an endpoint; the credential is shown once.",
    cli=CliCommand(
        "endpoint",
        "endpoints",
        "vend",
        "vend an endpoint; prints the credential once",
        (
            CliArg("agent_id", "--agent", required=True),
            CliArg("queues", "--queues", required=True, type="csv", help="comma-separated"),
            CliArg("verbs", "--verbs", default="all", help="comma-separated, or 'all'"),
            CliArg("webhook_max", "--webhook-max", type="int", default=5),
            # Every source type docs/architecture.md lists works out of the box; narrow it per endpoint with this flag.
            CliArg(
                "webhook_source_types",
                "--webhook-source-types",
                type="csv",
                default=list(SOURCE_TYPES),
                help="comma-separated; default: all",
            ),
            CliArg("webhook_queues", "--webhook-queues", type="csv", help="default: the endpoint's queues"),
        ),
        complete="vend_defaults",
        # The owner commands (and `switchboard webhooks create`) read SWITCHBOARD_TOKEN.
        exports=(CliExport("endpoint_id", "ENDPOINT_ID"), CliExport("credential", "SWITCHBOARD_TOKEN")),
    ),
)
async def vend_endpoint(ctx: AdminContext, data: VendEndpointInput) -> VendEndpointOutput:
    # A typo in a scope would silently vend a useless endpoint: refuse unknown names instead. Only agent verbs
    # can be in a scope: an admin verb is never callable with an endpoint credential.
    unknown_verbs = sorted(set(data.verbs) - set(REGISTRY))
    if unknown_verbs:
        raise InvalidArgument(f"unknown verbs: {', '.join(unknown_verbs)}")
    unknown_sources = sorted(set(data.webhook_source_types) - set(SOURCE_TYPES))
    if unknown_sources:
        raise InvalidArgument(f"unknown or reserved source types: {', '.join(unknown_sources)}")
    made = await ctx.services.identities.vend_endpoint(
        agent_id=data.agent_id,
        queues=data.queues,
        verbs=data.verbs,
        webhook_max=data.webhook_max,
        webhook_source_types=data.webhook_source_types,
        webhook_queues=data.webhook_queues,
    )
    return VendEndpointOutput.model_validate(made)


@admin_verb(
    "revoke_endpoint",
    input=RevokeEndpointInput,
    output=OkOutput,
    summary="Revoke an endpoint at once.",
    cli=CliCommand("endpoint", "endpoints", "revoke", "revoke an endpoint", (CliArg("endpoint_id"),)),
)
async def revoke_endpoint(ctx: AdminContext, data: RevokeEndpointInput) -> OkOutput:
    await ctx.services.identities.revoke_endpoint(data.endpoint_id)
    # The NOTIFY reaches every process, this one included, a moment after the commit; applying it here first
    # means the revoker's own next call through this process is refused, whatever the listener is doing.
    await ctx.services.doorbell.revoke(data.endpoint_id)
    return OkOutput()


@admin_verb(
    "set_friend_edge",
    input=FriendEdgeInput,
    output=OkOutput,
    summary="Set the directional friend edge between two humans.",
    cli=CliCommand(
        "friend",
        "friend edges",
        "set",
        "set the edge FROM -> TO",
        (
            CliArg("from_human_id"),
            CliArg("to_human_id"),
            CliArg("state", "--state", default="approved", choices=FRIEND_STATES),
        ),
    ),
)
async def set_friend_edge(ctx: AdminContext, data: FriendEdgeInput) -> OkOutput:
    await ctx.services.identities.set_friend_edge(data.from_human_id, data.to_human_id, data.state)
    return OkOutput()


@admin_verb(
    "set_webhook_rate",
    input=SetWebhookRateInput,
    output=OkOutput,
    summary="Pace one webhook: deliveries past its rate wait in the inbox and are released at that rate.",
    cli=CliCommand(
        "webhook",
        "webhooks (operator)",
        "rate",
        "pace a webhook: deliveries past the rate wait in the inbox",
        (
            CliArg("webhook_id"),
            CliArg(
                "rate_per_second",
                type="rate",
                metavar="rate",
                help="deliveries per second; 0 = unpaced; 'default' = the operator default",
            ),
        ),
    ),
)
async def set_webhook_rate(ctx: AdminContext, data: SetWebhookRateInput) -> OkOutput:
    await ctx.services.webhooks.set_rate(data.webhook_id, data.rate_per_second)
    return OkOutput()


@admin_verb(
    "list_humans",
    input=ListHumansInput,
    output=ListHumansOutput,
    summary="Humans, newest first, with how many agents each owns; pages by cursor.",
    cli=CliCommand("human", "humans", "list", "list humans, newest first", _paging("humans")),
)
async def list_humans(ctx: AdminContext, data: ListHumansInput) -> ListHumansOutput:
    page = await ctx.services.identities.list_humans(limit=data.limit, cursor=data.cursor)
    return ListHumansOutput(humans=[HumanOut.model_validate(r) for r in page.rows], next_cursor=page.next_cursor)


@admin_verb(
    "list_agents",
    input=ListAgentsInput,
    output=ListAgentsOutput,
    summary="Agents (of one human, or all), newest first, with their live endpoint counts; pages by cursor.",
    cli=CliCommand(
        "agent",
        "agents",
        "list",
        "list agents, newest first",
        (CliArg("human_id", "--human", help="only this human's (hu_…)"), *_paging("agents")),
    ),
)
async def list_agents(ctx: AdminContext, data: ListAgentsInput) -> ListAgentsOutput:
    page = await ctx.services.identities.list_agents(human_id=data.human_id, limit=data.limit, cursor=data.cursor)
    return ListAgentsOutput(agents=[AgentOut.model_validate(r) for r in page.rows], next_cursor=page.next_cursor)


@admin_verb(
    "list_endpoints",
    input=ListEndpointsInput,
    output=ListEndpointsOutput,
    summary="Endpoints with their scope, state and credential prefix (never the credential), newest first.",
    cli=CliCommand(
        "endpoint",
        "endpoints",
        "list",
        "list endpoints (scope, state, credential prefix), newest first",
        (
            CliArg("agent_id", "--agent", help="only this agent's (ag_…)"),
            CliArg("human_id", "--human", help="only this human's agents' (hu_…)"),
            CliArg("state", "--state", choices=("live", "revoked")),
            *_paging("endpoints"),
        ),
        columns=(
            "endpoint_id",
            "agent_id",
            "human_id",
            "state",
            "credential_prefix",
            "queues",
            "webhooks",
            "created_at",
        ),
    ),
)
async def list_endpoints(ctx: AdminContext, data: ListEndpointsInput) -> ListEndpointsOutput:
    page = await ctx.services.identities.list_endpoints(
        agent_id=data.agent_id, human_id=data.human_id, state=data.state, limit=data.limit, cursor=data.cursor
    )
    return ListEndpointsOutput(
        endpoints=[EndpointOut.model_validate(r) for r in page.rows], next_cursor=page.next_cursor
    )

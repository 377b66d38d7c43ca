"""whoami: the caller's identity and immutable scope."""

from __future__ import annotations

from pydantic import BaseModel

from api.verbs.registry import READ, Context, VerbInput, verb


class WhoamiInput(VerbInput):
    pass


class Ceiling(BaseModel):
    max: int
    allowed_source_types: list[str]
    allowed_queues: list[str]


class WhoamiOutput(BaseModel):
    endpoint_id: str
    agent_id: str
    human_id: str
    queues: list[str]
    verbs: list[str]
    webhook_ceiling: Ceiling


@verb(
    "whoami",
    input=WhoamiInput,
    output=WhoamiOutput,
    family="identity",
    summary="The caller's identity and scope.",
    hints=READ,
)
async def whoami(ctx: Context, data: WhoamiInput) -> WhoamiOutput:
    c = ctx.caller
    return WhoamiOutput(
        endpoint_id=c.endpoint_id,
        agent_id=c.agent_id,
        human_id=c.human_id,
        queues=c.scope_queues,
        verbs=c.scope_verbs,
        webhook_ceiling=Ceiling(
            max=c.webhook_max, allowed_source_types=c.webhook_source_types, allowed_queues=c.webhook_queues
        ),
    )

"""Operator verbs of the model provider registry: OpenAI-compatible providers that LLM triage and the rule
compiler call, their keys sealed at rest and never returned (docs/llm-triage.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from api.verbs.admin import AdminInput, OkOutput
from api.verbs.registry import AdminContext, CliArg, CliCommand, admin_verb

LLM_HELP = "LLM providers (operator) and triage previews (owner)"


class SetLlmProviderInput(AdminInput):
    name: str = Field(min_length=1, max_length=63, description="lowercase letters, digits, '.', '_', '-'")
    base_url: str = Field(
        min_length=1, max_length=2000, description="the OpenAI-compatible API base, e.g. https://api.openai.com/v1"
    )
    api_key: str | None = Field(
        default=None,
        max_length=4000,
        description="sent as the bearer token; omitted on a replace: the stored key stays",
    )
    timeout_seconds: float = Field(default=10.0, gt=0, le=600, description="per-call timeout unless a webhook sets one")
    models: list[str] = Field(
        default_factory=list, description="models owners may choose; empty: any model name is accepted"
    )


class LlmProviderOut(BaseModel):
    """A provider as listed: never its key."""

    name: str
    base_url: str
    timeout_seconds: float
    models: list[str]
    has_api_key: bool
    webhooks: int = Field(description="webhooks whose LLM triage names this provider")


class ListLlmProvidersInput(AdminInput):
    pass


class ListLlmProvidersOutput(BaseModel):
    providers: list[LlmProviderOut]


class DeleteLlmProviderInput(AdminInput):
    name: str = Field(min_length=1, max_length=63, description="the provider to remove")


@admin_verb(
    "set_llm_provider",
    input=SetLlmProviderInput,
    output=LlmProviderOut,
    summary="Register or replace an OpenAI-compatible model provider; its key is sealed and never shown again.",
    cli=CliCommand(
        "llm",
        LLM_HELP,
        "set",
        "register or replace a model provider (OpenAI-compatible Chat Completions)",
        (
            CliArg("name"),
            CliArg("base_url", "--base-url", required=True),
            CliArg("api_key", "--api-key", help="omit to keep the stored key (or for a server without auth)"),
            CliArg("timeout_seconds", "--timeout", type="float", default=10.0),
            CliArg("models", "--models", type="csv", default=[], help="comma-separated; default: any"),
        ),
    ),
)
async def set_llm_provider(ctx: AdminContext, data: SetLlmProviderInput) -> LlmProviderOut:
    info = await ctx.services.llm.set_provider(
        data.name, data.base_url, data.api_key, data.timeout_seconds, data.models
    )
    return LlmProviderOut.model_validate(info.model_dump())


@admin_verb(
    "list_llm_providers",
    input=ListLlmProvidersInput,
    output=ListLlmProvidersOutput,
    summary="Every registered model provider, never a key.",
    cli=CliCommand("llm", LLM_HELP, "list", "list model providers (never their keys)"),
)
async def list_llm_providers(ctx: AdminContext, data: ListLlmProvidersInput) -> ListLlmProvidersOutput:
    providers = await ctx.services.llm.list_providers()
    return ListLlmProvidersOutput(providers=[LlmProviderOut.model_validate(p.model_dump()) for p in providers])


@admin_verb(
    "delete_llm_provider",
    input=DeleteLlmProviderInput,
    output=OkOutput,
    summary="Remove a model provider at once; triage naming it takes the default (llm_error) until reconfigured.",
    cli=CliCommand("llm", LLM_HELP, "delete", "remove a model provider", (CliArg("name"),)),
)
async def delete_llm_provider(ctx: AdminContext, data: DeleteLlmProviderInput) -> OkOutput:
    await ctx.services.llm.delete_provider(data.name)
    return OkOutput()

"""The one verb registry: name, input and output models, family, handler. HTTP, MCP and docs read it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

from api.deps import RateClass, Services
from routing.text import unstorable_field
from store.models import Caller


class VerbInput(BaseModel):
    """Base of every verb input (agent, MCP and admin): unknown fields and unstorable text are refused."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        # NUL and lone surrogates cannot be stored (routing.text): refused before any handler runs, for every
        # surface at once, as invalid_argument naming the field (never echoing the value).
        field = unstorable_field(data)
        if field is not None:
            raise ValueError(f"{field} contains a NUL or a lone surrogate, which cannot be stored")
        return data


@dataclass(frozen=True)
class Context:
    """What a verb handler gets besides its input."""

    caller: Caller
    services: Services


Handler = Callable[[Context, Any], Awaitable[BaseModel]]


@dataclass(frozen=True)
class Verb:
    """One agent verb."""

    name: str
    input: type[BaseModel]
    output: type[BaseModel]
    family: str
    summary: str
    handler: Handler
    rate_class: RateClass = "agent"


REGISTRY: dict[str, Verb] = {}

F = TypeVar("F", bound=Handler)


def verb(
    name: str,
    *,
    input: type[BaseModel],
    output: type[BaseModel],
    family: str,
    summary: str,
    rate_class: RateClass = "agent",
) -> Callable[[F], F]:
    """Register a handler as a verb; adding a verb is this one decorator."""

    def register(fn: F) -> F:
        if name in REGISTRY:
            raise ValueError(f"verb {name} registered twice")
        REGISTRY[name] = Verb(name, input, output, family, summary, fn, rate_class)
        return fn

    return register

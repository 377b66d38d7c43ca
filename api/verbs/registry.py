"""The one verb registry: name, input and output models, family, handler. HTTP, MCP and docs read it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from api.deps import RateClass, Services
from store.models import Caller


class VerbInput(BaseModel):
    """Base of every verb input: unknown fields are refused, so a typo is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid")


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

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
class Hints:
    """How a verb treats switchboard state, advertised as MCP tool annotations.

    read_only: changes nothing. destructive: may remove or irrecoverably replace state (a delete, a remove,
    a rotation, a wholesale replace). idempotent: a repeat with the same arguments changes nothing further
    (the repeat may answer conflict or not_found). Every verb acts only on switchboard's own state, so no
    verb is open-world.
    """

    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False


READ = Hints(read_only=True, idempotent=True)


def default_title(name: str) -> str:
    """A verb's display title from its name: `list_todos` → `List todos`."""
    return name.replace("_", " ").capitalize()


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
    title: str = ""
    hints: Hints = Hints()


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
    title: str | None = None,
    hints: Hints = Hints(),
) -> Callable[[F], F]:
    """Register a handler as a verb; adding a verb is this one decorator (hints: how it treats state)."""

    def register(fn: F) -> F:
        if name in REGISTRY:
            raise ValueError(f"verb {name} registered twice")
        if hints.read_only and hints.destructive:
            raise ValueError(f"verb {name} cannot be both read-only and destructive")
        REGISTRY[name] = Verb(name, input, output, family, summary, fn, rate_class, title or default_title(name), hints)
        return fn

    return register

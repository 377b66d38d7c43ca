"""The one verb table: name, surface, input and output models, family, handler, and an admin verb's CLI command.

Every surface reads it: agent verbs become `POST /v1/{verb}`, MCP tools and endpoint allowlists; admin verbs
become `POST /admin/v1/{verb}` and `switchboard GROUP ACTION` commands; both become OpenAPI operations. A verb
is on exactly one surface, so an admin verb is never a tool and never in an endpoint's scope.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, WithJsonSchema, model_validator

from api.deps import RateClass, Services
from routing.text import unstorable_field
from store.models import Caller

Surface = Literal["agent", "admin"]

AnyJson = Annotated[Any, WithJsonSchema({"type": ["object", "array", "string", "number", "boolean", "null"]})]
"""A field that holds any JSON value by design (a payload, a todo's result): its schema names every JSON type, so
a client can tell it from a field nobody typed."""


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
    """What an agent verb's handler gets besides its input: the calling endpoint and the process's services."""

    caller: Caller
    services: Services


@dataclass(frozen=True)
class AdminContext:
    """What an admin verb's handler gets besides its input (the operator holds the admin token, not a scope)."""

    services: Services


ArgType = Literal["int", "float", "csv", "json_file", "rate", "secret_file"]
"""How a command-line value becomes the input field's value: a number, a comma-separated list, a JSON file (`-`:
standard input), a rate (`default` is null). The command line implements each (cli/commands.py)."""
Completer = Literal["vend_defaults", "spread_config", "reconciler_scope", "trust_flags"]
"""How a command's parsed arguments become the verb's input where its shorthand differs (cli/commands.py)."""


@dataclass(frozen=True)
class CliArg:
    """One command-line argument of a verb's command; it fills the input field of the same name."""

    field: str
    flag: str | None = None
    """`--human` style; None for a positional argument."""
    help: str | None = None
    type: ArgType | None = None
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    switch: bool = False
    """A flag without a value that sets the field true (`--dry-run`)."""


@dataclass(frozen=True)
class CliExport:
    """A value of a command's answer that `--export` prints as `export NAME=value` for the next command."""

    path: str
    """Dotted path into the answer (`todo.id`)."""
    name: str
    """The shell variable; the ones other commands read are theirs (SWITCHBOARD_TOKEN, SWITCHBOARD_INGEST_URL)."""


@dataclass(frozen=True)
class CliCommand:
    """`switchboard GROUP ACTION …`: calls one verb and prints its answer.

    An admin verb is called over /admin/v1 with the admin token; an agent verb over /v1 with the owner's
    endpoint credential (`--token`, else $SWITCHBOARD_TOKEN), an unset optional argument left to the verb's
    default. Commands that compose several verbs (`rules install`, `events reroute`, `tail`) are written in
    cli/main.py. The command line reads these descriptions from cli/commands.json, generated from this table
    (`python -m cli.commands`), so a client command starts without importing the service.
    """

    group: str
    group_help: str
    action: str
    help: str
    args: tuple[CliArg, ...] = ()
    complete: Completer | None = None
    """Turns the parsed arguments into the verb's input where the command's shorthand differs from it."""
    columns: tuple[str, ...] = ()
    """The table columns of the answer's rows on a terminal (cli/output.py); empty: the rows' scalar fields."""
    exports: tuple[CliExport, ...] = ()
    """What `--export` prints for the next command (ids, the credential, the ingest URL and secret)."""


Handler = Callable[[Any, Any], Awaitable[BaseModel]]


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
    """One verb of one surface."""

    name: str
    input: type[BaseModel]
    output: type[BaseModel]
    family: str
    summary: str
    handler: Handler
    rate_class: RateClass = "agent"
    """The per-endpoint bucket an agent verb spends (admin verbs have no endpoint and spend none)."""
    title: str = ""
    hints: Hints = Hints()
    surface: Surface = "agent"
    cli: CliCommand | None = None


VERBS: dict[str, Verb] = {}
"""The table: every verb of every surface, in registration order, in one namespace."""


class SurfaceVerbs(Mapping[str, Verb]):
    """The verbs of one surface: a live, read-only view of the table."""

    def __init__(self, surface: Surface) -> None:
        self.surface = surface

    def __getitem__(self, name: str) -> Verb:
        found = VERBS[name]
        if found.surface != self.surface:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[str]:
        return (name for name, v in VERBS.items() if v.surface == self.surface)

    def __len__(self) -> int:
        return sum(1 for v in VERBS.values() if v.surface == self.surface)


REGISTRY: Mapping[str, Verb] = SurfaceVerbs("agent")
"""Agent verbs: `/v1/{verb}`, MCP tools, the names an endpoint's scope may hold."""
ADMIN_VERBS: Mapping[str, Verb] = SurfaceVerbs("admin")
"""Operator verbs: `/admin/v1/{verb}` behind the admin token, and the CLI's operator commands."""

AgentHandler = TypeVar("AgentHandler", bound=Callable[[Context, Any], Awaitable[BaseModel]])
AdminHandler = TypeVar("AdminHandler", bound=Callable[[AdminContext, Any], Awaitable[BaseModel]])


def _register(entry: Verb) -> None:
    if entry.name in VERBS:
        raise ValueError(f"verb {entry.name} registered twice")
    if entry.hints.read_only and entry.hints.destructive:
        raise ValueError(f"verb {entry.name} cannot be both read-only and destructive")
    VERBS[entry.name] = entry


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
    cli: CliCommand | None = None,
) -> Callable[[AgentHandler], AgentHandler]:
    """Register a handler as an agent verb; adding a verb is this one decorator (hints: how it treats state;
    cli: its `switchboard` command, when it has one)."""

    def register(fn: AgentHandler) -> AgentHandler:
        entry = Verb(name, input, output, family, summary, fn, rate_class, title or default_title(name), hints, cli=cli)
        _register(entry)
        return fn

    return register


def admin_verb(
    name: str,
    *,
    input: type[BaseModel],
    output: type[BaseModel],
    summary: str,
    cli: CliCommand,
) -> Callable[[AdminHandler], AdminHandler]:
    """Register a handler as an admin verb with its CLI command; adding one is this one decorator."""

    def register(fn: AdminHandler) -> AdminHandler:
        _register(Verb(name, input, output, "admin", summary, fn, title=default_title(name), surface="admin", cli=cli))
        return fn

    return register

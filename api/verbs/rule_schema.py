"""JSON schemas of routing rules and actions, for tool and API documentation only.

Rules are validated by routing/rules.py, which answers the routing codes (invalid_rule, not_granted,
invalid_expression, …) naming the offending rule. So the verb inputs keep plain JSON objects for
validation and only borrow these models' JSON schema: a client (or a model) sees the shape, and a
malformed rule still reaches routing/rules.py and gets its routing code, never a generic pydantic refusal.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue

from routing.rules import MAX_ENDPOINTS, MAX_EXPR_BYTES, MAX_ID_CHARS, MAX_NAME_BYTES, MAX_RULES, RULE_ID_RE
from routing.trust import MAX_TRUSTED


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QueueAction(_Schema):
    """Deliver to a queue on the webhook's targets."""

    queue: str = Field(min_length=1, description="a granted queue (the grant lists them)")
    endpoints: (
        Annotated[list[str], Field(min_length=1, max_length=MAX_ENDPOINTS, json_schema_extra={"uniqueItems": True})]
        | None
    ) = Field(default=None, description="narrow delivery to these target endpoint ids; omitted: every live target")
    exclusive: bool = Field(
        default=False, description="deliver to exactly one target: the first whose scope includes the queue"
    )
    once: bool = Field(default=False, description="at most once per delivery subject (issue, artifact) and queue")
    work_order: bool = Field(default=False, description="attach a switchboard-authored work order to each todo")
    coalesce: bool = Field(default=False, description="fold updates about the same subject into its open todo")


class DropAction(_Schema):
    """Store the event and mint nothing."""

    drop: Literal[True] = Field(description="always true")


class QuarantineAction(_Schema):
    """Store the event as quarantined for a person to release or dismiss; mint nothing until released."""

    quarantine: Literal[True] = Field(description="always true")


_ONE_OF = 'exactly one of {"queue": …}, {"drop": true} or {"quarantine": true}'
Action = Annotated[QueueAction | DropAction | QuarantineAction, Field(description=_ONE_OF)]

_ID_DOC = f"1–{MAX_ID_CHARS} characters of [A-Za-z0-9_-], unique in the list"
_NAME_DOC = f"a label for people, at most {MAX_NAME_BYTES} bytes"
_EXPR_DOC = (
    "a jq expression over the delivery envelope ($params bound); it matches when its first output is"
    f" neither false nor null (at most {MAX_EXPR_BYTES} bytes)"
)
_ID_PATTERN = f"^{RULE_ID_RE.pattern}$"


class Rule(_Schema):
    """One routing rule: the first rule whose expression matches decides the action."""

    id: str | None = Field(default=None, pattern=_ID_PATTERN, description=_ID_DOC + "; minted when omitted")
    name: str | None = Field(default=None, description=_NAME_DOC)
    expr: str = Field(description=_EXPR_DOC)
    action: Action


class RulePatch(_Schema):
    """Fields of one rule to replace; the merged rule is validated like any other."""

    id: str | None = Field(default=None, pattern=_ID_PATTERN, description="a new id renames the rule")
    name: str | None = Field(default=None, description=_NAME_DOC + "; null removes it")
    expr: str | None = Field(default=None, description=_EXPR_DOC)
    action: QueueAction | DropAction | QuarantineAction | None = Field(
        default=None, description="the new action: " + _ONE_OF
    )


class SchemaOf:
    """Annotated marker: document a plain JSON value with a model's JSON schema, keeping its validation."""

    def __init__(self, shape: Any) -> None:
        """shape: the type whose JSON schema is shown (a model, a list of one, or an optional one)."""
        from pydantic import TypeAdapter

        self.core = TypeAdapter(shape).core_schema

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """The shape's schema, its models registered in the document's $defs."""
        return handler(self.core)


RulesJSON = Annotated[list[dict[str, Any]], SchemaOf(Annotated[list[Rule], Field(max_length=MAX_RULES)])]
RuleJSON = Annotated[dict[str, Any], SchemaOf(Rule)]
RulePatchJSON = Annotated[dict[str, Any], SchemaOf(RulePatch)]
ActionJSON = Annotated[dict[str, Any], SchemaOf(QueueAction | DropAction | QuarantineAction)]


class AllowAll(_Schema):
    """Trust every sender and author (the gate is open)."""

    allow_all: Literal[True] = Field(description="always true")


class TrustedLogins(_Schema):
    """Trust these forge logins (ASCII case-insensitive); an empty list trusts no one."""

    logins: list[str] = Field(max_length=MAX_TRUSTED, description="forge logins; an empty list trusts no one")
    match: Literal["sender", "author", "both"] = Field(
        default="both",
        description=(
            "sender: who sent the event; author: who wrote the comment or review and the thread it is on (an event"
            " with neither is its sender's); both"
        ),
    )


class TrustedActorIds(_Schema):
    """Trust these cairn actor ids (exactly; never on_behalf_of); an empty list trusts no one."""

    actor_ids: list[str] = Field(max_length=MAX_TRUSTED, description="cairn actor ids; an empty list trusts no one")


# Validated by routing/trust.py (invalid_argument naming what is wrong); the schema documents the shapes.
TrustedActorsJSON = Annotated[dict[str, Any], SchemaOf(AllowAll | TrustedLogins | TrustedActorIds)]

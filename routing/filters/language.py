"""The authoring filter language: what the rule compiler's model fills in, and its deterministic jq.

A model turns an owner's sentence into one of three answers (a tagged union, ``Answer``): a ``filter``
(the event kinds it applies to, a match condition over paths that exist in the webhook's sampled events,
and an action), a ``schedule`` (cron + timezone, for create_schedule) or ``unsupported`` (the sentence
does not compile, with the model's reason). Switchboard, not the model, then writes the jq: ``to_jq`` is
pure and deterministic, quoting every path segment and value as JSON, and ``matches`` is the same
semantics in Python is the tests' oracle (the property tests hold the two together).

Semantics (the same in both):
  * A path is a list of object keys from the envelope's root, written ``.payload.issue["html-url"]``.
    Arrays are crossed implicitly: a step into an array steps into each element that is an object with
    that key, so ``.payload.issue.labels.name`` reaches every label's name.
  * The values at a path are what it reaches, plus the elements of any array it reaches, so ``eq`` on a
    list of strings means "contains".
  * ``eq`` / ``in`` hold when some value equals the given scalar / one of the given scalars (JSON
    equality: ``true`` is not ``1``); ``exists`` when some value is not null. A path that reaches nothing
    holds none of them.
  * ``all`` / ``any`` / ``not`` combine conditions; ``kinds`` (when not empty) requires the envelope's
    ``.kind`` to be one of them.

This module (the language) and its siblings (the compiler to jq, the grounding of the prompt) import only the
standard library and pydantic: the verb (api/verbs/rule_compiler.py) grounds, asks and validates; routing.rules
validates the compiled rule exactly as a save. The same semantics in Python, the oracle the property tests hold the
jq to, is tests/routing/filter_oracle.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

# A JSON number jq and Python agree on exactly (IEEE doubles represent every integer up to 2**53).
SAFE_INT = 2**53
MAX_CONDITIONS = 32
MAX_DEPTH = 6
MAX_VALUES = 32
MAX_KINDS = 16
MAX_PATH_SEGMENTS = 12
MAX_TEXT = 256
MAX_REASON = 500

Path = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1024,
        description='a path from the list given, e.g. .payload.action or .headers["x-github-event"]',
    ),
]
Scalar = Annotated[
    StrictBool
    | Annotated[StrictInt, Field(ge=-SAFE_INT, le=SAFE_INT)]
    | Annotated[StrictStr, Field(max_length=MAX_TEXT)]
    | None,
    Field(description="a JSON string, integer, boolean or null"),
]


class _Node(BaseModel):
    # Every field required and none extra: the schema is strict-mode ready for OpenAI-style providers.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Eq(_Node):
    """Some value at the path equals the scalar."""

    op: Literal["eq"]
    path: Path
    value: Scalar


class In(_Node):
    """Some value at the path is one of the scalars."""

    op: Literal["in"]
    path: Path
    values: list[Scalar] = Field(min_length=1, max_length=MAX_VALUES)


class Exists(_Node):
    """Some value at the path is present and not null."""

    op: Literal["exists"]
    path: Path


class AllOf(_Node):
    """Every condition holds."""

    op: Literal["all"]
    of: list[Condition] = Field(min_length=1, max_length=MAX_CONDITIONS)


class AnyOf(_Node):
    """At least one condition holds."""

    op: Literal["any"]
    of: list[Condition] = Field(min_length=1, max_length=MAX_CONDITIONS)


class Not(_Node):
    """The condition does not hold."""

    op: Literal["not"]
    of: Condition


Condition = Annotated[Eq | In | Exists | AllOf | AnyOf | Not, Field(discriminator="op")]


class QueueTo(_Node):
    """Deliver to a granted queue on the webhook's targets."""

    queue: str = Field(min_length=1, max_length=128, description="one of the granted queues given")


class Drop(_Node):
    """Store the event and mint nothing."""

    drop: Literal[True]


class FilterAnswer(_Node):
    """A routing rule: which events (kinds and a condition) and what happens to them."""

    type: Literal["filter"]
    kinds: list[Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]] = Field(
        max_length=MAX_KINDS, description="event kinds the rule applies to; empty: every kind"
    )
    where: Condition | None = Field(description="the match condition over paths; null: every event of those kinds")
    action: QueueTo | Drop


class ScheduleAnswer(_Node):
    """A time-based trigger: the sentence describes when, not which events."""

    type: Literal["schedule"]
    cron: str = Field(min_length=1, max_length=200, description="five-field cron: minute hour day month weekday")
    timezone: str = Field(min_length=1, max_length=64, description="IANA timezone name, e.g. UTC or Europe/Berlin")


class Unsupported(_Node):
    """The sentence cannot be a deterministic filter or a schedule (say why)."""

    type: Literal["unsupported"]
    reason: str = Field(min_length=1, max_length=MAX_REASON)


Answer = Annotated[FilterAnswer | ScheduleAnswer | Unsupported, Field(discriminator="type")]


class Reply(_Node):
    """The model's whole answer (a wrapper: providers want an object at the top of a response schema)."""

    answer: Answer


for _model in (AllOf, AnyOf, Not, FilterAnswer, Reply):
    _model.model_rebuild()


class FilterError(ValueError):
    """An answer that is not a usable filter: the message says what is wrong, never echoing event data."""


# ---------------------------------------------------------------------------------------------------
# Paths: one canonical text form, parsed and rendered
# ---------------------------------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def render_path(segments: Sequence[str]) -> str:
    """The canonical text of a path: ``.ident`` for plain keys, ``["…"]`` (a JSON string) for any other."""
    return "".join(f".{s}" if _IDENT.fullmatch(s) else f"[{json.dumps(s, ensure_ascii=False)}]" for s in segments)


def parse_path(text: str) -> tuple[str, ...]:
    """The segments of a path written as render_path writes it (a missing leading dot is tolerated)."""
    decoder = json.JSONDecoder()
    if text and text[0] not in ".[":
        text = "." + text
    segments: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith(".[", i):
            i += 1
        if text[i] == ".":
            match = _IDENT.match(text, i + 1)
            if match is None:
                raise FilterError(f'path {json.dumps(text)} is not .key or ["key"] steps')
            segments.append(match.group())
            i = match.end()
        elif text[i] == "[":
            try:
                key, end = decoder.raw_decode(text, i + 1)
            except json.JSONDecodeError as exc:
                raise FilterError(f"path {json.dumps(text)} has a bracket that is not a JSON string") from exc
            if not isinstance(key, str) or end >= len(text) or text[end] != "]":
                raise FilterError(f"path {json.dumps(text)} has a bracket that is not a JSON string")
            segments.append(key)
            i = end + 1
        else:
            raise FilterError(f'path {json.dumps(text)} is not .key or ["key"] steps')
    if not segments:
        raise FilterError("a path names at least one key")
    if len(segments) > MAX_PATH_SEGMENTS:
        raise FilterError(f"path {json.dumps(text)} is longer than {MAX_PATH_SEGMENTS} keys")
    return tuple(segments)


# ---------------------------------------------------------------------------------------------------
# Reading an answer
# ---------------------------------------------------------------------------------------------------


def parse_reply(raw: Any) -> FilterAnswer | ScheduleAnswer | Unsupported:
    """The model's reply validated against the schema; FilterError naming the first problems otherwise."""
    try:
        reply = Reply.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}" for e in exc.errors(include_input=False)[:5]
        )
        raise FilterError(f"the model's answer does not fit the filter schema: {problems}") from exc
    answer = reply.answer
    if isinstance(answer, FilterAnswer) and answer.where is not None:
        nodes = count_nodes(answer.where)
        if nodes > MAX_CONDITIONS:
            raise FilterError(f"the condition has {nodes} parts; the limit is {MAX_CONDITIONS}")
        if depth(answer.where) > MAX_DEPTH:
            raise FilterError(f"the condition nests deeper than {MAX_DEPTH}")
    return answer


def conditions(cond: Condition) -> Iterator[Condition]:
    """Every condition in the tree, the root first."""
    yield cond
    if isinstance(cond, AllOf | AnyOf):
        for sub in cond.of:
            yield from conditions(sub)
    elif isinstance(cond, Not):
        yield from conditions(cond.of)


def count_nodes(cond: Condition) -> int:
    """How many conditions the tree holds."""
    return sum(1 for _ in conditions(cond))


def depth(cond: Condition) -> int:
    """The tree's depth (a leaf is 1)."""
    if isinstance(cond, AllOf | AnyOf):
        return 1 + max(depth(sub) for sub in cond.of)
    if isinstance(cond, Not):
        return 1 + depth(cond.of)
    return 1


def paths_of(answer: FilterAnswer) -> list[str]:
    """The paths the answer's condition names, in order, each once."""
    if answer.where is None:
        return []
    seen: dict[str, None] = {}
    for cond in conditions(answer.where):
        if isinstance(cond, Eq | In | Exists):
            seen[cond.path] = None
    return list(seen)


def ungrounded(answer: FilterAnswer, grounded: set[str]) -> list[str]:
    """The answer's paths that are not in the grounding set (compared in canonical form)."""
    out = []
    for text in paths_of(answer):
        try:
            canonical = render_path(parse_path(text))
        except FilterError:
            canonical = None
        if canonical not in grounded:
            out.append(text)
    return out


def json_equal(a: Any, b: Any) -> bool:
    """jq's equality: booleans are not numbers, numbers compare by value, containers deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b

"""The one verb pipeline: allowlist → rate class → validation → handler → stable error code.

`POST /v1/{verb}`, `POST /admin/v1/{verb}` (api/surface.py) and MCP tool calls (api/mcp.py) all call `dispatch`;
each surface only renders the outcome: an output model, or a `Refusal` (status, code, message, Retry-After).
Authentication happens before: AgentAuthMiddleware resolves the bearer credential to a Caller, the admin
routes check the admin token.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from pydantic import BaseModel, ValidationError

from api.deps import Services
from api.errors import public_error, status_for, validation_message
from api.ratelimit import retry_after
from api.verbs.registry import AdminContext, Context, Verb
from routing.text import JsonTooDeep, loads_bounded, nests_deeper
from store.errors import DomainError
from store.models import Caller

log = logging.getLogger("switchboard.api")


class Refusal(Exception):
    """A verb call that ends in an error answer: a stable code, a client-safe message, the code's HTTP status."""

    def __init__(self, code: str, message: str, *, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        """Whole seconds until the caller's bucket has a token again (rate_limited only)."""
        self.status = status_for(code)
        """The code's HTTP status (api/errors.py)."""


def admit(services: Services, caller: Caller, verb: Verb | None) -> None:
    """The verb must be in the caller's allowlist, and its rate class's bucket must have a token.

    `verb` None is an agent path that is not a verb (the doorbell stream): it spends from the "agent" bucket.
    """
    if verb is not None and verb.name not in caller.scope_verbs:
        raise Refusal("forbidden", f"verb {verb.name} is not in this endpoint's allowlist")
    wait = services.limits_for(verb.rate_class if verb is not None else "agent").take(caller.endpoint_id)
    if wait:
        raise Refusal("rate_limited", "rate limit exceeded", retry_after=retry_after(wait))


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _integer(digits: str) -> int:
    # Python converts at most sys.get_int_max_str_digits() digits; say so rather than how Python says it.
    if len(digits) - digits.startswith("-") > sys.get_int_max_str_digits():
        raise ValueError(f"an integer has more than {sys.get_int_max_str_digits()} digits")
    return int(digits)


def parse_arguments(body: bytes, whole: str) -> Any:
    """A request body as JSON: UTF-8, strict JSON, at most MAX_JSON_DEPTH deep; every refusal a 422 saying why."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal("invalid_argument", f"{whole} is not UTF-8 text (byte {exc.start} of {len(body)})") from None
    try:
        return loads_bounded(text, parse_constant=_not_json, parse_int=_integer)
    except JsonTooDeep as exc:
        raise Refusal("too_deep", f"{whole} is {exc}") from None
    except json.JSONDecodeError as exc:
        raise Refusal(
            "invalid_argument", f"{whole} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:  # an integer of more digits than Python converts, NaN or Infinity
        raise Refusal("invalid_argument", f"{whole} is not JSON this API accepts: {exc}") from None


def decode(verb: Verb, arguments: Any, whole: str) -> BaseModel:
    """The verb's input from its arguments: a JSON request body (bytes) or already-parsed JSON (an MCP call)."""
    if isinstance(arguments, bytes):
        arguments = parse_arguments(arguments, whole)
    elif nests_deeper(arguments):
        raise Refusal("too_deep", f"{whole} is {JsonTooDeep()}")
    try:
        return verb.input.model_validate(arguments)
    except ValidationError as exc:
        raise Refusal("invalid_argument", validation_message(exc.errors(include_input=False), whole)) from None


async def dispatch(verb: Verb, services: Services, caller: Caller | None, arguments: Any, *, whole: str) -> BaseModel:
    """Run one verb call through the whole pipeline; raises Refusal for every answer that is not the output.

    `caller` is the calling endpoint for an agent verb, None for an admin verb (the operator, token checked).
    `whole` names the arguments in messages ("body" over HTTP, "arguments" for MCP).
    """
    ctx: Context | AdminContext
    if verb.surface == "admin":
        if caller is not None:  # never reachable by routing: an admin verb is no agent path and no tool
            raise Refusal("not_found", f"unknown verb {verb.name}")
        ctx = AdminContext(services)
    else:
        if caller is None:
            raise Refusal("unauthenticated", "missing bearer credential")
        admit(services, caller, verb)
        ctx = Context(caller, services)
    data = decode(verb, arguments, whole)
    try:
        return await verb.handler(ctx, data)
    except DomainError as exc:
        # An outage is unavailable, a failure of ours internal (logged there); the rest keep their code.
        raise Refusal(*public_error(exc, f"verb {verb.name}")) from exc
    except Exception as exc:
        log.exception("verb %s failed", verb.name)
        raise Refusal("internal", "internal error") from exc

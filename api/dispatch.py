"""The one verb pipeline: allowlist → rate class → validation → handler → stable error code.

`POST /v1/{verb}`, `POST /admin/v1/{verb}` (api/surface.py) and MCP tool calls (api/mcp.py) all call `dispatch`;
each surface only renders the outcome: an output model, or a `Refusal` (status, code, message, Retry-After).
Authentication happens before: AgentAuthMiddleware resolves the bearer credential to a Caller, the admin
routes check the admin token.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import BaseModel, ValidationError

from api.deps import Services
from api.errors import public_error, status_for, validation_message
from api.ratelimit import retry_after
from api.verbs.registry import AdminContext, Context, Verb
from store.errors import DomainError
from store.models import Caller

log = logging.getLogger("switchboard.api")


class Refusal(Exception):
    """A verb call that ends in an error answer: a stable code, a client-safe message, the code's HTTP status."""

    def __init__(self, code: str, message: str, *, retry_after: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        """Whole seconds until the caller's bucket has a token again (rate_limited only)."""
        self.status = status if status is not None else status_for(code)
        """The code's status (api/errors.py), unless a framework status stands (a body that cannot be read)."""


def admit(services: Services, caller: Caller, verb: Verb | None) -> None:
    """The verb must be in the caller's allowlist, and its rate class's bucket must have a token.

    `verb` None is an agent path that is not a verb (the doorbell stream): it spends from the "agent" bucket.
    """
    if verb is not None and verb.name not in caller.scope_verbs:
        raise Refusal("forbidden", f"verb {verb.name} is not in this endpoint's allowlist")
    wait = services.limits_for(verb.rate_class if verb is not None else "agent").take(caller.endpoint_id)
    if wait:
        raise Refusal("rate_limited", "rate limit exceeded", retry_after=retry_after(wait))


def decode(verb: Verb, arguments: Any, whole: str) -> BaseModel:
    """The verb's input from its arguments: a JSON request body (bytes) or already-parsed JSON (an MCP call)."""
    if isinstance(arguments, bytes):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise Refusal("invalid_argument", f"{exc.pos}: JSON decode error") from None
        except ValueError:  # bytes that are not UTF-8 (nor UTF-16/32): 400, as FastAPI answers them
            raise Refusal("invalid_argument", "There was an error parsing the body", status=400) from None
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

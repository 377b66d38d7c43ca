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
from api.errors import UNAVAILABLE_MESSAGE, status_of, validation_message
from api.ratelimit import retry_after
from api.verbs.registry import AdminContext, Context, Verb
from store.db import UNAVAILABLE_ERRORS
from store.errors import DomainError
from store.models import Caller

log = logging.getLogger("switchboard.api")


class Refusal(Exception):
    """A verb call that ends in an error answer."""

    def __init__(self, status: int, code: str, message: str, *, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        """Whole seconds until the caller's bucket has a token again (rate_limited only)."""


def admit(services: Services, caller: Caller, verb: Verb | None) -> None:
    """The verb must be in the caller's allowlist, and its rate class's bucket must have a token.

    `verb` None is an agent path that is not a verb (the doorbell stream): it spends from the "agent" bucket.
    """
    if verb is not None and verb.name not in caller.scope_verbs:
        raise Refusal(403, "forbidden", f"verb {verb.name} is not in this endpoint's allowlist")
    wait = services.limits_for(verb.rate_class if verb is not None else "agent").take(caller.endpoint_id)
    if wait:
        raise Refusal(429, "rate_limited", "rate limit exceeded", retry_after=retry_after(wait))


def decode(verb: Verb, arguments: Any, whole: str) -> BaseModel:
    """The verb's input from its arguments: a JSON request body (bytes) or already-parsed JSON (an MCP call)."""
    if isinstance(arguments, bytes):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise Refusal(422, "invalid_argument", f"{exc.pos}: JSON decode error") from None
        except ValueError:  # bytes that are not UTF-8 (nor UTF-16/32)
            raise Refusal(400, "invalid_argument", "There was an error parsing the body") from None
    try:
        return verb.input.model_validate(arguments)
    except ValidationError as exc:
        raise Refusal(422, "invalid_argument", validation_message(exc.errors(include_input=False), whole)) from None


async def dispatch(verb: Verb, services: Services, caller: Caller | None, arguments: Any, *, whole: str) -> BaseModel:
    """Run one verb call through the whole pipeline; raises Refusal for every answer that is not the output.

    `caller` is the calling endpoint for an agent verb, None for an admin verb (the operator, token checked).
    `whole` names the arguments in messages ("body" over HTTP, "arguments" for MCP).
    """
    ctx: Context | AdminContext
    if verb.surface == "admin":
        if caller is not None:  # never reachable by routing: an admin verb is no agent path and no tool
            raise Refusal(404, "not_found", f"unknown verb {verb.name}")
        ctx = AdminContext(services)
    else:
        if caller is None:
            raise Refusal(401, "unauthenticated", "missing bearer credential")
        admit(services, caller, verb)
        ctx = Context(caller, services)
    data = decode(verb, arguments, whole)
    try:
        return await verb.handler(ctx, data)
    except DomainError as exc:
        raise Refusal(status_of(exc), exc.code, exc.message) from exc
    except UNAVAILABLE_ERRORS as exc:
        # PostgreSQL down or the pool exhausted past its timeout: a retry later can succeed, so 503, not 500.
        log.warning("database unavailable on verb %s: %s", verb.name, exc)
        raise Refusal(503, "unavailable", UNAVAILABLE_MESSAGE) from exc
    except Exception as exc:
        log.exception("verb %s failed", verb.name)
        raise Refusal(500, "internal", "internal error") from exc

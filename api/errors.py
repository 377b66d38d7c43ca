"""The API's one translation of errors: a stable code's HTTP status and the `{"error": {code, message}}` body.

Domain errors (store/errors.py) carry only a stable code and a client-safe message; which HTTP status a code
answers with is decided here and nowhere else. A new code gets its row in `STATUS`, or it answers 500.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from routing.rules import ERROR_CODES as RULE_ERROR_CODES
from store.errors import DomainError, StoreUnavailable
from switchboard.logs import mask_secrets

log = logging.getLogger("switchboard.api")

STATUS: dict[str, int] = {
    "unauthenticated": 401,
    "forbidden": 403,
    "ceiling_exceeded": 403,
    "forbidden_source_type": 403,
    "not_found": 404,
    "rule_not_found": 404,
    # A verb name no surface has; the message names the nearest ones.
    "unknown_verb": 404,
    # A route called with a method it does not serve; the Allow header lists the ones it does.
    "method_not_allowed": 405,
    # A request head or body not received in time (api/connections.py answers it before the app runs).
    "request_timeout": 408,
    "conflict": 409,
    "too_large": 413,
    # A request head over the header caps (api/connections.py).
    "headers_too_large": 431,
    "invalid_argument": 422,
    # JSON nested deeper than routing.text.MAX_JSON_DEPTH, refused before anything reads it.
    "too_deep": 422,
    # compile_webhook_rule: the model's answer is not a usable rule or schedule (api/verbs/rule_compiler.py).
    "uncompilable": 422,
    # A model provider failed or answered no JSON object / did not answer in time (switchboard/llm.py causes).
    "llm_error": 502,
    "llm_timeout": 504,
    # Save-time rule validation codes, verbatim from routing; not_granted surfaces as forbidden (store/rules.py).
    **{code: 422 for code in RULE_ERROR_CODES if code != "not_granted"},
    "rate_limited": 429,
    "internal": 500,
    "unavailable": 503,
    "sandbox_busy": 503,
}
"""Stable error code → HTTP status, for every code the agent, admin and MCP surfaces answer with."""

# The failure is ours and its message names our schema (a refused statement): the client sees "internal".
_HIDDEN = frozenset({"internal", "store_rejected"})

UNAVAILABLE_MESSAGE = "the database is unavailable, retry later"


def status_for(code: str) -> int:
    """The HTTP status of a stable error code (500 for a code without a row, which is a bug to fix here)."""
    return STATUS.get(code, 500)


class ErrorDetail(BaseModel):
    """What went wrong: a stable code to act on and a message to show."""

    code: str = Field(description="the stable error code (one of STATUS's keys: forbidden, not_found, rate_limited, …)")
    message: str = Field(description="why, for a person; never echoes a submitted value")


class ErrorAnswer(BaseModel):
    """The body of every error answer of the agent and admin verbs: {"error": {"code", "message"}}."""

    error: ErrorDetail


def error_body(code: str, message: str) -> dict[str, Any]:
    """The agent/admin error body: {"error": {"code", "message"}}."""
    return {"error": {"code": code, "message": message}}


# RFC 6750 §3: error_description is limited to printable ASCII without `"` and `\\`.
_DESCRIPTION_CHARS = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}


def bearer_challenge(message: str) -> str:
    """The WWW-Authenticate value of every 401: RFC 6750's `invalid_token` with the message as its description.

    A bare `Bearer` challenge makes MCP clients start an OAuth flow this server does not offer; with the error
    and its description they show why the credential was refused. A missing credential gets the same error (RFC
    6750 would leave it out), for the same reason.
    """
    text = "".join(c if c in _DESCRIPTION_CHARS else "?" for c in message[:300])
    return f'Bearer error="invalid_token", error_description="{text}"'


def error_headers(code: str, message: str, headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers an error answer carries: the given ones, and the bearer challenge on every 401."""
    out = dict(headers or {})
    if status_for(code) == 401:
        out["WWW-Authenticate"] = bearer_challenge(message)
    return out


def error_response(
    code: str, message: str, headers: Mapping[str, str] | None = None, *, status: int | None = None
) -> JSONResponse:
    """The error body with its code's status (or `status`, for a framework status the code does not fix)."""
    return JSONResponse(
        error_body(code, message),
        status_code=status if status is not None else status_for(code),
        headers=error_headers(code, message, headers),
    )


def unknown_verb_message(name: str, names: Collection[str]) -> str:
    """`unknown verb "claim_nxt"; the nearest: claim_next, claim`: what a caller most likely meant."""
    shown = mask_secrets(name[:100]).encode("ascii", "backslashreplace").decode()
    nearest = difflib.get_close_matches(name, list(names), n=3, cutoff=0.5)
    if not nearest:
        return f'unknown verb "{shown}"; /docs lists every verb'
    return f'unknown verb "{shown}"; the nearest: {", ".join(nearest)}'


def public_error(exc: DomainError, where: str = "") -> tuple[str, str]:
    """(code, message) a client may see for a domain error; failures that are ours are logged here, once."""
    if isinstance(exc, StoreUnavailable):
        # PostgreSQL down or the pool exhausted past its timeout: a retry later can succeed, so 503, not 500.
        log.warning("database unavailable on %s: %s", where, exc.message)
        return "unavailable", UNAVAILABLE_MESSAGE
    if exc.code in _HIDDEN or exc.code not in STATUS:
        log.error("unexpected error on %s: %s: %s", where, type(exc).__name__, exc.message, exc_info=exc)
        return "internal", "internal error"
    return exc.code, exc.message


def validation_message(errors: Iterable[Any], whole: str) -> str:
    """The invalid_argument message of a validation failure: field locations and reasons, never the values.

    `whole` names the input itself (an error of the whole input has no field): "body" over HTTP, "arguments" for
    an MCP tool.
    """
    # Never echo the submitted values, which may hold secrets.
    parts = []
    for err in list(errors)[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or whole}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or f"invalid {whole}"


# Framework refusals (unknown route, wrong method, body too large) by status: their stable code.
_CODE_BY_HTTP_STATUS = {
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
}


def install_error_handlers(app: FastAPI, verbs: Mapping[str, Collection[str]]) -> None:
    """Map domain errors, validation errors and stray exceptions to stable codes.

    `verbs` maps each verb surface's path prefix (`/v1/`) to its verb names: an unknown name under it is
    `unknown_verb`, naming the nearest.
    """

    @app.exception_handler(DomainError)
    async def _domain(request: Request, exc: DomainError) -> JSONResponse:
        code, message = public_error(exc, f"{request.method} {mask_secrets(request.url.path)}")
        return error_response(code, message)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response("invalid_argument", validation_message(exc.errors(), "body"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _CODE_BY_HTTP_STATUS.get(exc.status_code, "invalid_argument" if exc.status_code < 500 else "internal")
        message = str(exc.detail)
        path = request.url.path
        if exc.status_code == 404:
            for prefix, names in verbs.items():
                name = path.removeprefix(prefix)
                if name != path and "/" not in name:
                    code, message = "unknown_verb", unknown_verb_message(name, names)
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed here; allowed: {(exc.headers or {}).get('Allow', 'none')}"
        # exc.headers carries what the refusal needs (Allow on a 405).
        return error_response(code, message, exc.headers, status=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The path may carry an ingest token: masked here, and again by the process-wide record factory.
        log.exception("unexpected error on %s %s", request.method, mask_secrets(request.url.path))
        return error_response("internal", "internal error")

"""One translation from domain errors to the stable HTTP error shape."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from store.db import UNAVAILABLE_ERRORS
from store.errors import DomainError
from switchboard.logs import mask_secrets

log = logging.getLogger("switchboard.api")


UNAVAILABLE_MESSAGE = "the database is unavailable, retry later"
UNAVAILABLE_BODY = {"error": {"code": "unavailable", "message": UNAVAILABLE_MESSAGE}}


def status_of(exc: DomainError) -> int:
    """The HTTP status a domain error answers with (every surface reads it here)."""
    return exc.status


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The agent/admin error body: {"error": {"code", "message"}}."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


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


def install_error_handlers(app: FastAPI) -> None:
    """Map domain errors, validation errors and stray exceptions to stable codes."""

    @app.exception_handler(DomainError)
    async def _domain(request: Request, exc: DomainError) -> JSONResponse:
        return error_response(status_of(exc), exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_argument", validation_message(exc.errors(), "body"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {
            401: "unauthenticated",
            403: "forbidden",
            404: "not_found",
            405: "not_found",
            413: "too_large",
        }.get(exc.status_code, "invalid_argument" if exc.status_code < 500 else "internal")
        return error_response(exc.status_code, code, str(exc.detail))

    async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
        # PostgreSQL down or the pool exhausted past its timeout: a retry later can succeed, so 503, not 500.
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(UNAVAILABLE_BODY, status_code=503)

    for unavailable in UNAVAILABLE_ERRORS:
        app.add_exception_handler(unavailable, _unavailable)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The path may carry an ingest token: masked here, and again by the process-wide record factory.
        log.exception("unexpected error on %s %s", request.method, mask_secrets(request.url.path))
        return error_response(500, "internal", "internal error")

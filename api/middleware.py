"""ASGI middleware: request ids and logs, security headers, body caps, agent authentication."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.bodies import read_capped
from api.deps import Services
from api.dispatch import Refusal, admit
from api.errors import error_body, error_headers, public_error, status_for
from api.verbs import REGISTRY
from store.errors import DomainError, Unauthenticated
from switchboard.logs import REQUEST_ID, mask_secrets
from switchboard.request_ids import accepted_request_id

log = logging.getLogger("switchboard.http")

SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"strict-origin-when-cross-origin"),
]
# The interactive docs need scripts and styles from the page itself (an inline start-up script and style), and
# Redoc runs its search index in a worker it makes from a blob; all served by this app (api/docs.py): nothing from
# another origin may load.
DOCS_CSP = (
    b"default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:;"
    b" connect-src 'self'; worker-src 'self' blob:"
)

DOCS_HEADERS = [(name, DOCS_CSP if name == b"content-security-policy" else value) for name, value in SECURITY_HEADERS]
# Headers this middleware sets: any the app set are dropped first, so each appears once.
_REPLACED = frozenset({name for name, _ in SECURITY_HEADERS} | {b"x-request-id"})


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer straight from middleware."""
    raw = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": raw})


async def send_error(send: Send, code: str, message: str, headers: dict[str, str] | None = None) -> None:
    """An error answer straight from middleware: the code's status, its body, and its headers (api/errors.py)."""
    extra = [(k.lower().encode(), v.encode()) for k, v in error_headers(code, message, headers).items()]
    await send_json(send, status_for(code), error_body(code, message), extra)


class RequestLogMiddleware:
    """Adds security headers and a request id to every response and logs one structured line.

    The request id is the caller's X-Request-Id when it passes the check (switchboard/request_ids.py), else a new
    one; it is echoed on the response and bound (``REQUEST_ID``) for the whole request, so every log line the
    request causes carries it, and so does every workflow it starts (a Temporal header) with its activities.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        inbound = None
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                inbound = value.decode("latin-1")
                break
        request_id = accepted_request_id(inbound)
        scope.setdefault("state", {})["request_id"] = request_id
        bound = REQUEST_ID.set(request_id)
        started = time.perf_counter()
        status = 0
        path = scope.get("path", "")
        is_docs = path in ("/docs", "/redoc") or path.startswith(("/docs/", "/redoc/"))

        async def wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() not in _REPLACED]
                headers += DOCS_HEADERS if is_docs else SECURITY_HEADERS
                headers.append((b"x-request-id", request_id.encode()))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            # Paths carry ingest tokens: log only the route family, never the token itself.
            shown = mask_secrets(path)
            try:
                # The request id comes from REQUEST_ID, like every other line of this request.
                log.info(
                    "request",
                    extra={
                        "method": scope.get("method"),
                        "path": shown,
                        "status": status,
                        "ms": round((time.perf_counter() - started) * 1000, 1),
                    },
                )
            finally:
                REQUEST_ID.reset(bound)


class BodyLimitMiddleware:
    """Refuses request bodies over the cap before anything decodes them (agent, admin and MCP routes)."""

    def __init__(
        self, app: ASGIApp, limit: int, prefixes: tuple[str, ...], json_prefixes: tuple[str, ...] = ()
    ) -> None:
        self.app = app
        self.limit = limit
        self.prefixes = prefixes
        self.json_prefixes = json_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        try:
            read = await read_capped(receive, scope.get("headers", []), self.limit)
        except ClientDisconnect:
            return
        if read is None:
            await send_error(send, "too_large", "request body too large", {"Connection": "close"})
            return
        body = read
        if (
            scope.get("method") == "POST"
            and self.json_prefixes
            and scope.get("path", "").startswith(self.json_prefixes)
        ):
            # Verb bodies are always JSON: `curl -d '{}'` (form content type) and an empty body both work.
            if not body.strip():
                body = b"{}"
            headers = [(k, v) for k, v in scope.get("headers", []) if k not in (b"content-type", b"content-length")]
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            scope = dict(scope, headers=headers)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class AgentAuthMiddleware:
    """Resolves the bearer credential of agent routes (/v1/, /mcp) before any body is parsed."""

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...] = ("/v1/", "/mcp")) -> None:
        self.app = app
        self.prefixes = prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        services = scope["app"].state.services
        assert isinstance(services, Services)
        token = ""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                raw = value.decode("latin-1")
                if raw[:7].lower() == "bearer ":
                    token = raw[7:].strip()
        if not token:
            await send_error(send, "unauthenticated", "missing bearer credential")
            return
        try:
            caller = await services.credentials.authenticate(token)
        except Unauthenticated as exc:
            await send_error(send, exc.code, exc.message)
            return
        except DomainError as exc:
            await send_error(send, *public_error(exc, "authenticate"))
            return
        if path.startswith("/v1/") and path[len("/v1/") :] not in REGISTRY:
            # Verbs are admitted (allowlist, rate class) by the dispatch they share with MCP; any other agent path
            # (the doorbell stream, an unknown name) spends from the "agent" bucket here, at the door.
            try:
                admit(services, caller, None)
            except Refusal as refusal:
                headers = {"Retry-After": refusal.retry_after} if refusal.retry_after else None
                await send_error(send, refusal.code, refusal.message, headers)
                return
        scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)

"""MCP at /mcp (Streamable HTTP, official SDK): the verb registry as tools, the doorbell as channel notifications.

Authentication happens before this app runs: AgentAuthMiddleware resolves the bearer credential of every
/mcp request (401 otherwise) and puts the Caller into the ASGI scope, so a revoked credential loses its
session on its next request. Each session is bound to the endpoint that opened it (the SDK refuses a
session id presented by another endpoint). A tool call runs through the same pipeline as `POST /v1/{verb}`
(api/dispatch.py: allowlist, rate class, validation, handler, error code).

Sessions are stateful: when a session opens its standalone GET stream, that stream becomes one of the
endpoint's doorbell subscribers, and rings reach it as `notifications/claude/channel`. Revoking the endpoint
terminates its sessions in every API process (the doorbell hub calls `revoke`), closing their open streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from api.deps import Services, services
from api.dispatch import Refusal, dispatch
from api.doorbell import StreamClosed
from api.errors import public_error, unknown_verb_message
from api.mcp_channel import standalone_connection
from api.middleware import send_error
from api.verbs import REGISTRY
from store.errors import DomainError
from store.models import Caller

log = logging.getLogger("switchboard.mcp")

CHANNEL_CAPABILITY = "claude/channel"
CHANNEL_METHOD = "notifications/claude/channel"
INSTRUCTIONS = (
    "Switchboard turns webhook deliveries into todos. Drain your queues with claim_next (or list_todos + claim), "
    "then complete or fail each todo you hold; heartbeat long work. New todos ring this session as "
    f"{CHANNEL_METHOD} notifications: claim the todo they name."
)

Lifespan = dict[str, Any]
ToolContext = ServerRequestContext[Lifespan, Any]


def _error(code: str, message: str, **extra: Any) -> types.CallToolResult:
    body = {"error": {"code": code, "message": message, **extra}}
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(body))], structured_content=body, is_error=True
    )


def _tool(name: str) -> types.Tool:
    verb = REGISTRY[name]
    hints = verb.hints
    return types.Tool(
        name=name,
        title=verb.title,
        description=verb.summary,
        input_schema=verb.input.model_json_schema(),
        output_schema=verb.output.model_json_schema(mode="serialization"),
        # Every hint is stated, never left to the protocol's defaults (which assume a destructive, open-world tool).
        annotations=types.ToolAnnotations(
            title=verb.title,
            read_only_hint=hints.read_only,
            destructive_hint=hints.destructive,
            idempotent_hint=hints.idempotent,
            open_world_hint=False,
        ),
    )


class _SwitchboardServer(Server[Lifespan]):
    """The lowlevel server, advertising the claude/channel capability next to tools."""

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        experimental = {**(experimental_capabilities or {}), CHANNEL_CAPABILITY: {}}
        return super().get_capabilities(
            notification_options, experimental, extensions, protocol_version=protocol_version
        )


@dataclass
class _Session:
    endpoint_id: str
    connection: Connection


def _owner(endpoint_id: str) -> AuthenticatedUser:
    """The SDK's user for an endpoint: a session answers only to the one that opened it."""
    return AuthenticatedUser(AccessToken(token=endpoint_id, client_id=endpoint_id, scopes=[]))


def _caller(ctx: ToolContext) -> Caller:
    request = ctx.request
    caller = request.scope.get("state", {}).get("caller") if isinstance(request, Request) else None
    if not isinstance(caller, Caller):
        raise DomainError("missing bearer credential", code="unauthenticated")
    return caller


def _services(ctx: ToolContext) -> Services:
    request = ctx.request
    assert isinstance(request, Request)
    return services(request)


class McpSurface:
    """The /mcp ASGI app, its session manager and the sessions' doorbell pumps."""

    def __init__(self, *, body_max: int) -> None:
        self.server = _SwitchboardServer(
            "switchboard",
            version="0.1.0",
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.server.add_notification_handler("notifications/initialized", types.NotificationParams, self._initialized)
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            # Bearer credentials, not cookies, carry authority here, so DNS-rebinding checks add nothing;
            # the public host name is deployment-specific.
            security_settings=None,
            max_request_body_size=body_max,
        )
        self.sessions: dict[str, _Session] = {}
        self._tools = {name: _tool(name) for name in REGISTRY}

    # -- MCP handlers ---------------------------------------------------------------------------------

    async def _list_tools(self, ctx: ToolContext, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        caller = _caller(ctx)
        return types.ListToolsResult(tools=[t for name, t in self._tools.items() if name in caller.scope_verbs])

    async def _call_tool(self, ctx: ToolContext, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            caller = _caller(ctx)
        except DomainError as exc:
            return _error(*public_error(exc, "mcp"))
        verb = REGISTRY.get(params.name)
        if verb is None:
            return _error("unknown_verb", unknown_verb_message(params.name, self._tools))
        try:
            result = await dispatch(verb, _services(ctx), caller, params.arguments or {}, whole="arguments")
        except Refusal as refusal:
            if refusal.retry_after is not None:
                # A tool result has no headers: the wait is in the message and in a field of the error.
                after = int(refusal.retry_after)
                return _error(refusal.code, f"{refusal.message}; retry after {after}s", retry_after=after)
            return _error(refusal.code, refusal.message)
        out = result.model_dump(mode="json")
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(out))], structured_content=out)

    async def _initialized(self, ctx: ToolContext, params: types.NotificationParams) -> None:
        request = ctx.request
        if not isinstance(request, Request):
            return
        session_id = request.headers.get(MCP_SESSION_ID_HEADER)
        caller = request.scope.get("state", {}).get("caller")
        # The session's standalone channel: the one place a notification outside any request can go.
        connection = standalone_connection(ctx.session)
        if not session_id or not isinstance(caller, Caller) or connection is None:
            log.warning("mcp session without a doorbell channel")
            return
        self.sessions[session_id] = _Session(caller.endpoint_id, connection)
        connection.exit_stack.callback(self.sessions.pop, session_id, None)

    # -- ASGI -------------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        caller = scope.get("state", {}).get("caller")
        if not isinstance(caller, Caller):  # AgentAuthMiddleware answers first; this is a second lock
            await send_error(send, "unauthenticated", "missing bearer credential")
            return
        # Binds each session to the endpoint that opened it: the SDK answers 404 to anyone else.
        scope["user"] = _owner(caller.endpoint_id)
        session_id = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"mcp-session-id"), None)
        if scope.get("method") == "GET" and session_id:
            await self._serve_listening(scope, receive, send, caller, session_id)
            return
        await self.manager.handle_request(scope, receive, send)

    async def _serve_listening(
        self, scope: Scope, receive: Receive, send: Send, caller: Caller, session_id: str
    ) -> None:
        """Serve a session's standalone GET stream; while it is open it is one of the endpoint's subscribers."""
        opened = asyncio.Event()

        async def watch(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.start" and message["status"] == 200:
                opened.set()

        pump = asyncio.create_task(self._pump(scope, caller, session_id, opened), name="mcp-doorbell-pump")
        try:
            await self.manager.handle_request(scope, receive, watch)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    async def _pump(self, scope: Scope, caller: Caller, session_id: str, opened: asyncio.Event) -> None:
        await opened.wait()
        # The client opens its GET stream right after `notifications/initialized`, which the session may
        # not have processed yet: wait (bounded) for the session's channel.
        for _ in range(200):
            session = self.sessions.get(session_id)
            if session is not None:
                break
            await asyncio.sleep(0.025)
        else:
            return
        if session.endpoint_id != caller.endpoint_id:
            return
        hub = scope["app"].state.services.doorbell
        with hub.subscription(caller.endpoint_id, caller.scope_queues, "mcp") as sub:
            while session_id in self.sessions:
                try:
                    ring = await sub.next()
                except StreamClosed:  # revoked: the hub's revoke ends the session itself
                    return
                if ring is not None:
                    await session.connection.notify(CHANNEL_METHOD, ring.channel())

    # -- revocation (a doorbell Watcher) -------------------------------------------------------------

    def endpoints(self) -> set[str]:
        """Endpoints with an open MCP session in this process."""
        return {s.endpoint_id for s in self.sessions.values()}

    async def revoke(self, endpoint_id: str) -> None:
        """End every MCP session of a revoked endpoint: its streams close and its session id answers 404."""
        for session_id in [k for k, s in self.sessions.items() if s.endpoint_id == endpoint_id]:
            self.sessions.pop(session_id, None)
            await self._end(session_id, endpoint_id)

    async def _end(self, session_id: str, endpoint_id: str) -> None:
        """End one session as its client would: a DELETE from its owner, through the manager's own entry point.

        The SDK terminates the session's transport, which closes its open streams, and forgets its id (404 from
        then on).
        """
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "DELETE",
            "scheme": "http",
            "path": "/mcp",
            "raw_path": b"/mcp",
            "root_path": "",
            "query_string": b"",
            "headers": [(MCP_SESSION_ID_HEADER.encode("latin-1"), session_id.encode("latin-1"))],
            "client": None,
            "server": None,
            "user": _owner(endpoint_id),
        }

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] not in (200, 404):
                log.warning("ending mcp session answered %s", message["status"])

        await self.manager.handle_request(scope, receive, send)

    def install(self, app: Starlette) -> None:
        """Route /mcp (GET stream, POST messages, DELETE session) to this app."""
        app.router.routes.append(
            Route("/mcp", endpoint=self, methods=["GET", "POST", "DELETE"], include_in_schema=False)
        )

    # -- lifecycle --------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the session manager for the life of the block.

        The manager's task group lives in a task of its own, so the block may be entered and left from
        different tasks (the app lifespan under test harnesses is).
        """
        started, stop = asyncio.Event(), asyncio.Event()

        async def run() -> None:
            async with self.manager.run():
                started.set()
                await stop.wait()

        task = asyncio.create_task(run(), name="mcp-session-manager")
        waiter = asyncio.create_task(started.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            await task  # raises what stopped it
        try:
            yield
        finally:
            stop.set()
            await task

"""The HTTP surfaces of the verb table: `POST /v1/{verb}` for agent verbs, `POST /admin/v1/{verb}` for admin verbs.

Each route hands the raw JSON body to `api.dispatch.dispatch`, the pipeline MCP tool calls share, and renders its
outcome. FastAPI must not parse the body itself: it would validate it before the allowlist and the rate limit
run, so a forbidden or throttled call would be told about its arguments first. The OpenAPI document still shows
each verb's input model: it is generated from a documented twin of every route, a route with the same path,
summary and models whose body is the verb's input (never served).
"""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from api.deps import CallerDep, Services, ServicesDep, require_admin
from api.dispatch import Refusal, dispatch
from api.errors import error_response
from api.verbs import ADMIN_VERBS, REGISTRY, Verb
from store.models import Caller

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "unauthenticated"},
    403: {"description": "forbidden (verb or queue outside the scope, ceiling codes)"},
    404: {"description": "not_found"},
    409: {"description": "conflict"},
    413: {"description": "body too large"},
    422: {"description": "invalid_argument or a routing validation code"},
    429: {"description": "rate_limited, with Retry-After"},
}
ADMIN_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "unauthenticated (the admin token is missing or wrong)"},
    404: {"description": "not_found"},
    409: {"description": "conflict"},
    413: {"description": "body too large"},
    422: {"description": "invalid_argument"},
}


def refusal_response(refusal: Refusal) -> JSONResponse:
    """The error answer of a refused verb call: {"error": {"code", "message"}}, Retry-After when rate limited."""
    headers = {"Retry-After": refusal.retry_after} if refusal.retry_after is not None else None
    return error_response(refusal.code, refusal.message, headers, status=refusal.status)


def _output(result: BaseModel) -> Response:
    # The handler already built the verb's output model: serialize it once instead of letting FastAPI validate it
    # a second time against a response_model (this is the hot path of every claim).
    return Response(result.__pydantic_serializer__.to_json(result), media_type="application/json")


async def serve_agent_verb(
    v: Verb, services: Services, caller: Caller, scope: Scope, receive: Receive, send: Send
) -> None:
    """`POST /v1/{verb}` answered as pure ASGI, called by AgentAuthMiddleware once the caller is known.

    The same pipeline and the same answers as the FastAPI route below (which stays routed for any path this does
    not take), without the router, the dependency solver and the Request object: those cost more CPU than the
    claim statement itself on the agent hot path (bench/claims.py --profile). The body was read and capped by
    BodyLimitMiddleware, which replays it as one message.
    """
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away before the body was whole
            return
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    try:
        response = _output(await dispatch(v, services, caller, body, whole="body"))
    except Refusal as refusal:
        response = refusal_response(refusal)
    await response(scope, receive, send)


def _agent_endpoint(v: Verb) -> Any:
    async def endpoint(request: Request, caller: CallerDep, svc: ServicesDep) -> Response:
        try:
            return _output(await dispatch(v, svc, caller, await request.body(), whole="body"))
        except Refusal as refusal:
            return refusal_response(refusal)

    endpoint.__name__ = v.name
    return endpoint


def _admin_endpoint(v: Verb) -> Any:
    async def endpoint(request: Request, svc: ServicesDep) -> Response:
        try:
            return _output(await dispatch(v, svc, None, await request.body(), whole="body"))
        except Refusal as refusal:
            return refusal_response(refusal)

    endpoint.__name__ = v.name
    return endpoint


def _documented(v: Verb, path: str, **options: Any) -> APIRoute:
    """The route as OpenAPI should show it: its body is the verb's input model."""

    async def endpoint(body: BaseModel) -> Response:  # never served
        raise NotImplementedError

    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=v.input)],
        return_annotation=Response,
    )
    endpoint.__name__ = v.name
    return APIRoute(path, endpoint, **options)


def install_verb_routes(app: FastAPI) -> None:
    """Route every verb of the table, and document each with its models."""
    twins: dict[int, APIRoute] = {}

    def add(v: Verb, prefix: str, endpoint: Any, errors: dict[int | str, dict[str, Any]], **options: Any) -> None:
        path = f"{prefix}/{v.name}"
        app.router.add_api_route(
            path, endpoint, methods=["POST"], response_model=None, include_in_schema=False, **options
        )
        twins[id(app.router.routes[-1])] = _documented(
            v,
            path,
            methods=["POST"],
            response_model=None,
            responses={200: {"model": v.output, "description": "the verb's output"}, **errors},
            summary=v.summary,
            tags=[v.family],
            operation_id=v.name,
            openapi_extra={"security": [{"bearer": []}]},
        )

    for v in REGISTRY.values():
        add(v, "/v1", _agent_endpoint(v), ERROR_RESPONSES)
    for v in ADMIN_VERBS.values():
        add(v, "/admin/v1", _admin_endpoint(v), ADMIN_ERROR_RESPONSES, dependencies=[Depends(require_admin)])

    def openapi() -> dict[str, Any]:
        if not app.openapi_schema:
            app.openapi_schema = get_openapi(
                title=app.title,
                version=app.version,
                openapi_version=app.openapi_version,
                summary=app.summary,
                description=app.description,
                routes=[twins.get(id(route), route) for route in app.routes],
                tags=app.openapi_tags,
                servers=app.servers,
                separate_input_output_schemas=app.separate_input_output_schemas,
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

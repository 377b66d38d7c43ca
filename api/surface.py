"""The HTTP surfaces of the verb table: one route per verb, `POST /v1/{verb}` (agent) and `POST /admin/v1/{verb}` (admin).

Each route reads the raw body and hands it to `api.dispatch.dispatch`, the pipeline MCP tool calls share, and renders
its outcome. FastAPI must not parse the body itself: it would validate it before the allowlist and the rate limit
run, so a forbidden or throttled call would be told about its arguments first. So the route declares its body to
OpenAPI with `openapi_extra` (the verb's input schema), as FastAPI documents for a body the endpoint reads itself,
and its answers with `responses` (the verb's output model, the error body).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel

from api.deps import ENDPOINT_SCHEME, require_admin, services
from api.dispatch import Refusal, dispatch
from api.errors import ErrorAnswer, error_response
from api.verbs import ADMIN_VERBS, REGISTRY, Verb

Endpoint = Callable[[Request], Coroutine[Any, Any, Response]]


ERROR_BODY = {"application/json": {"schema": {"$ref": f"#/components/schemas/{ErrorAnswer.__name__}"}}}


def _errors(described: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    # The model once (500), a reference for the rest: FastAPI builds a validator for every model it is given.
    errors: dict[int | str, dict[str, Any]] = {500: {"model": ErrorAnswer, "description": "internal"}}
    errors.update({status: {"description": text, "content": ERROR_BODY} for status, text in described.items()})
    return errors


ERROR_RESPONSES = _errors(
    {
        401: "unauthenticated (no endpoint credential, or a revoked one)",
        403: "forbidden (verb or queue outside the scope, ceiling codes)",
        404: "not_found",
        409: "conflict",
        413: "too_large (the body is over SWITCHBOARD_AGENT_BODY_MAX)",
        422: "invalid_argument, too_deep or a routing validation code",
        429: "rate_limited, with Retry-After",
        503: "unavailable (PostgreSQL), sandbox_busy",
    }
)
ADMIN_ERROR_RESPONSES = _errors(
    {
        401: "unauthenticated (the admin token is missing or wrong)",
        404: "not_found",
        409: "conflict",
        413: "too_large (the body is over SWITCHBOARD_AGENT_BODY_MAX)",
        422: "invalid_argument or too_deep",
        503: "unavailable (PostgreSQL)",
    }
)


def refusal_response(refusal: Refusal) -> JSONResponse:
    """The error answer of a refused verb call: {"error": {"code", "message"}}, Retry-After when rate limited."""
    headers = {"Retry-After": refusal.retry_after} if refusal.retry_after is not None else None
    return error_response(refusal.code, refusal.message, headers, status=refusal.status)


async def _answer(v: Verb, request: Request, caller: Any) -> Response:
    try:
        result = await dispatch(v, services(request), caller, await request.body(), whole="body")
    except Refusal as refusal:
        return refusal_response(refusal)
    # The handler built the verb's output model: serialized once, not validated again against a response_model.
    return Response(result.__pydantic_serializer__.to_json(result), media_type="application/json")


def _agent_endpoint(v: Verb) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        # The endpoint AgentAuthMiddleware resolved the bearer credential to (dispatch refuses a call without one).
        return await _answer(v, request, getattr(request.state, "caller", None))

    endpoint.__name__ = v.name
    return endpoint


def _admin_endpoint(v: Verb) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        return await _answer(v, request, None)

    endpoint.__name__ = v.name
    return endpoint


class VerbRoute(APIRoute):
    """An agent verb's route: FastAPI documents it like any other; its request handler is the endpoint itself.

    The endpoint takes the Request and reads the raw body, so FastAPI's own handler would only solve dependencies
    that do not exist (and parse the query string and cookies for them) on every call of the claim loop.
    """

    def get_route_handler(self) -> Endpoint:
        """The endpoint, called with the Request (a verb route declares no parameters and no dependencies)."""
        d = self.dependant
        if d.dependencies or d.body_params or d.path_params or d.query_params or d.header_params or d.cookie_params:
            raise TypeError(f"{self.path}: a verb route takes the Request alone")
        return self.endpoint


@functools.cache  # the same for every app this process builds (the tests build many)
def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """A verb's OpenAPI request body: its input's JSON Schema with every `$defs` reference inlined.

    The body is read raw, so FastAPI puts no input model in the document's components; a `#/$defs/…` reference
    inside an operation would point at the document's root, so the schema is made self-contained.
    """
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any, within: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [inline(item, within) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if ref is None:
            return {key: inline(value, within) for key, value in node.items()}
        name = ref.removeprefix("#/$defs/")
        if name in within:
            raise ValueError(f"{model.__name__}: {name} refers to itself; its schema cannot be inlined")
        siblings = {key: inline(value, within) for key, value in node.items() if key != "$ref"}
        return {**inline(defs[name], within | {name}), **siblings}

    return {"required": True, "content": {"application/json": {"schema": inline(schema, frozenset())}}}


def install_verb_routes(app: FastAPI) -> dict[str, APIRoute]:
    """Route every verb of the table, each documented with its input, its output and its errors; the agent verbs'
    routes by path (for api/fastpath.py)."""
    agent: dict[str, APIRoute] = {}

    def add(v: Verb, prefix: str, endpoint: Endpoint, errors: dict[int | str, dict[str, Any]], **options: Any) -> None:
        extra = options.pop("openapi_extra", {})
        app.router.add_api_route(
            f"{prefix}/{v.name}",
            endpoint,
            methods=["POST"],
            response_model=None,
            responses={200: {"model": v.output, "description": "the verb's output"}, **errors},
            summary=v.summary,
            tags=[v.family],
            operation_id=v.name,
            openapi_extra={"requestBody": request_body(v.input), **extra},
            **options,
        )

    for v in REGISTRY.values():
        # AgentAuthMiddleware resolves the endpoint credential before the route runs: its scheme is declared here.
        add(
            v,
            "/v1",
            _agent_endpoint(v),
            ERROR_RESPONSES,
            route_class_override=VerbRoute,
            openapi_extra={"security": [{ENDPOINT_SCHEME: []}]},
        )
        route = app.router.routes[-1]
        assert isinstance(route, APIRoute)
        agent[route.path] = route
    for v in ADMIN_VERBS.values():
        add(v, "/admin/v1", _admin_endpoint(v), ADMIN_ERROR_RESPONSES, dependencies=[Depends(require_admin)])
    return agent

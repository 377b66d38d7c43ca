"""The agent HTTP surface: one POST /v1/{verb} operation per registered verb."""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from api.deps import services
from api.verbs import REGISTRY, Verb
from api.verbs.registry import Context
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


def _endpoint_for(v: Verb) -> Any:
    async def endpoint(request: Request, body: BaseModel) -> Response:
        caller = request.state.caller
        assert isinstance(caller, Caller)
        result = await v.handler(Context(caller=caller, services=services(request)), body)
        # The handler already built the verb's output model: serialize it once instead of letting FastAPI
        # validate it a second time against response_model (this is the hot path of every claim).
        return Response(result.__pydantic_serializer__.to_json(result), media_type="application/json")

    # FastAPI reads the signature to build validation and OpenAPI; give it the verb's concrete models.
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
            inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=v.input),
        ],
        return_annotation=Response,
    )
    endpoint.__name__ = v.name
    return endpoint


def agent_router() -> APIRouter:
    """Routes for every verb in the registry."""
    router = APIRouter(prefix="/v1")
    for v in REGISTRY.values():
        router.add_api_route(
            f"/{v.name}",
            _endpoint_for(v),
            methods=["POST"],
            response_model=None,
            responses={200: {"model": v.output, "description": "the verb's output"}, **ERROR_RESPONSES},
            summary=v.summary,
            tags=[v.family],
            operation_id=v.name,
            openapi_extra={"security": [{"bearer": []}]},
        )
    return router

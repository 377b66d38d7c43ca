"""The agent verbs' fast path, kept for the claim loop's speed: `POST /v1/{verb}` goes straight to the verb's route.

Each verb is one FastAPI route (api/surface.py), documented by FastAPI itself, and that route is the only code that
serves it. This middleware only finds the route by its path instead of letting the router try every route in turn,
and so also passes by the exception and exit-stack layers FastAPI wraps around its router, which a verb's route
does not use: `dispatch` turns every failure into an answer, and anything unexpected still reaches the app's
handler for `Exception`. A path it does not know (another method, a root path) takes the usual way, to the same
route. What it saves is in bench/README.md ("Verb fast path").
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send


class VerbFastPath:
    """Hands `POST /v1/{verb}` to the verb's own route; runs inside AgentAuthMiddleware, once the caller is known."""

    def __init__(self, app: ASGIApp, routes: Mapping[str, BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is not None:
            match, child = route.matches(scope)
            if match == Match.FULL:
                scope.update(child)  # what the router would set: the route, its endpoint, its path parameters
                await route.handle(scope, receive, send)
                return
        await self.app(scope, receive, send)

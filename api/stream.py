"""GET /v1/stream: the doorbell as server-sent events.

The stream is not a verb: the verb allowlist does not gate it (AgentAuthMiddleware only checks names
in the registry, and "stream" must never become one). It needs a live bearer credential, and it only
ever announces todos of the caller's own endpoint in the queues its scope grants — information the
caller may already pull. A verb named "stream" would shadow this route, so registering one fails here.
Revoking the endpoint ends the response (api/doorbell.py), in whichever API process holds it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter
from sse_starlette import EventSourceResponse, ServerSentEvent

from api.deps import CallerDep, DoorbellDep
from api.doorbell import StreamClosed
from api.verbs import VERBS

if "stream" in VERBS:  # pragma: no cover - a programming error caught at import
    raise RuntimeError("a verb named 'stream' would shadow GET /v1/stream")

HEARTBEAT_SECONDS = 15.0
"""Seconds between heartbeat comments, so proxies keep the stream open and clients notice a dead one."""

router = APIRouter(prefix="/v1", tags=["doorbell"])


@router.get(
    "/stream",
    summary="New-todo doorbell as server-sent events (`event: todo`), heartbeat comments every 15 s.",
    response_class=EventSourceResponse,
    openapi_extra={"security": [{"bearer": []}]},
)
async def stream(caller: CallerDep, hub: DoorbellDep) -> EventSourceResponse:
    """New-todo doorbell as server-sent events (`event: todo`), heartbeat comments every 15 s."""
    heartbeat = HEARTBEAT_SECONDS

    async def events() -> AsyncIterator[ServerSentEvent]:
        with hub.subscription(caller.endpoint_id, caller.scope_queues, "sse") as sub:
            # Tells the client it is subscribed: rings committed from here on reach this stream.
            yield ServerSentEvent(comment="subscribed")
            while True:
                try:
                    ring = await sub.next(heartbeat)
                except StreamClosed:  # the endpoint was revoked: end the response
                    return
                if ring is None:
                    yield ServerSentEvent(comment="heartbeat")
                    continue
                yield ServerSentEvent(event="todo", id=ring.todo_id, data=json.dumps(ring.event()))

    return EventSourceResponse(events(), ping=0, headers={"Cache-Control": "no-store"})

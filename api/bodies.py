"""Reading request bodies under a cap, with a readable 413 for clients that send everything before reading.

A client such as Python's urllib writes the whole body before it reads the answer. If we answer 413 and close
while its bytes are still arriving, the kernel resets the connection and the client sees a reset instead of our
413. So an oversized body is drained (read and discarded) up to a bounded amount and for a bounded time before
the 413 goes out with `Connection: close`: a few MiB of bandwidth per refusal at most, never unbounded work.
A body declared larger than the drain budget is refused at once (draining it could not help).
"""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect
from starlette.types import Receive

DRAIN_FACTOR = 4  # drain up to this many times the cap…
DRAIN_EXTRA_MAX = 16 * 1024 * 1024  # …but never more than this beyond it
DRAIN_SECONDS = 3.0


def drain_budget(cap: int) -> int:
    """How many body bytes in all we read before refusing an oversized body."""
    return min(DRAIN_FACTOR * cap, cap + DRAIN_EXTRA_MAX)


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length header as a number, or None when absent or not a number."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def _drain(receive: Receive, budget: int) -> None:
    drained = 0
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            while drained <= budget:
                message = await receive()
                if message["type"] != "http.request":
                    return
                drained += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
    except TimeoutError:
        return


async def read_capped(receive: Receive, headers: list[tuple[bytes, bytes]], cap: int) -> bytes | None:
    """The whole body, or None when it is over cap (after a bounded drain); ClientDisconnect if the client left."""
    budget = drain_budget(cap)
    declared = declared_length(headers)
    if declared is not None and declared > cap:
        if declared <= budget:
            await _drain(receive, budget)
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        more = message.get("more_body", False)
        if size > cap:
            if more:
                await _drain(receive, budget - size)
            return None
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)

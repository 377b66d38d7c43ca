"""The new-todo doorbell: one LISTEN connection per API process relays commits to open agent streams.

The commit `pg_notify`s `switchboard_todos` once per newly created todo. This process listens on one
dedicated connection and hands each ring to ONE open stream (SSE or MCP) of the todo's endpoint whose
scope covers the todo's queue, round-robin. A ring is advisory: a full buffer drops it, a stream that is
not open misses it, and the todo stays pending for pull either way. Rings carry ids, queue, kind, source
and title — never a payload or a secret.

The LISTEN connection is the one psycopg use outside `store/`: it is a transport, not a query.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from store.deliveries import DOORBELL_CHANNEL

log = logging.getLogger("switchboard.doorbell")

BUFFER = 16
"""Rings a stream may hold before further rings to it are dropped."""


@dataclass(frozen=True)
class Ring:
    """One newly created todo, as the commit announced it."""

    todo_id: str
    endpoint_id: str
    queue: str
    kind: str | None
    source: str
    title: str

    @classmethod
    def parse(cls, payload: str) -> Ring | None:
        """The ring in a notification payload; None when it is not one."""
        try:
            raw = json.loads(payload)
            return cls(
                todo_id=str(raw["todo_id"]),
                endpoint_id=str(raw["endpoint_id"]),
                queue=str(raw["queue"]),
                kind=None if raw.get("kind") is None else str(raw["kind"]),
                source=str(raw.get("source") or ""),
                title=str(raw.get("title") or ""),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def event(self) -> dict[str, Any]:
        """The SSE `todo` event data."""
        return {
            "todo_id": self.todo_id,
            "queue": self.queue,
            "kind": self.kind,
            "source": self.source,
            "title": self.title,
        }

    def channel(self) -> dict[str, Any]:
        """The params of MCP `notifications/claude/channel`."""
        return {
            "content": f'switchboard: todo {self.todo_id} ready on queue "{self.queue}" — {self.title}',
            # Claude Code renders meta as tag attributes: string values only.
            "meta": {"todo_id": self.todo_id, "queue": self.queue, "kind": self.kind or "", "source": self.source},
        }


@dataclass(eq=False)
class Subscriber:
    """One open stream of one endpoint, with the queues its scope grants and a bounded buffer."""

    endpoint_id: str
    queues: frozenset[str]
    transport: str
    buffer: asyncio.Queue[Ring] = field(default_factory=lambda: asyncio.Queue(maxsize=BUFFER))
    delivered: int = 0
    dropped: int = 0


@dataclass
class DoorbellHub:
    """Open streams per endpoint; picks one per ring by round-robin and never blocks the caller."""

    subscribers: dict[str, list[Subscriber]] = field(default_factory=dict)
    cursors: dict[str, int] = field(default_factory=dict)
    rung: int = 0
    dropped: int = 0
    unheard: int = 0

    @contextlib.contextmanager
    def subscription(self, endpoint_id: str, queues: list[str], transport: str) -> Iterator[Subscriber]:
        """Register a stream for the life of the block."""
        sub = Subscriber(endpoint_id, frozenset(queues), transport)
        self.subscribers.setdefault(endpoint_id, []).append(sub)
        try:
            yield sub
        finally:
            subs = self.subscribers.get(endpoint_id, [])
            with contextlib.suppress(ValueError):
                subs.remove(sub)
            if not subs:
                self.subscribers.pop(endpoint_id, None)
                self.cursors.pop(endpoint_id, None)

    def listeners(self, endpoint_id: str, transport: str | None = None) -> int:
        """How many streams of the endpoint are open (of one transport, if given)."""
        return sum(1 for s in self.subscribers.get(endpoint_id, []) if transport in (None, s.transport))

    def ring(self, ring: Ring) -> Subscriber | None:
        """Hand the ring to one eligible stream; None when nobody heard it (no stream, or its buffer was full)."""
        eligible = [s for s in self.subscribers.get(ring.endpoint_id, []) if ring.queue in s.queues]
        if not eligible:
            self.unheard += 1
            return None
        turn = self.cursors.get(ring.endpoint_id, 0)
        self.cursors[ring.endpoint_id] = turn + 1
        sub = eligible[turn % len(eligible)]
        try:
            sub.buffer.put_nowait(ring)
        except asyncio.QueueFull:
            sub.dropped += 1
            self.dropped += 1
            return None
        sub.delivered += 1
        self.rung += 1
        return sub


class DoorbellListener:
    """The process's one LISTEN connection; reconnects with backoff and stops cleanly."""

    def __init__(self, database_url: str, hub: DoorbellHub, *, max_backoff: float = 10.0) -> None:
        self.database_url = database_url
        self.hub = hub
        self.max_backoff = max_backoff
        self.listening = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, wait: float = 5.0) -> None:
        """Start listening; wait (bounded) for the first LISTEN so rings right after startup are heard."""
        self._task = asyncio.create_task(self._run(), name="doorbell-listener")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.listening.wait(), wait)

    async def stop(self) -> None:
        """Cancel the listener and wait for its connection to close."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.database_url, autocommit=True, connect_timeout=10
                ) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(DOORBELL_CHANNEL)))
                    self.listening.set()
                    backoff = 0.2
                    async for note in conn.notifies():
                        ring = Ring.parse(note.payload)
                        if ring is not None:
                            self.hub.ring(ring)
            except Exception as exc:  # the relay must outlive any failure; cancellation still stops it
                self.listening.clear()
                # Rings committed while disconnected are lost; their todos stay pending for pull.
                log.warning("doorbell connection lost (%s); reconnecting in %.1fs", type(exc).__name__, backoff)
            await asyncio.sleep(backoff)
            backoff = min(self.max_backoff, backoff * 2)


@contextlib.asynccontextmanager
async def run_doorbell(database_url: str, hub: DoorbellHub) -> AsyncIterator[DoorbellListener]:
    """Listen for the life of the block (the app lifespan)."""
    listener = DoorbellListener(database_url, hub)
    await listener.start()
    try:
        yield listener
    finally:
        await listener.stop()

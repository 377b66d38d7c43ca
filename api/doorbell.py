"""The new-todo doorbell: one LISTEN connection per API process relays commits to open agent streams.

The commit `pg_notify`s `switchboard_todos` once per newly created todo, with ids only (todo and endpoint).
Every API process listens on one dedicated connection. A process that holds an open stream (SSE or MCP) of
the todo's endpoint whose scope covers the todo's queue claims the ring in the database
(`UPDATE todos SET rung_at = now() WHERE rung_at IS NULL …`, store/doorbell.py); only the one process whose
claim wins rings, and it hands the ring to ONE of its eligible streams, round-robin. So a todo rings exactly
one session across all processes; processes with no eligible stream never touch the row.

A ring is advisory: a full buffer (16) drops it and never blocks; a dropped ring is given back
(`rung_at` cleared) so a later catch-up may ring it; the todo stays pending for pull either way.

The LISTEN connection cannot go deaf: libpq TCP keepalives, plus a round trip every `check_seconds`: a
NOTIFY sent through the pool on a channel only this process listens to must come back on the LISTEN
connection in time, or the connection is dropped and reopened (backoff up to 10 s). After a reconnect the
listener catches up from the database: pending, unrung todos of its streams' endpoints created since it
was last known to hear (minus a margin) ring now, once, through the same claim.

Revoking an endpoint NOTIFYs `switchboard_revoked`; every process closes that endpoint's SSE streams and
MCP sessions at once. The same round trip re-checks the endpoints with open streams here, so a revoke
missed while reconnecting still closes them within one check.

The LISTEN connection itself is opened and read through `store.doorbell.Listener`, like every other use of
PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from store.commits import DOORBELL_CHANNEL
from store.doorbell import REVOKED_CHANNEL, DoorbellStore, Listener, Note, RingRow
from switchboard import tasks
from switchboard.metrics import DOORBELL_DROPS, DOORBELL_RINGS, bounded

log = logging.getLogger("switchboard.doorbell")

BUFFER = 16
"""Rings a stream may hold before further rings to it are dropped."""

CHECK_SECONDS = 2.0
"""Liveness round trip period: a LISTEN connection that misses one is replaced (so deafness lasts < 2 periods)."""

CATCH_UP_MARGIN = timedelta(seconds=60)
"""How far before the last proven-alive moment a catch-up looks: covers commits that started earlier."""

CATCH_UP_LIMIT = 500
"""Most todos one catch-up rings per endpoint; the rest stay pending for pull."""


@dataclass(frozen=True)
class Notice:
    """One doorbell notification: the ids of a newly created todo."""

    todo_id: str
    endpoint_id: str

    @classmethod
    def parse(cls, payload: str) -> Notice | None:
        """The notice in a notification payload; None when it is not one."""
        try:
            raw = json.loads(payload)
            return cls(todo_id=str(raw["todo_id"]), endpoint_id=str(raw["endpoint_id"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Ring:
    """One newly created todo, as the todos table shows it."""

    todo_id: str
    endpoint_id: str
    queue: str
    kind: str | None
    source: str
    title: str

    @classmethod
    def of(cls, row: RingRow) -> Ring:
        """The ring of a claimed row."""
        return cls(row.todo_id, row.endpoint_id, row.queue, row.kind, row.source, row.title)

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


class StreamClosed(Exception):
    """The stream's endpoint was revoked: the stream must end."""


@dataclass(eq=False)
class Subscriber:
    """One open stream of one endpoint, with the queues its scope grants and a bounded buffer."""

    endpoint_id: str
    queues: frozenset[str]
    transport: str
    buffer: asyncio.Queue[Ring] = field(default_factory=lambda: asyncio.Queue(maxsize=BUFFER))
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    delivered: int = 0
    dropped: int = 0

    async def next(self, within: float | None = None) -> Ring | None:
        """The next ring; None after `within` seconds without one; StreamClosed once the endpoint is revoked."""
        if self.closed.is_set():
            raise StreamClosed
        if not self.buffer.empty():
            return self.buffer.get_nowait()
        get = asyncio.ensure_future(self.buffer.get())
        close = asyncio.ensure_future(self.closed.wait())
        try:
            done, _ = await asyncio.wait((get, close), timeout=within, return_when=asyncio.FIRST_COMPLETED)
        finally:
            close.cancel()
            if not get.done():
                get.cancel()
        if get in done:
            return get.result()
        if close in done:
            raise StreamClosed
        return None


class Watcher(Protocol):
    """Something else holding an endpoint's credential open (MCP sessions): closed on revoke."""

    def endpoints(self) -> set[str]:
        """Endpoints it holds open now."""
        ...

    async def revoke(self, endpoint_id: str) -> None:
        """Close everything it holds open for the endpoint."""
        ...


@dataclass
class DoorbellHub:
    """Open streams per endpoint; picks one per ring by round-robin and never blocks the caller."""

    subscribers: dict[str, list[Subscriber]] = field(default_factory=dict)
    cursors: dict[str, int] = field(default_factory=dict)
    watchers: list[Watcher] = field(default_factory=list)
    caches: list[Watcher] = field(default_factory=list)
    """What remembers an endpoint's credential (api/credentials.py): told of every revocation, closes nothing."""
    revocations: int = 0
    """Revocations this process has applied (NOTIFY, liveness check or a revoke made here), for the caches."""
    rung: int = 0
    dropped: int = 0
    unheard: int = 0
    """Notifications this process did not ring: no eligible stream here, or another process (or a claim) won."""
    revoked: int = 0

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

    def endpoints(self) -> set[str]:
        """Endpoints with anything open in this process (streams, MCP sessions)."""
        out = set(self.subscribers)
        for watcher in (*self.watchers, *self.caches):
            out |= watcher.endpoints()
        return out

    def queues(self, endpoint_id: str) -> list[str]:
        """The queues the endpoint's open streams here may be rung for."""
        return sorted({q for s in self.subscribers.get(endpoint_id, []) for q in s.queues})

    def offer(self, ring: Ring) -> Subscriber | None:
        """Hand a claimed ring to one eligible stream; None when nobody took it (no stream, or its buffer was full)."""
        eligible = [s for s in self.subscribers.get(ring.endpoint_id, []) if ring.queue in s.queues]
        if not eligible:
            return None
        turn = self.cursors.get(ring.endpoint_id, 0)
        self.cursors[ring.endpoint_id] = turn + 1
        sub = eligible[turn % len(eligible)]
        try:
            sub.buffer.put_nowait(ring)
        except asyncio.QueueFull:
            sub.dropped += 1
            self.dropped += 1
            DOORBELL_DROPS.labels(transport=bounded(sub.transport)).inc()
            return None
        sub.delivered += 1
        self.rung += 1
        DOORBELL_RINGS.labels(transport=bounded(sub.transport)).inc()
        return sub

    async def ring(self, store: DoorbellStore, todo_id: str, endpoint_id: str) -> Subscriber | None:
        """Ring one of this process's streams for a new todo if this process wins the todo's one ring."""
        queues = self.queues(endpoint_id)
        if not queues:  # no stream of the endpoint here: leave the ring to the processes that have one
            self.unheard += 1
            return None
        row = await store.claim(todo_id, endpoint_id, queues)
        if row is None:
            self.unheard += 1
            return None
        sub = self.offer(Ring.of(row))
        if sub is None:
            # Nobody here took it (a full buffer, or the stream closed meanwhile): give the ring back so a
            # catch-up may ring it; the todo stays pending for pull either way.
            await store.unclaim(todo_id)
        return sub

    async def revoke(self, endpoint_id: str) -> None:
        """Close every stream and session of a revoked endpoint in this process, and forget its credential."""
        self.revocations += 1
        for cache in self.caches:
            await cache.revoke(endpoint_id)
        subs = list(self.subscribers.get(endpoint_id, []))
        for sub in subs:
            sub.closed.set()
        closed = len(subs)
        for watcher in self.watchers:
            if endpoint_id in watcher.endpoints():
                closed += 1
                await watcher.revoke(endpoint_id)
        if closed:
            self.revoked += 1
            log.info("endpoint %s revoked: closing its %d open stream(s)/session(s) here", endpoint_id, closed)


class Deaf(Exception):
    """The LISTEN connection did not hear its own liveness round trip in time."""


class DoorbellListener:
    """The process's one LISTEN connection: liveness checks, reconnect with backoff, catch-up, clean stop."""

    def __init__(
        self,
        database_url: str,
        hub: DoorbellHub,
        store: DoorbellStore,
        *,
        check_seconds: float = CHECK_SECONDS,
        max_backoff: float = 10.0,
    ) -> None:
        self.database_url = database_url
        self.hub = hub
        self.store = store
        self.check_seconds = check_seconds
        self.max_backoff = max_backoff
        self.listening = asyncio.Event()
        # A channel only this process listens to, for its own liveness round trips.
        self.ping_channel = f"switchboard_ping_{secrets.token_hex(8)}"
        self.alive_at: datetime | None = None
        """The server's clock at the last moment this listener was proven to hear (None before the first)."""
        self._heard_at = 0.0  # the same moment on this process's monotonic clock
        self.connects = 0
        self.caught_up = 0
        self._owed: datetime | None = None  # rings may have been missed since then: a catch-up is owed
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
        await tasks.stop(task)

    async def _run(self) -> None:
        backoff = 0.2
        failing = False
        while True:
            try:
                async with asyncio.timeout(15):
                    conn = await Listener.connect(self.database_url)
            except Exception as exc:  # the relay must outlive any failure; cancellation still stops it
                if not failing:
                    log.warning("doorbell cannot connect (%s); retrying with backoff", _reason(exc))
                failing = True
            else:
                failing = False
                try:
                    await self._serve(conn)
                except Exception as exc:
                    log.warning("doorbell connection lost (%s); reconnecting", _reason(exc))
                    backoff = 0.2 if self.listening.is_set() else backoff
                finally:
                    self.listening.clear()
                    if self.alive_at is not None:
                        self._owe(self.alive_at)
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(2):
                            await conn.close()
            await asyncio.sleep(backoff)
            backoff = min(self.max_backoff, backoff * 2)

    async def _serve(self, conn: Listener) -> None:
        """LISTEN, catch up on any gap, then relay notifications while proving the connection alive."""
        async with asyncio.timeout(self.check_seconds * 2 + 5):
            await conn.listen(self.ping_channel)
        await self._round_trip(conn)  # heard from here on: what committed before is the catch-up's
        self.connects += 1
        self.listening.set()
        if self._owed is None:
            log.info("doorbell listening")
        else:
            log.info("doorbell listening again; caught up %d unrung todo(s)", await self._settle())
        while True:
            await self._round_trip(conn)
            if self._owed is not None:
                await self._settle()

    def _owe(self, since: datetime) -> None:
        self._owed = since if self._owed is None else min(since, self._owed)

    async def _settle(self) -> int:
        """Run the owed catch-up; it stays owed if this fails."""
        assert self._owed is not None
        found = await self.catch_up(self._owed - CATCH_UP_MARGIN)
        self._owed = None
        return found

    async def _round_trip(self, conn: Listener) -> None:
        """Send a ping through the pool and relay notifications until it comes back; Deaf if it does not in time."""
        token = secrets.token_hex(8)
        started = time.monotonic()
        async with asyncio.timeout(self.check_seconds * 2):
            check = await self.store.ping(self.ping_channel, token, sorted(self.hub.endpoints()))
        for endpoint_id in check.revoked:
            await self.hub.revoke(endpoint_id)
        heard = False
        first = not self.listening.is_set()
        while True:
            left = (self.check_seconds if heard else self.check_seconds * 1.5) - (time.monotonic() - started)
            if left <= 0 or (heard and first):  # the first round trip only has to prove the connection
                break
            # aclosing: leaving the loop early must release the connection's lock and keep its backlog.
            async with contextlib.aclosing(conn.notifies(left)) as notes:
                async for note in notes:
                    if note.channel == self.ping_channel:
                        if not heard and note.payload == token:
                            heard = True
                            self._heard_at = started  # everything committed before the ping has reached us
                        if heard and first:
                            break
                    else:
                        await self._relay(note, check.now)
        if not heard:
            raise Deaf(f"no liveness round trip within {self.check_seconds * 1.5:.1f}s")
        # Heard: everything committed before the ping was sent has been delivered to this connection.
        self.alive_at = check.now

    def hearing(self) -> int | None:
        """The number of the LISTEN connection if it is proven to hear revocations now, else None.

        Listening, and its last liveness round trip was sent within two check periods (a deaf connection is
        replaced within that anyway, but a credential cache must not wait for that to be found out).
        """
        if not self.listening.is_set() or time.monotonic() - self._heard_at > self.check_seconds * 2:
            return None
        return self.connects

    async def _relay(self, note: Note, now: datetime) -> None:
        try:
            if note.channel == REVOKED_CHANNEL:
                await self.hub.revoke(note.payload)
            elif note.channel == DOORBELL_CHANNEL and (notice := Notice.parse(note.payload)) is not None:
                await self.hub.ring(self.store, notice.todo_id, notice.endpoint_id)
        except Exception as exc:  # a failed claim must not silence the listener; the next check repairs it
            log.warning("doorbell ring failed (%s); will catch up", _reason(exc))
            self._owe(self.alive_at or now)

    async def catch_up(self, since: datetime) -> int:
        """Ring what this process's streams missed: pending, unrung todos of their endpoints since `since`."""
        found = 0
        for endpoint_id in list(self.hub.subscribers):
            queues = self.hub.queues(endpoint_id)
            if not queues:
                continue
            for todo_id in await self.store.missed(endpoint_id, queues, since, CATCH_UP_LIMIT):
                if await self.hub.ring(self.store, todo_id, endpoint_id) is not None:
                    found += 1
        self.caught_up += found
        return found


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@contextlib.asynccontextmanager
async def run_doorbell(database_url: str, hub: DoorbellHub, store: DoorbellStore) -> AsyncIterator[DoorbellListener]:
    """Listen for the life of the block (the app lifespan)."""
    listener = DoorbellListener(database_url, hub, store)
    await listener.start()
    try:
        yield listener
    finally:
        await listener.stop()

"""The doorbell cannot go deaf: dead and half-open LISTEN connections, catch-up, several API processes, revoke."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from temporalio.testing import WorkflowEnvironment

from api.doorbell import BUFFER, DoorbellListener
from store.doorbell import DoorbellStore
from tests.api.test_doorbell import POLL, github_hook, hub_of, ingest, mcp_of, sse
from tests.conftest import Stack, running_stack, serving
from tests.helpers import eventually, issue_payload, post_github


def ring_ids(events: list[tuple[float, str, dict[str, Any]]]) -> list[str]:
    return [data["todo_id"] for _, event, data in events if event == "todo"]


class PgProxy:
    """A TCP front for the embedded PostgreSQL's unix socket that can turn into a black hole.

    `blackhole()` makes every open connection swallow bytes both ways while its socket stays open (a half-open
    peer, as after a NAT or firewall forgets the flow) and refuses new connections; `restore()` forwards new
    connections again.
    """

    def __init__(self, database_url: str) -> None:
        params = conninfo_to_dict(database_url)
        self.socket_path = f"{params['host']}/.s.PGSQL.{params.get('port') or 5432}"
        self.database_url = database_url
        self.holed_before = 0  # connections accepted before this count swallow everything
        self.refusing = False
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return make_conninfo(self.database_url, host="127.0.0.1", port=str(port))

    async def __aenter__(self) -> PgProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def blackhole(self) -> None:
        self.holed_before = self.accepted
        self.refusing = True

    def restore(self) -> None:
        self.refusing = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.close()
            return
        self.accepted += 1
        number = self.accepted
        up_reader, up_writer = await asyncio.open_unix_connection(self.socket_path)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    if number > self.holed_before:  # a black-holed connection never forwards again
                        dst.write(data)
                        await dst.drain()

        for task in (
            asyncio.create_task(pipe(reader, up_writer)),
            asyncio.create_task(pipe(up_reader, writer)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


@contextlib.asynccontextmanager
async def proxied_listener(stack: Stack, proxy: PgProxy, check_seconds: float) -> AsyncIterator[DoorbellListener]:
    """Swap the app's own listener for one that reaches PostgreSQL through `proxy` (same hub, same pool)."""
    await stack.app.state.doorbell.stop()
    listener = DoorbellListener(
        proxy.url, hub_of(stack), DoorbellStore(stack.app.state.services.pool), check_seconds=check_seconds
    )
    await listener.start(wait=10)
    assert listener.listening.is_set()
    try:
        yield listener
    finally:
        await listener.stop()


async def test_listener_terminated_by_the_server_reconnects_and_rings_what_committed_meanwhile(
    live_stack: Stack,
) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    listen = "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' AND datname = current_database()"
    async with sse(live_stack.base_url, agent.credential) as listener:
        [(old_pid,)] = live_stack.sql(listen)
        live_stack.sql("SELECT pg_terminate_backend(%s)", old_pid)
        # Committed right away, while the listener is (or is about to be) reconnecting: it still rings, once.
        _, todo_id = await ingest(live_stack, hook, number=1)
        await eventually(lambda: ring_ids(listener.events) == [todo_id], timeout=20, interval=POLL)
        await eventually(lambda: len(live_stack.sql(listen)) == 1, timeout=20, interval=POLL)
        [(new_pid,)] = live_stack.sql(listen)
        assert new_pid != old_pid
        # And it keeps ringing afterwards.
        _, later = await ingest(live_stack, hook, number=2)
        await eventually(lambda: ring_ids(listener.events) == [todo_id, later], timeout=10, interval=POLL)
        await asyncio.sleep(0.5)
        assert ring_ids(listener.events) == [todo_id, later]  # nothing rang twice


async def test_half_open_listen_connection_is_noticed_and_missed_todos_ring_once_after_reconnect(
    live_stack: Stack, caplog: Any
) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    check = 0.5
    async with (
        PgProxy(live_stack.database_url) as proxy,
        proxied_listener(live_stack, proxy, check) as doorbell,
        sse(live_stack.base_url, agent.credential) as listener,
    ):
        _, first = await ingest(live_stack, hook, number=1)
        await eventually(lambda: ring_ids(listener.events) == [first], timeout=10, interval=POLL)
        assert doorbell.connects == 1

        caplog.set_level("INFO", logger="switchboard.doorbell")
        proxy.blackhole()  # the socket stays open; nothing passes any more
        lost_at = time.monotonic()
        _, missed = await ingest(live_stack, hook, number=2)  # committed while the listener is deaf
        await eventually(lambda: not doorbell.listening.is_set(), timeout=15, interval=POLL)
        noticed = time.monotonic() - lost_at
        # Within the liveness period (a round trip is due every `check` seconds and may take 1.5 of them),
        # with generous room for a loaded machine.
        print(f"half-open LISTEN connection noticed after {noticed:.2f}s (check period {check}s)")
        assert noticed < 2.5 * check + 3, noticed
        assert ring_ids(listener.events) == [first]
        assert any("doorbell connection lost" in r.getMessage() for r in caplog.records)

        proxy.restore()
        await eventually(lambda: doorbell.listening.is_set(), timeout=30, interval=POLL)
        await eventually(lambda: ring_ids(listener.events) == [first, missed], timeout=10, interval=POLL)
        assert doorbell.connects == 2 and doorbell.caught_up == 1
        assert any("listening again" in r.getMessage() for r in caplog.records)
        _, after = await ingest(live_stack, hook, number=3)
        await eventually(lambda: ring_ids(listener.events) == [first, missed, after], timeout=10, interval=POLL)
        await asyncio.sleep(3 * check)  # several liveness round trips: no re-rings, no reconnects
        assert ring_ids(listener.events) == [first, missed, after]
        assert doorbell.connects == 2 and doorbell.listening.is_set()
    [(rung,)] = live_stack.sql(
        "SELECT count(*) FROM todos WHERE id = ANY(%s) AND rung_at IS NOT NULL", [first, missed, after]
    )
    assert rung == 3


async def test_two_api_processes_ring_each_todo_exactly_once_in_total(
    live_stack: Stack, tmp_path: Path, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    # A second API app (its own lifespan, pool, doorbell listener and hub) on the same database.
    async with (
        running_stack(
            tmp_path / "second",
            live_stack.database_url,
            temporal_env.client,
            sandbox,
            with_worker=False,
            secret_key=live_stack.settings.secret_key,
        ) as second,
        serving(second.app) as second_url,
        sse(live_stack.base_url, agent.credential) as here,
        sse(second_url, agent.credential) as there,
        sse(second_url, agent.credential) as there_too,
    ):
        n = 12
        ids = []
        for batch in range(0, n, 4):
            ids += [t for _, t in await asyncio.gather(*(ingest(live_stack, hook, number=batch + i) for i in range(4)))]
        streams = (here, there, there_too)
        await eventually(lambda: sum(len(ring_ids(s.events)) for s in streams) == n, timeout=15, interval=POLL)
        await asyncio.sleep(1.0)  # no late duplicates from the other process
        heard = [t for s in streams for t in ring_ids(s.events)]
        assert sorted(heard) == sorted(ids)  # every todo rang exactly one session, across both processes
        assert hub_of(live_stack).rung + hub_of(second).rung == n
    [(unrung,)] = live_stack.sql("SELECT count(*) FROM todos WHERE id = ANY(%s) AND rung_at IS NULL", ids)
    assert unrung == 0


async def test_an_8000_byte_event_header_commits_and_rings(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    event = "e" * 8000
    async with sse(live_stack.base_url, agent.credential) as listener:
        async with httpx.AsyncClient(base_url=live_stack.base_url, timeout=60) as http:
            resp = await post_github(http, hook, issue_payload(number=5, title="t" * 2000), event=event)
        assert resp.status_code == 202, resp.text
        body = resp.json()
        assert body.get("created") == 1, body
        [todo] = body["todos"]
        await eventually(lambda: ring_ids(listener.events) == [todo["id"]], timeout=10, interval=POLL)
        stored = (await agent.ok("get_todo", {"todo_id": todo["id"]}))["todo"]
        [(_, _, data)] = listener.events
        assert data["kind"] == stored["kind"] and data["title"] == stored["title"]  # read from the todos table
        assert stored["kind"].startswith("eeee") and len(stored["kind"]) <= 256  # capped at the boundary


async def test_notification_payload_carries_ids_only(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    heard: list[str] = []
    async with await psycopg.AsyncConnection.connect(live_stack.database_url, autocommit=True) as conn:
        await conn.execute("LISTEN switchboard_todos")
        _, todo_id = await ingest(live_stack, hook, number=9)
        async for note in conn.notifies(timeout=10, stop_after=1):
            heard.append(note.payload)
    assert [json.loads(p) for p in heard] == [{"todo_id": todo_id, "endpoint_id": agent.endpoint_id}]


async def sse_closed(base_url: str, credential: str) -> tuple[asyncio.Task[None], asyncio.Event]:
    """A raw SSE reader: a task that ends when the server ends the response, and an event set once subscribed."""
    subscribed = asyncio.Event()

    async def read() -> None:
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(30, read=None)) as http,
            http.stream("GET", "/v1/stream", headers={"Authorization": f"Bearer {credential}"}) as resp,
        ):
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.strip() == ": subscribed":
                    subscribed.set()

    task = asyncio.create_task(read())
    await asyncio.wait_for(subscribed.wait(), 10)
    return task, subscribed


async def test_revoke_closes_sse_streams_in_every_process_within_5s(
    live_stack: Stack, tmp_path: Path, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    agent = await live_stack.agent()
    async with (
        running_stack(
            tmp_path / "second",
            live_stack.database_url,
            temporal_env.client,
            sandbox,
            with_worker=False,
            secret_key=live_stack.settings.secret_key,
        ) as second,
        serving(second.app) as second_url,
    ):
        here, _ = await sse_closed(live_stack.base_url, agent.credential)
        there, _ = await sse_closed(second_url, agent.credential)
        revoked_at = time.monotonic()
        await live_stack.admin("revoke_endpoint", {"endpoint_id": agent.endpoint_id})
        done, _ = await asyncio.wait({here, there}, timeout=5)
        assert done == {here, there}, "an SSE stream outlived the revoke by 5 s"
        for task in done:
            task.result()  # ended cleanly by the server
        assert time.monotonic() - revoked_at < 5
        await eventually(lambda: hub_of(live_stack).listeners(agent.endpoint_id) == 0, interval=POLL)
        await eventually(lambda: hub_of(second).listeners(agent.endpoint_id) == 0, interval=POLL)


async def test_a_revoke_missed_by_the_listener_still_closes_streams_within_5s(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    task, _ = await sse_closed(live_stack.base_url, agent.credential)
    # Revoked behind the doorbell's back (no NOTIFY): the periodic re-check of open endpoints catches it.
    live_stack.sql("UPDATE endpoints SET state = 'revoked', revoked_at = now() WHERE id = %s", agent.endpoint_id)
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done == {task}, "the SSE stream outlived the revoke by 5 s"


async def test_revoke_closes_the_mcp_session_and_its_stream_within_5s(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    auth = {"Authorization": f"Bearer {agent.credential}"}
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    async with httpx.AsyncClient(base_url=live_stack.base_url, timeout=httpx.Timeout(30, read=None)) as http:
        resp = await http.post("/mcp", json=init, headers={**auth, **accept})
        assert resp.status_code == 200, resp.text
        session_id = resp.headers["mcp-session-id"]
        version = {"mcp-session-id": session_id, "mcp-protocol-version": "2025-06-18"}
        resp = await http.post(
            "/mcp",
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers={**auth, **accept, **version},
        )
        assert resp.status_code == 202, resp.text

        async def read_stream() -> None:
            async with http.stream(
                "GET", "/mcp", headers={**auth, **version, "Accept": "text/event-stream"}
            ) as stream_resp:
                assert stream_resp.status_code == 200
                async for _ in stream_resp.aiter_lines():
                    pass

        stream = asyncio.create_task(read_stream())
        await eventually(lambda: hub_of(live_stack).listeners(agent.endpoint_id, "mcp") == 1, timeout=10, interval=POLL)
        await live_stack.admin("revoke_endpoint", {"endpoint_id": agent.endpoint_id})
        done, _ = await asyncio.wait({stream}, timeout=5)
        assert done == {stream}, "the MCP stream outlived the revoke by 5 s"
        assert session_id not in mcp_of(live_stack).sessions
        assert hub_of(live_stack).listeners(agent.endpoint_id) == 0


async def test_a_dropped_ring_is_given_back_and_a_catch_up_rings_it(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    hub = hub_of(live_stack)
    with hub.subscription(agent.endpoint_id, ["work"], "sse") as stuck:  # a stream that never drains
        ids = [(await ingest(live_stack, hook, number=n))[1] for n in range(BUFFER + 2)]
        await eventually(lambda: stuck.dropped == 2, timeout=10, interval=POLL)

        def rung_ids() -> set[str]:
            rows = live_stack.sql("SELECT id FROM todos WHERE id = ANY(%s) AND rung_at IS NOT NULL", ids)
            return {r[0] for r in rows}

        # A drop is counted before its claim is given back (one more statement): wait for the give-back too.
        await eventually(lambda: len(rung_ids()) == BUFFER, timeout=10, interval=POLL)
        rung = rung_ids()
        # Rings are claimed concurrently, so which two were dropped is not fixed; they were given back.
        assert len(rung) == BUFFER and rung <= set(ids)
        missed = set(ids) - rung
        # Once the stream drains, a catch-up (as after a reconnect) rings the two it missed, once.
        while not stuck.buffer.empty():
            stuck.buffer.get_nowait()
        listener = live_stack.app.state.doorbell
        assert listener.alive_at is not None
        assert await listener.catch_up(listener.alive_at - timedelta(minutes=5)) == 2
        assert {stuck.buffer.get_nowait().todo_id for _ in range(2)} == missed
        assert await listener.catch_up(listener.alive_at - timedelta(minutes=5)) == 0

"""The new-todo doorbell: SSE on GET /v1/stream and MCP notifications/claude/channel, against a served app."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

import api.stream
from api.doorbell import BUFFER, DoorbellHub
from api.mcp import McpSurface
from tests.api.test_mcp import SECURITY_HEADERS, ChannelParams, mcp_session
from tests.conftest import Agent, Stack
from tests.helpers import eventually, issue_payload, post_github

# Rings race the doorbell's own catch-ups: a check right after the condition holds (as before the suite had one
# `eventually`) reads the state the condition implies, before a background catch-up can change it again.
POLL = 0.01


@dataclass
class SseListener:
    """Reads GET /v1/stream in the background: events with their arrival times, comments, response headers."""

    events: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    subscribed: asyncio.Event = field(default_factory=asyncio.Event)
    headers: httpx.Headers | None = None


@contextlib.asynccontextmanager
async def sse(base_url: str, credential: str) -> AsyncIterator[SseListener]:
    listener = SseListener()

    async def read() -> None:
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(30, read=None)) as http,
            http.stream("GET", "/v1/stream", headers={"Authorization": f"Bearer {credential}"}) as resp,
        ):
            assert resp.status_code == 200, await resp.aread()
            listener.headers = resp.headers
            event, data = "message", ""
            async for line in resp.aiter_lines():
                if line.startswith(":"):
                    listener.comments.append(line[1:].strip())
                    if line[1:].strip() == "subscribed":
                        listener.subscribed.set()
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data += line[5:].strip()
                elif not line and data:
                    listener.events.append((time.monotonic(), event, json.loads(data)))
                    event, data = "message", ""

    task = asyncio.create_task(read())
    waiter = asyncio.create_task(listener.subscribed.wait())
    await asyncio.wait({task, waiter}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task.done():
        await task
    assert listener.subscribed.is_set()
    try:
        yield listener
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def hub_of(stack: Stack) -> DoorbellHub:
    hub = stack.app.state.services.doorbell
    assert isinstance(hub, DoorbellHub)
    return hub


def mcp_of(stack: Stack) -> McpSurface:
    [surface] = [r.endpoint for r in stack.app.router.routes if getattr(r, "path", "") == "/mcp"]
    assert isinstance(surface, McpSurface)
    return surface


async def github_hook(agent: Agent, queue: str = "work") -> dict[str, Any]:
    return await agent.ok("create_webhook", {"source_type": "github", "target_queue": queue})


async def ingest(stack: Stack, hook: dict[str, Any], number: int = 7) -> tuple[float, str]:
    """POST one signed delivery to the served app; (monotonic time the response came back, todo id)."""
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as http:
        resp = await post_github(http, hook, issue_payload(number=number, title=f"Fix the build #{number}"))
    assert resp.status_code == 202, resp.text
    [todo] = resp.json()["todos"]
    return time.monotonic(), str(todo["id"])


async def test_sse_rings_within_a_second_with_the_documented_event(live_stack: Stack) -> None:
    agent = await live_stack.agent(queues=["work"], webhook_queues=["work", "elsewhere"])
    hook = await github_hook(agent)
    async with sse(live_stack.base_url, agent.credential) as listener:
        assert listener.headers is not None
        assert listener.headers["content-type"].startswith("text/event-stream")
        for name, value in SECURITY_HEADERS.items():
            assert listener.headers[name] == value
        assert listener.headers["x-request-id"]
        started = time.monotonic()
        done_at, todo_id = await ingest(live_stack, hook)
        await eventually(lambda: len(listener.events) == 1, timeout=done_at - started + 1.0, interval=POLL)
        heard_at, event, data = listener.events[0]
        assert heard_at - done_at < 1.0
        todo = (await agent.ok("get_todo", {"todo_id": todo_id}))["todo"]
        assert event == "todo"
        assert data == {
            "todo_id": todo_id,
            "queue": "work",
            "kind": todo["kind"],
            "source": "github",
            "title": todo["title"],
        }
        assert "payload" not in json.dumps(data) and hook["secret"] not in json.dumps(data)

        # A todo in a queue outside the endpoint's scope never rings its streams.
        other = await github_hook(agent, queue="elsewhere")
        unheard = hub_of(live_stack).unheard
        await ingest(live_stack, other, number=8)
        await eventually(lambda: hub_of(live_stack).unheard == unheard + 1, interval=POLL)
        assert len(listener.events) == 1
    await eventually(lambda: hub_of(live_stack).listeners(agent.endpoint_id) == 0, interval=POLL)


async def test_sse_needs_a_credential_but_not_a_verb_and_sends_heartbeats(live_stack: Stack, monkeypatch: Any) -> None:
    async with httpx.AsyncClient(base_url=live_stack.base_url) as http:
        resp = await http.get("/v1/stream")
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthenticated"
        resp = await http.get("/v1/stream", headers={"Authorization": "Bearer sbk_" + "0" * 64})
        assert resp.status_code == 401
    monkeypatch.setattr(api.stream, "HEARTBEAT_SECONDS", 0.1)
    # The stream is not a verb: an endpoint whose allowlist holds only whoami may still listen.
    agent = await live_stack.agent(verbs=["whoami"])
    async with sse(live_stack.base_url, agent.credential) as listener:
        await eventually(lambda: "heartbeat" in listener.comments, interval=POLL)


async def test_mcp_session_rings_as_claude_channel_within_a_second(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    heard: list[ChannelParams] = []
    times: list[float] = []

    async with mcp_session(live_stack.base_url, agent.credential, heard) as session:
        await eventually(lambda: hub_of(live_stack).listeners(agent.endpoint_id, "mcp") == 1, interval=POLL)
        started = time.monotonic()
        done_at, todo_id = await ingest(live_stack, hook)
        await eventually(lambda: len(heard) == 1, timeout=done_at - started + 1.0, interval=POLL)
        times.append(time.monotonic())
        todo = (await agent.ok("get_todo", {"todo_id": todo_id}))["todo"]
        [ring] = heard
        assert ring.content == f'switchboard: todo {todo_id} ready on queue "work" — {todo["title"]}'
        assert ring.meta == {"todo_id": todo_id, "queue": "work", "kind": todo["kind"], "source": "github"}
        assert hook["secret"] not in ring.model_dump_json()
        # The ring names a todo the session can claim.
        claimed = await session.call_tool("claim", {"todo_id": todo_id})
        assert not claimed.is_error
        assert len(mcp_of(live_stack).sessions) == 1
    await eventually(lambda: hub_of(live_stack).listeners(agent.endpoint_id) == 0, interval=POLL)
    await eventually(
        lambda: not mcp_of(live_stack).sessions, interval=POLL
    )  # the session's channel is forgotten with it


async def test_rings_are_unicast_round_robin_across_an_endpoints_sessions(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    first: list[ChannelParams] = []
    second: list[ChannelParams] = []
    async with (
        mcp_session(live_stack.base_url, agent.credential, first),
        mcp_session(live_stack.base_url, agent.credential, second),
    ):
        await eventually(lambda: hub_of(live_stack).listeners(agent.endpoint_id, "mcp") == 2, interval=POLL)
        ids = [(await ingest(live_stack, hook, number=n))[1] for n in range(1, 7)]
        await eventually(lambda: len(first) + len(second) == 6, interval=POLL)
        await asyncio.sleep(0.2)  # no late duplicates
        heard_first = [r.meta["todo_id"] for r in first]
        heard_second = [r.meta["todo_id"] for r in second]
        assert sorted(heard_first + heard_second) == sorted(ids)  # each ring reached exactly one session
        assert len(heard_first) == len(heard_second) == 3  # and the sessions took turns


async def test_a_full_buffer_drops_rings_and_never_blocks_ingest(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    hub = hub_of(live_stack)
    # A consumer that never drains (its buffer fills) next to a real SSE client that never reads its socket.
    with hub.subscription(agent.endpoint_id, ["work"], "sse") as stuck:
        async with httpx.AsyncClient(base_url=live_stack.base_url, timeout=30) as http:
            async with http.stream("GET", "/v1/stream", headers={"Authorization": f"Bearer {agent.credential}"}):
                await eventually(lambda: hub.listeners(agent.endpoint_id) == 2, interval=POLL)
                n = 2 * BUFFER + 8
                slowest = 0.0
                for batch in range(0, n, 8):
                    t0 = time.monotonic()
                    await asyncio.gather(*(ingest(live_stack, hook, number=batch + i) for i in range(8)))
                    slowest = max(slowest, time.monotonic() - t0)
                # Rings are claimed in the database after the commit: they may trail ingest's answers a little.
                await eventually(lambda: stuck.dropped == n // 2 - BUFFER, interval=POLL)
                assert stuck.buffer.full()
                assert stuck.dropped == n // 2 - BUFFER and hub.dropped >= stuck.dropped
                assert slowest < 10
    # Every todo stays claimable, rung or not.
    claimed = 0
    while not (await agent.ok("claim_next", {}))["empty"]:
        claimed += 1
    assert claimed == 2 * BUFFER + 8


async def test_rings_for_one_endpoint_never_reach_another(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    other = await live_stack.agent(human_id=agent.human_id)
    hook = await github_hook(agent)
    async with (
        sse(live_stack.base_url, agent.credential) as mine,
        sse(live_stack.base_url, other.credential) as theirs,
    ):
        await ingest(live_stack, hook, number=uuid.uuid4().int % 1000)
        await eventually(lambda: len(mine.events) == 1, interval=POLL)
        await asyncio.sleep(0.2)
        assert theirs.events == []


async def test_listener_reconnects_after_losing_its_connection(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    listen = "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' AND datname = current_database()"
    [(old_pid,)] = live_stack.sql(listen)
    live_stack.sql("SELECT pg_terminate_backend(%s)", old_pid)
    async with sse(live_stack.base_url, agent.credential) as listener:
        # Rings committed while it is away ring after the reconnect (test_doorbell_resilience.py checks that
        # strictly); here: it comes back and rings again.
        for n in range(40):
            await ingest(live_stack, hook, number=n)
            with contextlib.suppress(AssertionError):
                await eventually(lambda: len(listener.events) > 0, timeout=0.5, interval=POLL)
                break
        assert listener.events
    [(new_pid,)] = live_stack.sql(listen)
    assert new_pid != old_pid


async def test_shutdown_stops_every_background_task(
    tmp_path: Any, database_url: str, temporal_env: Any, sandbox: Any
) -> None:
    from tests.conftest import running_stack, serving

    names = {"doorbell-listener", "mcp-session-manager", "mcp-doorbell-pump"}
    async with running_stack(tmp_path, database_url, temporal_env.client, sandbox) as stack:
        async with serving(stack.app) as base:
            stack.base_url = base
            agent = await stack.agent()
            async with mcp_session(base, agent.credential), sse(base, agent.credential):
                await eventually(lambda: hub_of(stack).listeners(agent.endpoint_id) == 2, interval=POLL)
                running = {t.get_name() for t in asyncio.all_tasks()}
                assert names <= running
    await asyncio.sleep(0)
    assert not names & {t.get_name() for t in asyncio.all_tasks() if not t.done()}

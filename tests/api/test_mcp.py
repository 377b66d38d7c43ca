"""The agent surface through a real MCP client session (the official SDK over Streamable HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
from mcp import ClientSession, MCPError
from mcp.client.extension import NotificationBinding
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult
from pydantic import BaseModel

from activities.models import UpkeepInput
from api.ratelimit import TokenBuckets
from tests.conftest import Stack
from workflows.upkeep import ReapTodos

SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "strict-origin-when-cross-origin",
}


class ChannelParams(BaseModel):
    content: str
    meta: dict[str, str]


@contextlib.asynccontextmanager
async def mcp_session(
    base_url: str, credential: str, channel: list[ChannelParams] | None = None
) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session for one endpoint credential; rings land in `channel`."""

    async def heard(params: ChannelParams) -> None:
        if channel is not None:
            channel.append(params)

    binding = NotificationBinding(method="notifications/claude/channel", params_type=ChannelParams, handler=heard)
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {credential}"}, timeout=httpx2.Timeout(30, read=300)
        ) as http,
        streamable_http_client(f"{base_url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write, notification_bindings=[binding]) as session,
    ):
        await session.initialize()
        yield session


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


@contextlib.contextmanager
def refused() -> Any:
    """The block fails with an MCP error (anyio may wrap it in exception groups)."""
    try:
        yield
    except BaseException as exc:
        assert any(isinstance(leaf, MCPError) for leaf in leaves(exc)), exc
    else:
        raise AssertionError("expected an MCP error")


def seed_todos(stack: Stack, endpoint_id: str, n: int, queue: str = "work") -> list[str]:
    ids = [f"td_mcp{i:04d}{uuid.uuid4().hex[:8]}" for i in range(n)]
    for todo_id in ids:
        stack.sql(
            "INSERT INTO todos (id, endpoint_id, queue, source, title, idempotency_key) VALUES (%s, %s, %s, 'generic', 't', %s)",
            todo_id,
            endpoint_id,
            queue,
            todo_id,
        )
    return ids


def structured(result: Any) -> dict[str, Any]:
    assert isinstance(result, CallToolResult)
    assert not result.is_error, result.content
    out: dict[str, Any] = result.structured_content
    assert json.loads(result.content[0].text) == out  # type: ignore[union-attr]
    return out


def error_of(result: Any) -> dict[str, Any]:
    assert isinstance(result, CallToolResult)
    assert result.is_error, result.structured_content
    body = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert body == result.structured_content
    err: dict[str, Any] = body["error"]
    assert set(err) >= {"code", "message"}
    return err


async def test_missing_and_revoked_credentials_get_401(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=live_stack.base_url) as http:
        resp = await http.post("/mcp", json=init, headers=headers)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthenticated"
        # RFC 6750's error and description: an MCP client shows why instead of starting an OAuth flow.
        assert resp.headers["www-authenticate"] == (
            'Bearer error="invalid_token", error_description="missing bearer credential"'
        )
        for name, value in SECURITY_HEADERS.items():
            assert resp.headers[name] == value
        resp = await http.post("/mcp", json=init, headers={**headers, "Authorization": "Bearer sbk_" + "0" * 64})
        assert resp.status_code == 401

        # With the credential: the SDK answers, and the security headers are still on the response.
        mine = {**headers, "Authorization": f"Bearer {agent.credential}"}
        resp = await http.post("/mcp", json=init, headers=mine)
        assert resp.status_code == 200, resp.text
        for name, value in SECURITY_HEADERS.items():
            assert resp.headers[name] == value
        assert resp.headers["x-request-id"]
        session_id = resp.headers["mcp-session-id"]
        # A session belongs to the endpoint that opened it; another credential cannot ride it.
        stranger = await live_stack.agent()
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        theirs = {**headers, "Authorization": f"Bearer {stranger.credential}", "mcp-session-id": session_id}
        assert (await http.post("/mcp", json=ping, headers=theirs)).status_code == 404
        assert (await http.post("/mcp", json=ping, headers={**mine, "mcp-session-id": session_id})).status_code == 200
        # Bodies over 1 MiB are refused before any JSON-RPC parsing.
        resp = await http.post("/mcp", content=b"x" * (1024 * 1024 + 1), headers={**mine, "mcp-session-id": session_id})
        assert resp.status_code == 413 and resp.json()["error"]["code"] == "too_large"

    with refused():
        async with mcp_session(live_stack.base_url, "sbk_" + "0" * 64):
            pass

    # A live session stops working the moment its credential is revoked.
    async with mcp_session(live_stack.base_url, agent.credential) as session:
        assert structured(await session.call_tool("whoami", {}))["endpoint_id"] == agent.endpoint_id
        await live_stack.admin("revoke_endpoint", {"endpoint_id": agent.endpoint_id})
        with refused():
            await session.call_tool("whoami", {})
    with refused():
        async with mcp_session(live_stack.base_url, agent.credential):
            pass


async def test_initialize_advertises_tools_and_the_channel_and_lists_only_the_allowlist(live_stack: Stack) -> None:
    from api.verbs import REGISTRY

    narrow = await live_stack.agent(verbs=["whoami", "list_todos", "claim"])
    wide = await live_stack.agent()
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {narrow.credential}"}) as http,
        streamable_http_client(f"{live_stack.base_url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        assert init.capabilities.tools is not None
        assert init.capabilities.experimental == {"claude/channel": {}}
        tools = (await session.list_tools()).tools
        assert sorted(t.name for t in tools) == ["claim", "list_todos", "whoami"]
        claim = next(t for t in tools if t.name == "claim")
        assert claim.input_schema == REGISTRY["claim"].input.model_json_schema()
        assert claim.output_schema == REGISTRY["claim"].output.model_json_schema(mode="serialization")
        assert claim.description == REGISTRY["claim"].summary
    async with mcp_session(live_stack.base_url, wide.credential) as session:
        assert sorted(t.name for t in (await session.list_tools()).tools) == sorted(REGISTRY)


async def test_scope_verb_outside_allowlist_and_todo_outside_queues_are_forbidden(live_stack: Stack) -> None:
    agent = await live_stack.agent(queues=["work"], verbs=["list_todos", "claim", "get_todo"])
    [todo_id] = seed_todos(live_stack, agent.endpoint_id, 1)
    [outside] = seed_todos(live_stack, agent.endpoint_id, 1, queue="secret")
    async with mcp_session(live_stack.base_url, agent.credential) as session:
        assert structured(await session.call_tool("claim", {"todo_id": todo_id}))["todo"]["state"] == "claimed"
        err = error_of(await session.call_tool("complete", {"todo_id": todo_id}))
        assert err["code"] == "forbidden"
        assert live_stack.sql("SELECT state FROM todos WHERE id = %s", todo_id)[0][0] == "claimed"
        assert error_of(await session.call_tool("claim", {"todo_id": outside}))["code"] == "forbidden"
        assert live_stack.sql("SELECT state FROM todos WHERE id = %s", outside)[0][0] == "pending"
        assert error_of(await session.call_tool("list_todos", {"queue": "secret"}))["code"] == "forbidden"
        listed = structured(await session.call_tool("list_todos", {}))
        assert [t["id"] for t in listed["todos"]] == [todo_id]
        # Invalid input is refused by the verb's input model, without echoing it.
        err = error_of(await session.call_tool("claim", {"todo_id": 5, "surprise": "sekrit-value"}))
        assert err["code"] == "invalid_argument" and "sekrit-value" not in err["message"]
        assert error_of(await session.call_tool("no_such_verb", {}))["code"] == "unknown_verb"


async def test_claim_race_has_one_winner(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    other = await live_stack.agent(human_id=agent.human_id)
    [todo_id] = seed_todos(live_stack, agent.endpoint_id, 1)
    async with (
        mcp_session(live_stack.base_url, agent.credential) as first,
        mcp_session(live_stack.base_url, agent.credential) as second,
    ):
        results = await asyncio.gather(
            *(s.call_tool("claim", {"todo_id": todo_id}) for s in (first, second, first, second))
        )
        wins = [r for r in results if not r.is_error]
        assert len(wins) == 1
        assert sorted(error_of(r)["code"] for r in results if r.is_error) == ["conflict"] * 3
    # Another endpoint does not even see it.
    async with mcp_session(live_stack.base_url, other.credential) as session:
        assert error_of(await session.call_tool("claim", {"todo_id": todo_id}))["code"] == "not_found"


async def test_fail_retries_then_dead_letters_and_heartbeat_needs_the_holder(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    [todo_id] = seed_todos(live_stack, agent.endpoint_id, 1)
    live_stack.sql("UPDATE todos SET max_attempts = 2 WHERE id = %s", todo_id)
    async with (
        mcp_session(live_stack.base_url, agent.credential) as session,
        mcp_session(live_stack.base_url, agent.credential) as twin,
    ):
        assert error_of(await session.call_tool("heartbeat", {"todo_id": todo_id}))["code"] == "conflict"
        structured(await session.call_tool("claim", {"todo_id": todo_id, "lease_seconds": 60}))
        failed = structured(await session.call_tool("fail", {"todo_id": todo_id, "error": "boom"}))["todo"]
        assert failed["state"] == "failed" and failed["attempt"] == 1 and failed["next_retry_at"] is not None
        live_stack.sql("UPDATE todos SET next_retry_at = now() - interval '1 second' WHERE id = %s", todo_id)
        reaped = await live_stack.temporal.execute_workflow(
            ReapTodos.run, UpkeepInput(), id=f"reap-{uuid.uuid4().hex}", task_queue=live_stack.settings.task_queue
        )
        assert reaped.model_dump()["retried"] == 1
        claimed = structured(await twin.call_tool("claim_next", {}))["todo"]
        assert claimed["id"] == todo_id and claimed["attempt"] == 2
        dead = structured(await twin.call_tool("fail", {"todo_id": todo_id, "error": "boom"}))["todo"]
        assert dead["state"] == "failed" and dead["next_retry_at"] is None
        assert error_of(await session.call_tool("claim", {"todo_id": todo_id}))["code"] == "conflict"

    # Heartbeat by an endpoint that does not hold the lease changes nothing.
    [held] = seed_todos(live_stack, agent.endpoint_id, 1)
    other = await live_stack.agent(human_id=agent.human_id)
    async with (
        mcp_session(live_stack.base_url, agent.credential) as holder,
        mcp_session(live_stack.base_url, other.credential) as stranger,
    ):
        lease = structured(await holder.call_tool("claim", {"todo_id": held, "lease_seconds": 30}))["todo"]
        refused = error_of(await stranger.call_tool("heartbeat", {"todo_id": held, "lease_seconds": 3000}))
        assert refused["code"] in {"not_found", "forbidden", "conflict"}
        after = live_stack.sql("SELECT lease_expires_at FROM todos WHERE id = %s", held)[0][0]
        assert after.isoformat() == lease["lease_expires_at"].replace("Z", "+00:00")


async def test_webhook_ceiling_source_types_secret_once_and_no_trust_downgrade(live_stack: Stack) -> None:
    agent = await live_stack.agent(webhook_max=1, source_types=["github", "generic"])
    async with mcp_session(live_stack.base_url, agent.credential) as session:
        err = error_of(await session.call_tool("create_webhook", {"source_type": "stripe", "target_queue": "work"}))
        assert err["code"] == "forbidden_source_type"
        err = error_of(
            await session.call_tool(
                "create_webhook", {"source_type": "github", "target_queue": "work", "trust_mode": "token"}
            )
        )
        assert err["code"] == "invalid_argument"  # trust mode is derived, never supplied
        created = structured(
            await session.call_tool("create_webhook", {"source_type": "github", "target_queue": "work"})
        )
        assert created["trust_mode"] == "signed" and created["secret"].startswith("whsec_")
        secret = created["secret"]
        err = error_of(await session.call_tool("create_webhook", {"source_type": "generic", "target_queue": "work"}))
        assert err["code"] == "ceiling_exceeded"
        assert (
            live_stack.sql("SELECT count(*) FROM endpoint_webhooks WHERE endpoint_id = %s", agent.endpoint_id)[0][0]
            == 1
        )
        listed = await session.call_tool("list_webhooks", {})
        text = listed.content[0].text  # type: ignore[union-attr]
        assert secret not in text and "whsec_" not in text
        [hook] = structured(listed)["webhooks"]
        assert hook["trust_mode"] == "signed"


async def test_rate_limit_is_a_tool_error_with_retry_after(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    live_stack.app.state.services.agent_limits = TokenBuckets(0.5, 2)
    async with mcp_session(live_stack.base_url, agent.credential) as session:
        results = [await session.call_tool("whoami", {}) for _ in range(3)]
    assert [r.is_error for r in results] == [False, False, True]
    err = error_of(results[2])
    assert err["code"] == "rate_limited" and err["retry_after"] >= 1

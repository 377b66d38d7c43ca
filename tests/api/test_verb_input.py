"""Verb arguments that cannot be stored (NUL, lone surrogates) are refused as invalid_argument on every surface.

Over a real socket: the refusal must come before any handler runs, and the keep-alive connection must stay
usable (a 500 from a failed write, or a response that cannot be encoded, used to close it).
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.test_mcp import error_of, mcp_session, structured
from tests.conftest import Stack


def _port(resp: httpx.Response) -> Any:
    """The client-side address of the connection that carried resp."""
    return resp.extensions["network_stream"].get_extra_info("client_addr")


async def _refused(resp: httpx.Response, field: str) -> None:
    assert resp.status_code == 422, resp.text
    err = resp.json()["error"]
    assert err["code"] == "invalid_argument"
    assert field in err["message"] and "NUL or a lone surrogate" in err["message"]


async def test_agent_verbs_refuse_nul_and_lone_surrogates_and_keep_the_connection(live_stack: Stack) -> None:
    stack = live_stack
    agent = await stack.agent()
    auth = {"Authorization": f"Bearer {agent.credential}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=auth, timeout=30) as http:
        first = await http.post("/v1/whoami", content=b"{}")
        assert first.status_code == 200
        cases: list[tuple[str, bytes, str]] = [
            ("create_webhook", b'{"source_type": "generic", "target_queue": "wo\\u0000rk"}', "target_queue"),
            ("create_webhook", b'{"source_type": "generic", "target_queue": "\\ud800"}', "target_queue"),
            ("list_todos", b'{"queue": "a\\udfffb"}', "queue"),
            (
                "set_webhook_rules",
                b'{"webhook_id": "wh_x", "rules": [{"expr": "true", "action": {"queue": "w\\u0000"}}]}',
                "rules[0].action.queue",
            ),
            ("complete", b'{"todo_id": "td_x", "result": {"k\\u0000": 1}}', "result"),
        ]
        for verb, body, field in cases:
            resp = await http.post(f"/v1/{verb}", content=body)
            await _refused(resp, field)
            assert _port(resp) == _port(first), "the keep-alive connection was closed"
        # Nothing was written by the refused calls.
        assert stack.sql("SELECT count(*) FROM endpoint_webhooks")[0][0] == 0

        # Malformed JSON, and bytes that are not UTF-8 (a CESU-8 surrogate), are clear 422s too.
        for body in (b'{"queue": ', b'{"queue": "\xed\xa0\x80"}', b"\xff\xfe"):
            resp = await http.post("/v1/list_todos", content=body)
            assert resp.status_code == 422, (body, resp.text)
            assert resp.json()["error"]["code"] == "invalid_argument"
            assert _port(resp) == _port(first)
        after = await http.post("/v1/whoami", content=b"{}")
        assert after.status_code == 200 and _port(after) == _port(first)


async def test_admin_verbs_refuse_unstorable_text(live_stack: Stack) -> None:
    stack = live_stack
    auth = {"Authorization": f"Bearer {stack.settings.admin_token}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=auth, timeout=30) as http:
        for body in (b'{"name": "j\\u0000oe"}', b'{"name": "\\udc00"}'):
            resp = await http.post("/admin/v1/create_human", content=body)
            await _refused(resp, "name")
        assert stack.sql("SELECT count(*) FROM humans")[0][0] == 0
        ok = await http.post("/admin/v1/create_human", content=b'{"name": "joe"}')
        assert ok.status_code == 200


async def test_mcp_tools_refuse_unstorable_text(live_stack: Stack) -> None:
    stack = live_stack
    agent = await stack.agent()
    async with mcp_session(stack.base_url, agent.credential) as session:
        err = error_of(await session.call_tool("list_todos", {"queue": "w\x00rk"}))
        assert err["code"] == "invalid_argument" and "queue" in err["message"]
        err = error_of(await session.call_tool("create_webhook", {"source_type": "generic", "target_queue": "a\x00"}))
        assert err["code"] == "invalid_argument" and "target_queue" in err["message"]
        # The session is still good.
        assert structured(await session.call_tool("whoami", {}))["endpoint_id"] == agent.endpoint_id
    assert stack.sql("SELECT count(*) FROM endpoint_webhooks")[0][0] == 0

"""One verb pipeline for HTTP and MCP (api/dispatch.py): allowlist, then rate class, then validation, then the handler.

Admin verbs live in the same table but on their own surface: never an agent path, a tool or an endpoint's scope.
"""

from __future__ import annotations

from api.ratelimit import TokenBuckets
from api.verbs import ADMIN_VERBS, REGISTRY, VERBS
from tests.api.test_mcp import error_of, mcp_session, structured
from tests.conftest import Stack


async def test_the_allowlist_refuses_before_the_arguments_are_read_on_both_surfaces(live_stack: Stack) -> None:
    narrow = await live_stack.agent(verbs=["whoami"])
    # Not even JSON: the verb is outside the scope, and that is the answer.
    resp = await narrow.http.post(
        "/v1/claim",
        content=b'{"todo_id": ',
        headers={"Authorization": f"Bearer {narrow.credential}", "Content-Type": "application/json"},
    )
    assert resp.status_code == 403, resp.text
    http_error = resp.json()["error"]
    assert http_error == {"code": "forbidden", "message": "verb claim is not in this endpoint's allowlist"}
    async with mcp_session(live_stack.base_url, narrow.credential) as session:
        mcp_error = error_of(await session.call_tool("claim", {"lease_seconds": "not a number"}))
        assert mcp_error == http_error
        # Arguments of a verb in scope are validated, with the field named the same way on both surfaces.
        mcp_invalid = error_of(await session.call_tool("whoami", {"surprise": 1}))
    http_invalid = (await narrow.call("whoami", {"surprise": 1})).json()["error"]
    assert mcp_invalid["code"] == http_invalid["code"] == "invalid_argument"
    assert mcp_invalid["message"] == http_invalid["message"] and "surprise" in http_invalid["message"]


async def test_a_throttled_call_is_refused_before_validation_and_other_agent_paths_spend_at_the_door(
    stack: Stack,
) -> None:
    agent = await stack.agent()
    stack.app.state.services.agent_limits = TokenBuckets(0.01, 1)
    assert (await agent.call("whoami")).status_code == 200
    resp = await agent.call("list_todos", {"limit": "many"})
    assert resp.status_code == 429 and resp.json()["error"]["code"] == "rate_limited"
    assert int(resp.headers["retry-after"]) >= 1
    # A path under /v1/ that is no verb spends from the same bucket before it is found missing.
    unknown = await agent.call("no_such_verb")
    assert unknown.status_code == 429


async def test_admin_verbs_are_never_agent_verbs_tools_or_scopes(live_stack: Stack) -> None:
    assert set(ADMIN_VERBS) == {
        "create_human",
        "create_agent",
        "vend_endpoint",
        "revoke_endpoint",
        "set_friend_edge",
        "set_webhook_rate",
        "list_humans",
        "list_agents",
        "list_endpoints",
        "set_llm_provider",
        "list_llm_providers",
        "delete_llm_provider",
        "list_parked_deliveries",
        "requeue_parked_delivery",
    }
    assert set(ADMIN_VERBS).isdisjoint(REGISTRY) and set(VERBS) == set(ADMIN_VERBS) | set(REGISTRY)
    agent = await live_stack.agent()
    resp = await agent.call("create_human", {"name": "mallory"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "unknown_verb"
    async with mcp_session(live_stack.base_url, agent.credential) as session:
        assert not {t.name for t in (await session.list_tools()).tools} & set(ADMIN_VERBS)
        err = error_of(await session.call_tool("create_human", {"name": "mallory"}))
        assert err["code"] == "unknown_verb"
        assert structured(await session.call_tool("whoami", {}))["endpoint_id"] == agent.endpoint_id
    # The admin token does not open agent paths either, and an endpoint cannot be vended an admin verb.
    as_admin = await live_stack.http.post(
        "/v1/whoami", json={}, headers={"Authorization": f"Bearer {live_stack.settings.admin_token}"}
    )
    assert as_admin.status_code == 401
    human = await live_stack.human()
    agent_id = (await live_stack.admin("create_agent", {"human_id": human, "name": "a"}))["agent_id"]
    vend = await live_stack.http.post(
        "/admin/v1/vend_endpoint",
        json={"agent_id": agent_id, "queues": ["work"], "verbs": ["whoami", "create_human"]},
        headers={"Authorization": f"Bearer {live_stack.settings.admin_token}"},
    )
    assert vend.status_code == 422 and "create_human" in vend.json()["error"]["message"]
    assert live_stack.sql("SELECT count(*) FROM humans WHERE name = 'mallory'")[0][0] == 0


async def test_admin_routes_check_the_token_then_validate_through_the_same_pipeline(stack: Stack) -> None:
    headers = {"Authorization": f"Bearer {stack.settings.admin_token}"}
    resp = await stack.http.post("/admin/v1/create_human", json={"name": ""}, headers=headers)
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument"
    assert "name" in resp.json()["error"]["message"]
    unauthenticated = await stack.http.post("/admin/v1/create_human", content=b"not json")
    assert unauthenticated.status_code == 401
    malformed = await stack.http.post("/admin/v1/create_human", content=b"not json", headers=headers)
    assert malformed.status_code == 422 and malformed.json()["error"]["code"] == "invalid_argument"
    assert (await stack.http.post("/admin/v1/claim", json={}, headers=headers)).status_code == 404
    spec = (await stack.http.get("/openapi.json")).json()
    for name, verb in ADMIN_VERBS.items():
        op = spec["paths"][f"/admin/v1/{name}"]["post"]
        assert op["summary"] == verb.summary and op["tags"] == ["admin"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["title"] == verb.input.__name__

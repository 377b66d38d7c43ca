"""Health, OpenAPI, security headers and admin authentication."""

from __future__ import annotations

from api.verbs import REGISTRY
from tests.conftest import Stack


async def test_healthz_reports_ok(stack: Stack) -> None:
    resp = await stack.http.get("/healthz")
    assert resp.status_code == 200 and resp.json()["status"] == "ok"


async def test_openapi_has_one_operation_per_verb(stack: Stack) -> None:
    spec = (await stack.http.get("/openapi.json")).json()
    for name, verb in REGISTRY.items():
        op = spec["paths"][f"/v1/{name}"]["post"]
        assert op["operationId"] == name
        assert op["summary"] == verb.summary
        assert "requestBody" in op
        ok = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        assert ok == f"#/components/schemas/{verb.output.__name__}"
    assert "/webhooks/w/{ingest_token}" in spec["paths"]
    assert "/admin/v1/vend_endpoint" in spec["paths"]
    assert (await stack.http.get("/docs")).status_code == 200


async def test_security_headers_on_every_response(stack: Stack) -> None:
    for resp in (
        await stack.http.get("/healthz"),
        await stack.http.post("/v1/whoami", json={}),
        await stack.http.post("/webhooks/w/" + "0" * 32, content=b"{}"),
    ):
        assert resp.headers["content-security-policy"] == "default-src 'none'"
        assert resp.headers["x-frame-options"] == "DENY"
        assert resp.headers["x-content-type-options"] == "nosniff"
        assert resp.headers["referrer-policy"] == "strict-origin-when-cross-origin"
        assert resp.headers["x-request-id"]


async def test_admin_requires_the_admin_token(stack: Stack) -> None:
    resp = await stack.http.post("/admin/v1/create_human", json={"name": "x"})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthenticated"
    resp = await stack.http.post("/admin/v1/create_human", json={"name": "x"}, headers={"Authorization": "Bearer nope"})
    assert resp.status_code == 401
    assert stack.sql("SELECT count(*) FROM humans")[0][0] == 0


async def test_vend_shows_the_credential_once_and_stores_only_its_hash(stack: Stack) -> None:
    agent = await stack.agent()
    assert agent.credential.startswith("sbk_") and len(agent.credential) == 4 + 64
    [(prefix, hashed)] = stack.sql("SELECT credential_prefix, credential_hash FROM endpoints")
    assert agent.credential.startswith(prefix) and agent.credential.encode() not in bytes(hashed)
    resp = await stack.admin("create_agent", {"human_id": agent.human_id, "name": "x"})
    assert "credential" not in resp
    bad = await stack.http.post(
        "/admin/v1/create_agent",
        json={"human_id": "hu_missing", "name": "x"},
        headers={"Authorization": f"Bearer {stack.settings.admin_token}"},
    )
    assert bad.status_code == 404 and bad.json()["error"]["code"] == "not_found"


async def test_verb_bodies_are_json_whatever_the_content_type(stack: Stack) -> None:
    agent = await stack.agent()
    auth = {"Authorization": f"Bearer {agent.credential}"}
    form = await stack.http.post(
        "/v1/whoami", content=b"{}", headers={**auth, "Content-Type": "application/x-www-form-urlencoded"}
    )
    assert form.status_code == 200 and form.json()["endpoint_id"] == agent.endpoint_id
    empty = await stack.http.post("/v1/list_todos", headers=auth)
    assert empty.status_code == 200 and empty.json() == {"todos": [], "next_cursor": None}


async def test_vend_refuses_unknown_verbs_and_source_types(stack: Stack) -> None:
    human = await stack.human()
    agent_id = (await stack.admin("create_agent", {"human_id": human, "name": "a"}))["agent_id"]
    headers = {"Authorization": f"Bearer {stack.settings.admin_token}"}
    base = {"agent_id": agent_id, "queues": ["work"], "webhook_queues": ["work"]}
    bad_verb = await stack.http.post(
        "/admin/v1/vend_endpoint", json={**base, "verbs": ["claim", "clam"]}, headers=headers
    )
    assert bad_verb.status_code == 422 and "clam" in bad_verb.json()["error"]["message"]
    bad_source = await stack.http.post(
        "/admin/v1/vend_endpoint",
        json={**base, "verbs": ["claim"], "webhook_source_types": ["schedule"]},
        headers=headers,
    )
    assert bad_source.status_code == 422
    assert stack.sql("SELECT count(*) FROM endpoints")[0][0] == 0


async def test_verbs_answered_past_the_router_keep_the_routes_answers(stack: Stack) -> None:
    # POST /v1/{verb} is answered by AgentAuthMiddleware (api/surface.py serve_agent_verb), not the FastAPI route:
    # the answer must be the one the route gave, headers included; other methods still reach the router.
    agent = await stack.agent()
    auth = {"Authorization": f"Bearer {agent.credential}", "X-Request-Id": "req-fast-path-1"}
    ok = await stack.http.post("/v1/whoami", json={}, headers=auth)
    assert ok.status_code == 200 and ok.json()["endpoint_id"] == agent.endpoint_id
    assert ok.headers["content-type"] == "application/json"
    assert int(ok.headers["content-length"]) == len(ok.content)
    assert ok.headers["x-request-id"] == "req-fast-path-1"
    assert ok.headers["content-security-policy"] == "default-src 'none'"
    bad = await stack.http.post("/v1/claim", json={"todo_id": ""}, headers=auth)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_argument"
    assert bad.headers["content-type"] == "application/json"
    missing = await stack.http.post("/v1/get_todo", json={"todo_id": "td_missing"}, headers=auth)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    got = await stack.http.get("/v1/whoami", headers=auth)
    assert got.status_code == 405
    assert got.headers["x-request-id"] == "req-fast-path-1"

"""Health, OpenAPI, security headers and admin authentication."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from fastapi import Depends, FastAPI, Request, Response
from starlette.routing import Match

from api.deps import require_admin
from api.fastpath import VerbFastPath
from api.surface import VerbRoute
from api.verbs import ADMIN_VERBS, REGISTRY
from tests.conftest import Stack
from tests.helpers import issue_payload, post_github

UNKNOWN = "/webhooks/w/" + "0" * 32


def refs(node: Any) -> Iterator[str]:
    """Every $ref anywhere in a document."""
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def answers(spec: dict[str, Any], path: str, status: int, body: Any) -> None:
    """Check an answer against what the OpenAPI document says `POST path` answers with `status`."""
    schema = spec["paths"][path]["post"]["responses"][str(status)]["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator({**schema, "components": spec["components"]}).validate(body)


async def test_healthz_reports_ok(stack: Stack) -> None:
    resp = await stack.http.get("/healthz")
    assert resp.status_code == 200 and resp.json()["status"] == "ok"


async def test_openapi_has_one_operation_per_verb(stack: Stack) -> None:
    spec = (await stack.http.get("/openapi.json")).json()
    schemes = spec["components"]["securitySchemes"]
    assert schemes["endpoint"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "sbk_…",
        "description": "An endpoint credential, vended once by an operator (`switchboard endpoint vend`).",
    }
    assert schemes["admin"]["scheme"] == "bearer"
    for prefix, verbs, scheme in (("/v1", REGISTRY, "endpoint"), ("/admin/v1", ADMIN_VERBS, "admin")):
        for name, verb in verbs.items():
            path = f"{prefix}/{name}"
            op = spec["paths"][path]["post"]
            assert op["operationId"] == name
            assert op["summary"] == verb.summary
            assert op["security"] == [{scheme: []}], name
            body = op["requestBody"]["content"]["application/json"]["schema"]
            assert body["title"] == verb.input.__name__ and body["type"] == "object"
            assert set(body.get("properties", {})) == set(verb.input.model_fields), name
            ok = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
            assert ok == f"#/components/schemas/{verb.output.__name__}"
            for status in ("401", "413", "422"):
                error = op["responses"][status]["content"]["application/json"]["schema"]["$ref"]
                assert error == "#/components/schemas/ErrorAnswer", (name, status)
            # One route serves the path, and it is the documented one.
            scope = {"type": "http", "path": path, "method": "POST", "root_path": "", "headers": []}
            serving = [r for r in stack.app.routes if r.matches(scope)[0] == Match.FULL]
            assert len(serving) == 1 and getattr(serving[0], "include_in_schema", False), path
    # Every reference resolves inside the document (an input's nested models are inlined into its body).
    for ref in set(refs(spec)):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in spec["components"]["schemas"], ref
    assert "/webhooks/w/{ingest_token}" in spec["paths"]
    assert (await stack.http.get("/docs")).status_code == 200


async def test_verb_answers_are_the_documented_ones(stack: Stack) -> None:
    spec = (await stack.http.get("/openapi.json")).json()
    agent = await stack.agent(verbs=["whoami", "claim_next", "list_todos"])
    answers(spec, "/v1/whoami", 200, await agent.ok("whoami", {}))
    answers(spec, "/v1/claim_next", 200, await agent.ok("claim_next", {}))
    answers(spec, "/v1/claim_next", 200, await agent.ok("claim_next", {"max": 3}))
    forbidden = await agent.call("get_todo", {"todo_id": "td_x"})
    assert forbidden.status_code == 403
    answers(spec, "/v1/get_todo", 403, forbidden.json())
    invalid = await agent.call("list_todos", {"limit": 0})
    assert invalid.status_code == 422
    answers(spec, "/v1/list_todos", 422, invalid.json())
    unauthenticated = await stack.http.post("/v1/whoami", json={})
    assert unauthenticated.status_code == 401
    answers(spec, "/v1/whoami", 401, unauthenticated.json())


async def test_ingest_answers_are_the_documented_ones(stack: Stack) -> None:
    spec = (await stack.http.get("/openapi.json")).json()
    path = "/webhooks/w/{ingest_token}"
    op = spec["paths"][path]["post"]
    assert set(op["responses"]) == {"200", "202", "401", "404", "413", "429", "500", "503"}
    [token] = op["parameters"]
    assert token["name"] == "ingest_token" and token["in"] == "path" and token["required"] is True
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    routed = await post_github(stack.http, webhook, issue_payload(number=1), delivery="doc-1")
    assert routed.status_code == 202 and routed.json()["created"] == 1, routed.text
    answers(spec, path, 202, routed.json())
    again = await post_github(stack.http, webhook, issue_payload(number=1), delivery="doc-1")
    assert again.status_code == 202 and again.json()["duplicate"] is True
    answers(spec, path, 202, again.json())
    bad = await post_github(stack.http, webhook, issue_payload(number=2), secret="whsec_" + "0" * 64)
    assert bad.status_code == 401
    answers(spec, path, 401, bad.json())
    unknown = await stack.http.post(UNKNOWN, content=b"{}")
    assert unknown.status_code == 404
    answers(spec, path, 404, unknown.json())
    stack.app.state.services.temporal = None  # no Temporal: accepted into the inbox, pending
    pending = await post_github(stack.http, webhook, issue_payload(number=3), delivery="doc-3")
    assert pending.status_code == 202 and pending.json()["pending"] is True, pending.text
    answers(spec, path, 202, pending.json())
    # An answer with a field the document does not name is refused by the schema.
    with pytest.raises(jsonschema.ValidationError):
        answers(spec, path, 202, {**routed.json(), "trace": []})


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


async def test_each_verb_is_answered_by_its_route(stack: Stack) -> None:
    # POST /v1/{verb} is the verb's route (api/surface.py): its answers, headers included; other methods are 405.
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


def test_a_verb_route_refuses_what_its_handler_would_skip() -> None:
    # A VerbRoute's handler is its endpoint, so a dependency or a parsed body would silently not run: refused.
    app = FastAPI()

    async def endpoint(request: Request) -> Response:
        return Response()

    async def needs(data: dict[str, int]) -> Response:
        return Response()

    app.router.add_api_route("/v1/fine", endpoint, methods=["POST"], route_class_override=VerbRoute)
    with pytest.raises(TypeError, match="takes the Request alone"):
        app.router.add_api_route(
            "/v1/guarded",
            endpoint,
            methods=["POST"],
            route_class_override=VerbRoute,
            dependencies=[Depends(require_admin)],
        )
    with pytest.raises(TypeError, match="takes the Request alone"):
        app.router.add_api_route("/v1/parsed", needs, methods=["POST"], route_class_override=VerbRoute)


async def test_the_fast_path_hands_a_verb_to_its_own_route_and_nothing_else() -> None:
    app = FastAPI()
    served: list[str] = []

    async def endpoint(request: Request) -> Response:
        served.append(request.scope["route"].path)
        return Response(b'{"ok": true}', media_type="application/json")

    app.router.add_api_route("/v1/x", endpoint, methods=["POST"], route_class_override=VerbRoute)
    [route] = [r for r in app.routes if getattr(r, "path", "") == "/v1/x"]
    routed: list[str] = []

    async def router(scope: Any, receive: Any, send: Any) -> None:
        routed.append(f"{scope['method']} {scope['path']}")
        await app.router(scope, receive, send)

    fast = VerbFastPath(router, routes={"/v1/x": route})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fast), base_url="http://api") as http:
        ok = await http.post("/v1/x", content=b"{}")
        assert (ok.status_code, ok.json(), served, routed) == (200, {"ok": True}, ["/v1/x"], [])
        # Anything else takes the usual way: another method, another path.
        assert (await http.get("/v1/x")).status_code == 405
        assert (await http.post("/v1/y", content=b"{}")).status_code == 404
    assert routed == ["GET /v1/x", "POST /v1/y"] and served == ["/v1/x"]


async def test_every_agent_verb_takes_the_fast_path(stack: Stack) -> None:
    [fast] = [m for m in stack.app.user_middleware if m.cls is VerbFastPath]
    routes = fast.kwargs["routes"]
    assert set(routes) == {f"/v1/{name}" for name in REGISTRY}
    assert all(isinstance(route, VerbRoute) and route.path == path for path, route in routes.items())

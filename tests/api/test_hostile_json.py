"""One JSON depth limit at every boundary (routing.text.MAX_JSON_DEPTH), and reads that always answer.

Issue 29, findings 5 to 7: a stored body nested past about 1,000 levels, or holding `"\\ud800"`, made
get_webhook_event fail (500 over HTTP, no answer at all over MCP); verb arguments about 1,000 deep were a 500 on any
verb, and about 300 deep the write was applied and then every read of it failed (list_webhook_rules, load_grant on
every delivery, get_todo, list_schedules); bodies that are not UTF-8 and integers of over 4,300 digits were 400s; a
string was taken for a boolean.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from api.verbs import ADMIN_VERBS, REGISTRY, VERBS
from routing.text import MAX_JSON_DEPTH
from tests.api.test_mcp import error_of, mcp_session, structured
from tests.conftest import Stack
from tests.helpers import issue_payload, post_github


def nested(depth: int, leaf: Any = 1) -> Any:
    """A JSON value `depth` containers deep: [[…[leaf]…]]."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def deep_text(depth: int) -> str:
    """The JSON text of nested(depth), built as text (json.dumps would recurse past Python's limit)."""
    return "[" * depth + "1" + "]" * depth


# -- stored bodies: reads always answer --------------------------------------------------------------------------


async def test_stored_hostile_bodies_are_read_back_as_their_exact_text(live_stack: Stack) -> None:
    stack = live_stack
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    bodies = {
        # Past Python's recursion limit, past pydantic's, just past ours; and a lone surrogate escape.
        "very-deep": ('{"action": "opened", "x": ' + deep_text(5000) + "}").encode(),
        "deep": ('{"action": "opened", "x": ' + deep_text(300) + "}").encode(),
        "just-past": ('{"action": "opened", "x": ' + deep_text(MAX_JSON_DEPTH) + "}").encode(),
        "surrogate": b'{"action": "opened", "title": "\\ud800 lone"}',
    }
    events, todos = {}, {}
    for name, body in bodies.items():
        resp = await post_github(stack.http, webhook, body, delivery=name)
        # A verified delivery is taken whatever its shape: routed on `.payload: null`, its todo minted.
        assert resp.status_code == 202 and resp.json()["created"] == 1, resp.text
        events[name] = resp.json()["event_id"]
        todos[name] = resp.json()["todos"][0]["id"]
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as http:
        for name, event_id in events.items():
            resp = await http.post(
                "/v1/get_webhook_event",
                json={"event_id": event_id},
                headers={"Authorization": f"Bearer {agent.credential}"},
            )
            assert resp.status_code == 200, (name, resp.text[:300])
            got = resp.json()
            assert got["payload_encoding"] == "text" and got["payload"] == bodies[name].decode(), name
    listed = await agent.ok("list_webhook_events", {"webhook_id": webhook["webhook_id"]})
    assert {e["id"] for e in listed["events"]} == set(events.values())
    # Over MCP the same answers arrive, the surrogate one included.
    async with mcp_session(stack.base_url, agent.credential) as session:
        for name, event_id in events.items():
            got = structured(await session.call_tool("get_webhook_event", {"event_id": event_id}))
            assert got["payload_encoding"] == "text" and got["payload"] == bodies[name].decode(), name
    # Their todos read back, with no jsonb copy of a body past the limit; a dry run over the stored event routes it.
    assert len((await agent.ok("list_todos", {"queue": "work"}))["todos"]) == 4
    for name, todo_id in todos.items():
        todo = await agent.ok("get_todo", {"todo_id": todo_id})
        assert todo["todo"]["payload"] is None, name
    dry = await agent.ok("test_webhook_rules", {"webhook_id": webhook["webhook_id"], "event_id": events["deep"]})
    assert dry["envelope"]["payload"] is None and dry["decision"]["queue"] == "work"


async def test_a_body_at_the_limit_is_json_everywhere(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    payload = issue_payload(extra=nested(MAX_JSON_DEPTH - 1))  # the object itself is the first level
    resp = await post_github(stack.http, webhook, payload)
    assert resp.status_code == 202 and resp.json()["created"] == 1
    event = await agent.ok("get_webhook_event", {"event_id": resp.json()["event_id"]})
    assert event["payload_encoding"] == "json" and event["payload"] == payload
    todo = await agent.ok("get_todo", {"todo_id": resp.json()["todos"][0]["id"]})
    assert todo["todo"]["payload"] == payload


# -- verb arguments: decided at the door --------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 300, 5000])
async def test_every_verb_refuses_arguments_past_the_limit_before_anything_runs(stack: Stack, depth: int) -> None:
    agent = await stack.agent()
    body = ('{"x": ' + deep_text(depth - 1) + "}").encode()
    expected = {"code": "too_deep", "message": f"body is nested deeper than {MAX_JSON_DEPTH} levels"}
    for name in REGISTRY:
        resp = await stack.http.post(
            f"/v1/{name}", content=body, headers={"Authorization": f"Bearer {agent.credential}"}
        )
        assert resp.status_code == 422 and resp.json()["error"] == expected, (name, resp.text[:200])
    admin = {"Authorization": f"Bearer {stack.settings.admin_token}"}
    for name in ADMIN_VERBS:
        resp = await stack.http.post(f"/admin/v1/{name}", content=body, headers=admin)
        assert resp.status_code == 422 and resp.json()["error"] == expected, (name, resp.text[:200])


async def test_mcp_arguments_past_the_limit_are_refused_too(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    async with mcp_session(live_stack.base_url, agent.credential) as session:
        err = error_of(await session.call_tool("complete", {"todo_id": "td_x", "result": nested(MAX_JSON_DEPTH)}))
        assert err == {"code": "too_deep", "message": f"arguments is nested deeper than {MAX_JSON_DEPTH} levels"}
        assert structured(await session.call_tool("whoami", {}))["endpoint_id"] == agent.endpoint_id
    # Deeper than the SDK itself parses: its JSON-RPC parse error, an answer all the same.
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {agent.credential}",
    }
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    async with httpx.AsyncClient(base_url=live_stack.base_url, timeout=30) as http:
        opened = await http.post("/mcp", json=init, headers=headers)
        session_headers = {**headers, "mcp-session-id": opened.headers["mcp-session-id"]}
        await http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session_headers)
        call = (
            '{"jsonrpc": "2.0", "id": 2, "method": "tools/call",'
            ' "params": {"name": "complete", "arguments": {"todo_id": "td_x", "result": ' + deep_text(5000) + "}}}"
        )
        resp = await http.post("/mcp", content=call.encode(), headers=session_headers)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == -32700, resp.text[:300]


async def test_a_write_that_later_reads_could_not_answer_is_refused_before_it_is_applied(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    hook_id = webhook["webhook_id"]
    deep = nested(300)
    saved = await agent.ok("list_webhook_rules", {"webhook_id": hook_id})
    # Rule params: refused, the configuration unchanged, deliveries still routed (not pending on load_grant).
    resp = await agent.call("set_webhook_rules", {"webhook_id": hook_id, "rules": [], "params": {"deep": deep}})
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "too_deep"
    assert await agent.ok("list_webhook_rules", {"webhook_id": hook_id}) == saved
    delivered = await post_github(stack.http, webhook, issue_payload())
    assert delivered.status_code == 202 and delivered.json()["created"] == 1
    # A todo's result: refused, the todo still held and readable.
    claimed = await agent.ok("claim_next", {})
    todo_id = claimed["todo"]["id"]
    for verb in ("complete", "fail"):
        resp = await agent.call(verb, {"todo_id": todo_id, "result": deep})
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "too_deep", verb
    assert (await agent.ok("get_todo", {"todo_id": todo_id}))["todo"]["state"] == "claimed"
    # A schedule's payload: refused, no schedule created behind the caller's back.
    resp = await agent.call(
        "create_schedule", {"cron": "@daily", "webhook_id": hook_id, "title": "t", "payload": {"deep": deep}}
    )
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "too_deep"
    assert (await agent.ok("list_schedules", {}))["schedules"] == []
    # At the limit every one of them is written and read back.
    fits = nested(MAX_JSON_DEPTH - 2)  # inside {"result": …}, inside the arguments object
    assert (await agent.call("complete", {"todo_id": todo_id, "result": {"r": fits}})).status_code == 200
    assert (await agent.ok("get_todo", {"todo_id": todo_id}))["todo"]["result"] == {"r": fits}
    params = {"p": nested(MAX_JSON_DEPTH - 3)}  # inside {"params": …}, inside the arguments object
    await agent.ok("set_webhook_rules", {"webhook_id": hook_id, "rules": [], "params": params})
    assert (await agent.ok("list_webhook_rules", {"webhook_id": hook_id}))["params"] == params
    again = await post_github(stack.http, webhook, issue_payload(number=8))
    assert again.status_code == 202 and again.json()["created"] == 1


# -- verb bodies: every refusal a 422 that says why ------------------------------------------------------------


async def test_bodies_that_are_not_json_are_422s_that_say_why(stack: Stack) -> None:
    agent = await stack.agent()
    auth = {"Authorization": f"Bearer {agent.credential}"}
    cases = {
        b'{\n  "queue": }': "body is not JSON: Expecting value at line 2 column 12",
        b'{"queue": "\xed\xa0\x80"}': "body is not UTF-8 text (byte 11 of 16)",
        b"\xff\xfe{}": "body is not UTF-8 text (byte 0 of 4)",
        b'{"limit": ' + b"9" * 5000 + b"}": "body is not JSON this API accepts: an integer has more than 4300 digits",
        b'{"limit": NaN}': "body is not JSON this API accepts: NaN is not JSON",
        b'{"limit": -Infinity}': "body is not JSON this API accepts: -Infinity is not JSON",
    }
    for body, message in cases.items():
        resp = await stack.http.post("/v1/list_todos", content=body, headers=auth)
        assert resp.status_code == 422, (body[:40], resp.text)
        assert resp.json()["error"] == {"code": "invalid_argument", "message": message}
    admin = {"Authorization": f"Bearer {stack.settings.admin_token}"}
    resp = await stack.http.post("/admin/v1/create_human", content=b"\xff", headers=admin)
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument"


def _boolean_fields() -> list[tuple[str, str]]:
    found = []
    for name, v in VERBS.items():
        for field, schema in v.input.model_json_schema().get("properties", {}).items():
            if schema.get("type") == "boolean":
                found.append((name, field))
    return found


def test_every_boolean_argument_refuses_strings_and_numbers() -> None:
    fields = _boolean_fields()
    assert ("rotate_webhook", "new_ingest_token") in fields and len(fields) >= 6
    for name, field in fields:
        for wrong in ("true", "yes", 1, 0):
            with pytest.raises(ValidationError) as info:
                VERBS[name].input.model_validate({field: wrong})
            assert any(e["loc"] == (field,) and e["type"] == "bool_type" for e in info.value.errors()), (name, field)


async def test_a_string_new_ingest_token_is_refused_and_changes_nothing(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    resp = await agent.call("rotate_webhook", {"webhook_id": webhook["webhook_id"], "new_ingest_token": "false"})
    assert resp.status_code == 422 and resp.json()["error"] == {
        "code": "invalid_argument",
        "message": "new_ingest_token: Input should be a valid boolean",
    }
    (listed,) = (await agent.ok("list_webhooks", {}))["webhooks"]
    assert listed["ingest_url"] == webhook["ingest_url"]


# -- errors that explain (issue 27) -------------------------------------------------------------------------------


async def test_an_unknown_verb_names_the_nearest_on_every_surface(live_stack: Stack) -> None:
    stack = live_stack
    agent = await stack.agent()
    resp = await agent.call("claim_nxt", {})
    assert resp.status_code == 404
    expected = {"code": "unknown_verb", "message": 'unknown verb "claim_nxt"; the nearest: claim_next, claim'}
    assert resp.json()["error"] == expected
    async with mcp_session(stack.base_url, agent.credential) as session:
        assert error_of(await session.call_tool("claim_nxt", {})) == expected
    admin = await stack.http.post(
        "/admin/v1/create_humans", json={}, headers={"Authorization": f"Bearer {stack.settings.admin_token}"}
    )
    assert admin.status_code == 404 and admin.json()["error"] == {
        "code": "unknown_verb",
        "message": 'unknown verb "create_humans"; the nearest: create_human, create_agent, list_humans',
    }
    far = await agent.call("zzzzzz", {})
    assert far.json()["error"] == {"code": "unknown_verb", "message": 'unknown verb "zzzzzz"; /docs lists every verb'}
    # Any other unknown path stays a plain not_found.
    other = await stack.http.get("/nothing/here")
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"


async def test_a_wrong_method_is_405_method_not_allowed_with_allow(stack: Stack) -> None:
    agent = await stack.agent()
    auth = {"Authorization": f"Bearer {agent.credential}"}
    for method, path, allow, headers in (
        ("GET", "/v1/claim", "POST", auth),
        ("GET", "/admin/v1/create_human", "POST", {}),
        ("GET", "/webhooks/w/0123456789abcdef0123456789abcdef", "POST", {}),
        ("POST", "/healthz", "GET", {}),
    ):
        resp = await stack.http.request(method, path, headers=headers)
        assert resp.status_code == 405, (path, resp.text)
        assert resp.headers["allow"] == allow, path
        assert resp.json()["error"] == {
            "code": "method_not_allowed",
            "message": f"{method} is not allowed here; allowed: {allow}",
        }


async def test_every_401_carries_an_rfc_6750_challenge_with_the_reason(live_stack: Stack) -> None:
    stack = live_stack
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as http:
        cases = [
            ("/v1/whoami", {}, "missing bearer credential"),
            ("/v1/whoami", {"Authorization": "Bearer sbk_" + "0" * 64}, None),
            ("/admin/v1/list_humans", {}, "admin token required"),
            ("/admin/v1/list_humans", {"Authorization": "Bearer nope"}, "admin token required"),
            ("/mcp", {"Accept": "application/json, text/event-stream"}, "missing bearer credential"),
        ]
        for path, headers, message in cases:
            resp = await http.post(path, json={}, headers=headers)
            assert resp.status_code == 401, (path, resp.text)
            error = resp.json()["error"]
            assert error["code"] == "unauthenticated"
            if message is not None:
                assert error["message"] == message
            assert resp.headers["www-authenticate"] == (
                f'Bearer error="invalid_token", error_description="{error["message"]}"'
            ), path


async def test_another_tenants_reroute_and_an_unknown_one_never_reach_temporal(stack: Stack) -> None:
    owner = await stack.agent()
    other = await stack.agent()
    webhook = await owner.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    delivered = await post_github(stack.http, webhook, issue_payload())
    event_id = delivered.json()["event_id"]
    started = await owner.ok("reroute_webhook_event", {"event_id": event_id, "wait_seconds": 30})
    workflow_id = started["workflow_id"]
    assert (await owner.ok("get_reroute", {"workflow_id": workflow_id}))["status"] == "completed"
    unknown_event = f"reroute-ev_{'0' * 24}-{workflow_id.rsplit('-', 1)[1]}"
    unknown_batch = f"reroute-batch-wh_{'0' * 24}"
    services = stack.app.state.services
    temporal, services.temporal = services.temporal, None
    try:
        # Without Temporal at all, the answers for another tenant's ids and unknown ids are the same not_found:
        # ownership is decided from the id, in one query, before Temporal is asked (no timing to tell them apart).
        for caller, wid in (
            (other, workflow_id),
            (other, batch_of(webhook)),
            (owner, unknown_event),
            (owner, unknown_batch),
        ):
            resp = await caller.call("get_reroute", {"workflow_id": wid})
            assert resp.status_code == 404, (wid, resp.text)
            assert resp.json()["error"] == {"code": "not_found", "message": "unknown re-route"}
        mine = await owner.call("get_reroute", {"workflow_id": workflow_id})
        assert mine.status_code == 503 and mine.json()["error"]["code"] == "unavailable"
    finally:
        services.temporal = temporal


def batch_of(webhook: dict[str, Any]) -> str:
    return f"reroute-batch-{webhook['webhook_id']}"


async def test_messages_about_rules_name_the_index_and_the_id(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    rules = [
        {"id": "first", "expr": "true", "action": {"queue": "work"}},
        {"id": "second", "expr": ".payload |", "action": {"queue": "work"}},
    ]
    resp = await agent.call("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": rules})
    assert resp.status_code == 422
    assert resp.json()["error"]["message"].startswith('rule index 1 (id "second"): ')

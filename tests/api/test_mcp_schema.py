"""MCP tools a model can use well: described parameters, enums, bounds, typed rules, annotations; the documented client."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_types import Tool

from api.verbs import ADMIN_VERBS, REGISTRY
from api.verbs.admin import AdminInput
from routing.sources import RESERVED_SOURCES, SOURCE_TYPES
from store.todos import MAX_LEASE_SECONDS
from tests.api.test_doorbell import github_hook, hub_of, ingest
from tests.api.test_mcp import error_of, mcp_session, structured
from tests.conftest import Stack
from tests.helpers import eventually

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"

READ_ONLY = {
    "whoami",
    "list_todos",
    "get_todo",
    "list_webhooks",
    "list_webhook_rules",
    "list_webhook_routes",
    "list_webhook_events",
    "get_webhook_event",
    "list_schedules",
    "test_webhook_rules",
    "backtest_webhook_rules",
    "compile_webhook_rule",
}
DESTRUCTIVE = {
    "delete_webhook",
    "rotate_webhook",
    "delete_schedule",
    "remove_webhook_rule",
    "remove_webhook_route",
    "set_webhook_rules",
    "update_webhook_rule",
    "configure_webhook",
}
IDEMPOTENT_WRITES = {
    "claim",
    "complete",
    "fail",
    "release",
    "delete_webhook",
    "delete_schedule",
    "add_webhook_route",
    "remove_webhook_route",
    "move_webhook_rule",
    "update_webhook_rule",
    "remove_webhook_rule",
}
# Writes whose repeat has a further effect (a second webhook, a new secret, another todo, a later lease).
REPEATABLE_WRITES = {
    "create_webhook",
    "create_schedule",
    "rotate_webhook",
    "claim_next",
    "heartbeat",
    "add_webhook_rule",
    "set_webhook_rules",
    "configure_webhook",
}


def undescribed(schema: Any, path: str = "") -> Iterator[str]:
    """Every property, anywhere in the schema ($defs included), that has no description."""
    if isinstance(schema, dict):
        for name, prop in (schema.get("properties") or {}).items():
            if not (isinstance(prop, dict) and isinstance(prop.get("description"), str) and prop["description"]):
                yield f"{path}.{name}"
        for key, value in schema.items():
            yield from undescribed(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from undescribed(value, f"{path}[{i}]")


TYPED = ("type", "$ref", "anyOf", "oneOf", "enum", "const")
ANY_JSON = ["object", "array", "string", "number", "boolean", "null"]


def untyped(schema: Any, path: str = "") -> Iterator[str]:
    """Every property, anywhere in the schema ($defs included), that does not say what it holds."""
    if isinstance(schema, dict):
        for name, prop in (schema.get("properties") or {}).items():
            if not (isinstance(prop, dict) and any(key in prop for key in TYPED)):
                yield f"{path}.{name}"
        for key, value in schema.items():
            yield from untyped(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from untyped(value, f"{path}[{i}]")


def resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Follow a local $ref."""
    while "$ref" in node:
        *_, name = node["$ref"].split("/")
        node = root["$defs"][name]
    return node


def branches(root: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of a property, references resolved."""
    node = resolve(root, node)
    options = node.get("anyOf") or node.get("oneOf") or [node]
    return [resolve(root, o) for o in options if o.get("type") != "null"]


def prop(tool: Tool, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the input schema, the named property's one non-null branch)."""
    schema = tool.input_schema
    [branch] = branches(schema, schema["properties"][name])
    return schema, branch


async def listed_tools(stack: Stack) -> dict[str, Tool]:
    agent = await stack.agent()
    async with mcp_session(stack.base_url, agent.credential) as session:
        return {t.name: t for t in (await session.list_tools()).tools}


async def test_every_tool_parameter_is_described(live_stack: Stack) -> None:
    tools = await listed_tools(live_stack)
    assert set(tools) == set(REGISTRY)
    missing = [f"{name}{p}" for name, tool in tools.items() for p in undescribed(tool.input_schema)]
    assert missing == []
    assert all(tool.description for tool in tools.values())


async def test_every_field_of_every_tool_verb_and_answer_says_what_it_holds(live_stack: Stack) -> None:
    tools = await listed_tools(live_stack)
    missing = [
        f"{name} {side}{p}"
        for name, tool in tools.items()
        for side, schema in (("input", tool.input_schema), ("output", tool.output_schema))
        for p in untyped(schema)
    ]
    # Every tool answers a typed object (claim_next's shape depends on max, and is still typed).
    assert [name for name, tool in tools.items() if (tool.output_schema or {}).get("type") != "object"] == []
    assert all(tool.output_schema and tool.output_schema["properties"] for tool in tools.values())
    for name, v in {**REGISTRY, **ADMIN_VERBS}.items():
        missing += [f"{name} input{p}" for p in untyped(v.input.model_json_schema())]
        missing += [f"{name} output{p}" for p in untyped(v.output.model_json_schema(mode="serialization"))]
    spec = (await live_stack.http.get("/openapi.json")).json()
    missing += [f"openapi{p}" for p in untyped(spec)]
    assert missing == []
    # Fields that take any JSON value by design say so, with every JSON type.
    for name, side, field in (
        ("complete", "input", "result"),
        ("fail", "input", "result"),
        ("test_webhook_rules", "input", "payload"),
        ("create_schedule", "input", "payload"),
        ("get_webhook_event", "output", "payload"),
    ):
        tool = tools[name]
        schema = tool.input_schema if side == "input" else tool.output_schema
        assert schema is not None
        held = schema["properties"][field]
        assert held["type"] == ANY_JSON and held["description"], (name, field)
    claimed = tools["claim_next"].output_schema
    assert claimed is not None
    todo = resolve(claimed, claimed["$defs"]["TodoOut"])
    assert todo["properties"]["result"]["type"] == ANY_JSON and todo["properties"]["payload"]["type"] == ANY_JSON
    assert set(claimed["properties"]) == {"empty", "todo", "todos"}


def test_every_admin_verb_parameter_is_described() -> None:
    inputs = AdminInput.__subclasses__()
    assert len(inputs) >= 6
    missing = [f"{model.__name__}{p}" for model in inputs for p in undescribed(model.model_json_schema())]
    assert missing == []
    [vend_model] = [m for m in inputs if m.__name__ == "VendEndpointInput"]
    items = vend_model.model_json_schema()["properties"]["webhook_source_types"]["items"]
    assert items["enum"] == list(SOURCE_TYPES)


async def test_closed_sets_are_enums_and_bounds_are_in_the_schema(live_stack: Stack) -> None:
    tools = await listed_tools(live_stack)
    _, source_type = prop(tools["create_webhook"], "source_type")
    assert source_type["enum"] == list(SOURCE_TYPES)
    assert not set(RESERVED_SOURCES) & set(source_type["enum"])
    _, state = prop(tools["list_todos"], "state")
    assert state["enum"] == ["pending", "claimed", "done", "failed", "canceled"]
    _, disposition = prop(tools["list_webhook_events"], "disposition")
    assert disposition["enum"] == ["routed", "dropped", "repeat", "faulted", "quarantined"]
    for name in ("claim", "claim_next", "heartbeat"):
        _, lease = prop(tools[name], "lease_seconds")
        assert (lease["minimum"], lease["maximum"]) == (1, MAX_LEASE_SECONDS), name
    for name, most in (("list_todos", 500), ("list_webhook_events", 200), ("backtest_webhook_rules", 200)):
        _, limit = prop(tools[name], "limit")
        assert (limit["minimum"], limit["maximum"]) == (1, most), name


async def test_rules_and_actions_have_typed_schemas(live_stack: Stack) -> None:
    tools = await listed_tools(live_stack)
    schema, rules = prop(tools["set_webhook_rules"], "rules")
    assert rules["type"] == "array" and rules["maxItems"] == 32
    rule = resolve(schema, rules["items"])
    assert set(rule["properties"]) == {"id", "name", "expr", "action"}
    assert rule["required"] == ["expr", "action"] and rule["additionalProperties"] is False
    queue, drop, quarantine = branches(schema, rule["properties"]["action"])
    assert set(queue["properties"]) == {"queue", "endpoints", "exclusive", "once", "work_order", "coalesce"}
    assert queue["required"] == ["queue"] and queue["additionalProperties"] is False
    assert set(drop["properties"]) == {"drop"} and drop["properties"]["drop"]["const"] is True
    assert set(quarantine["properties"]) == {"quarantine"} and quarantine["properties"]["quarantine"]["const"] is True
    for name, field in (("add_webhook_rule", "rule"), ("update_webhook_rule", "rule")):
        schema, shape = prop(tools[name], field)
        assert {"id", "name", "expr", "action"} == set(shape["properties"]), name
    schema = tools["set_webhook_rules"].input_schema
    default = schema["properties"]["default_action"]
    assert [b["required"] for b in branches(schema, default)] == [["queue"], ["drop"], ["quarantine"]]


async def test_schemas_advertise_without_replacing_the_routing_codes(live_stack: Stack) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    async with mcp_session(live_stack.base_url, agent.credential) as session:
        # A rule the typed schema calls malformed still reaches routing/rules.py and gets its code.
        bad = {"webhook_id": hook["webhook_id"], "rules": [{"expr": 5, "action": {"queue": "work"}}]}
        err = error_of(await session.call_tool("set_webhook_rules", bad))
        assert err["code"] == "invalid_rule" and err["message"].startswith("rule index 0")
        many = [{"expr": "true", "action": {"queue": "work"}}] * 33
        err = error_of(await session.call_tool("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": many}))
        assert err["code"] == "too_many_rules"
        # The source-type enum is advertised; the store still answers a reserved type with its own code.
        err = error_of(await session.call_tool("create_webhook", {"source_type": "schedule", "target_queue": "work"}))
        assert err["code"] == "forbidden_source_type"
        # The lease maximum is the one that takes effect: a longer lease is clamped, as documented.
        await ingest(live_stack, hook)
        todo = structured(await session.call_tool("claim_next", {"lease_seconds": 10 * MAX_LEASE_SECONDS}))["todo"]
        held = live_stack.sql(
            "SELECT extract(epoch FROM lease_expires_at - claimed_at) FROM todos WHERE id = %s", todo["id"]
        )[0][0]
        assert float(held) == pytest.approx(MAX_LEASE_SECONDS, abs=5)


async def test_annotations_and_titles_come_from_the_registry(live_stack: Stack) -> None:
    tools = await listed_tools(live_stack)
    for name, tool in tools.items():
        hints = REGISTRY[name].hints
        notes = tool.annotations
        assert notes is not None, name
        assert tool.title and notes.title == tool.title == REGISTRY[name].title, name
        assert (notes.read_only_hint, notes.destructive_hint, notes.idempotent_hint) == (
            hints.read_only,
            hints.destructive,
            hints.idempotent,
        ), name
        assert notes.open_world_hint is False, name
        assert not (notes.read_only_hint and notes.destructive_hint), name
        # Verb classes by name hold for verbs added later too.
        if re.match(r"(list|get)_", name):
            assert notes.read_only_hint, name
        if re.match(r"(delete|remove|rotate)_", name):
            assert notes.destructive_hint and not notes.read_only_hint, name
    assert tools["list_todos"].title == "List todos"
    known = READ_ONLY | DESTRUCTIVE | IDEMPOTENT_WRITES | REPEATABLE_WRITES
    for name in known & set(tools):
        notes = tools[name].annotations
        assert notes is not None
        assert notes.read_only_hint is (name in READ_ONLY), name
        assert notes.destructive_hint is (name in DESTRUCTIVE), name
        if name not in READ_ONLY:
            assert notes.idempotent_hint is (name in IDEMPOTENT_WRITES), name
    assert known >= {"whoami", "claim", "complete", "create_webhook", "delete_webhook"}


def readme_client() -> str:
    """The API reference's MCP client example, verbatim."""
    text = API_DOC.read_text()
    marker = text.index("<!-- example: mcp-doorbell-client -->")
    found = re.compile(r"```python\n(.*?)```", re.S).search(text, marker)
    assert found is not None
    return found.group(1)


async def test_the_readme_client_receives_a_doorbell_and_completes_the_todo(
    live_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = await live_stack.agent()
    hook = await github_hook(agent)
    example: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(readme_client(), "docs/api.md#mcp-doorbell-client", "exec"), example)
    handled: list[dict[str, Any]] = []

    async def handle(todo: dict[str, Any]) -> Any:
        handled.append(todo)
        return {"handled": todo["id"]}

    task = asyncio.create_task(example["serve"](live_stack.base_url, agent.credential, handle))
    try:
        await eventually(lambda: hub_of(live_stack).listeners(agent.endpoint_id, "mcp") == 1 or task.done())
        assert not task.done()
        _, todo_id = await ingest(live_stack, hook)
        await eventually(lambda: f"ring: {todo_id}" in capsys.readouterr().out)
        await eventually(
            lambda: live_stack.sql("SELECT state FROM todos WHERE id = %s", todo_id)[0][0] == "done" or task.done()
        )
        assert not task.done()
        assert [t["id"] for t in handled] == [todo_id]
        [result] = live_stack.sql("SELECT result FROM todos WHERE id = %s", todo_id)[0]
        assert result == {"handled": todo_id}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

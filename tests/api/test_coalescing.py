"""Entity-level coalescing: deliveries about one open subject attach to its todo instead of minting another."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from routing.rules import parse_action
from tests.conftest import Stack
from tests.helpers import issue_payload, post_github, token_of

COALESCE_RULES = [{"id": "issues", "expr": ".issue != null", "action": {"queue": "work", "coalesce": True}}]


def _set_rules(stack: Stack, webhook_id: str, rules: list[dict[str, Any]] | None, default: Any = None) -> None:
    stack.sql(
        "UPDATE endpoint_webhooks SET routing_rules = %s, routing_default_action = %s WHERE id = %s",
        Jsonb(rules or []),
        Jsonb(default) if default is not None else None,
        webhook_id,
    )


def _doorbells(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return [json.loads(n.payload) for n in conn.notifies(timeout=0.5)]


async def test_three_deliveries_about_one_issue_make_one_todo_with_two_updates(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    _set_rules(stack, webhook["webhook_id"], COALESCE_RULES)

    with psycopg.connect(stack.database_url, autocommit=True) as listener:
        listener.execute("LISTEN switchboard_todos")
        first = await post_github(stack.http, webhook, issue_payload(number=7), delivery="c-1")
        edited = await post_github(stack.http, webhook, issue_payload(number=7, action="edited"), delivery="c-2")
        labeled = await post_github(stack.http, webhook, issue_payload(number=7, action="labeled"), delivery="c-3")
        rang = _doorbells(listener)
    assert [r.status_code for r in (first, edited, labeled)] == [202, 202, 202]
    [todo] = first.json()["todos"]
    assert first.json()["created"] == 1 and todo["created"] is True
    for later in (edited, labeled):
        assert later.json()["created"] == 0 and "duplicate" not in later.json()
        assert later.json()["todos"] == [{**todo, "created": False}]
    assert [r["todo_id"] for r in rang] == [todo["id"]]  # the doorbell rang once, for the mint

    got = (await agent.ok("get_todo", {"todo_id": todo["id"]}))["todo"]
    assert got["update_event_ids"] == [edited.json()["event_id"], labeled.json()["event_id"]]
    assert got["event_id"] == first.json()["event_id"]
    for later in (edited, labeled):
        [(trace, disposition, todo_ids)] = stack.sql(
            "SELECT routing_trace, disposition, todo_ids FROM events WHERE id = %s", later.json()["event_id"]
        )
        assert trace["coalesced"] == {"todo_id": todo["id"]} and trace["subject_key"] == "github:acme/app#7"
        assert disposition == "routed" and todo_ids == [todo["id"]]
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1

    # A redelivery of a coalesced delivery is a duplicate, and attaches nothing twice.
    again = await post_github(stack.http, webhook, issue_payload(number=7, action="edited"), delivery="c-2")
    assert again.json()["duplicate"] is True and again.json()["todos"] == [{**todo, "created": False}]
    # Another issue is another subject.
    other = await post_github(stack.http, webhook, issue_payload(number=8), delivery="c-8")
    assert other.json()["created"] == 1

    # Claimed is still open: updates keep attaching.
    claimed = await agent.ok("claim", {"todo_id": todo["id"]})
    assert claimed["todo"]["state"] == "claimed"
    while_claimed = await post_github(stack.http, webhook, issue_payload(number=7, action="reopened"), delivery="c-4")
    assert while_claimed.json()["todos"] == [{**todo, "created": False}]
    await agent.ok("complete", {"todo_id": todo["id"]})

    # Done closes the subject: the next delivery mints a new todo and rings again.
    after = await post_github(stack.http, webhook, issue_payload(number=7, action="closed"), delivery="c-5")
    assert after.json()["created"] == 1 and after.json()["todos"][0]["id"] != todo["id"]
    final = (await agent.ok("get_todo", {"todo_id": todo["id"]}))["todo"]
    assert len(final["update_event_ids"]) == 3 and final["state"] == "done"


async def test_concurrent_deliveries_about_one_new_issue_mint_once(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    _set_rules(stack, webhook["webhook_id"], COALESCE_RULES)
    responses = await asyncio.gather(
        *(post_github(stack.http, webhook, issue_payload(number=11), delivery=f"race-{i}") for i in range(6))
    )
    assert all(r.status_code == 202 for r in responses)
    assert sum(r.json()["created"] for r in responses) == 1
    assert len({r.json()["todos"][0]["id"] for r in responses}) == 1
    [(updates,)] = stack.sql("SELECT update_event_ids FROM todos")
    assert len(updates) == 5


async def test_generic_subject_path_coalesces_under_a_default_action(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    await agent.ok(
        "configure_webhook", {"webhook_id": webhook["webhook_id"], "collector": {"subject_path": "ticket.id"}}
    )
    # No rules at all: the default action alone asks for coalescing.
    _set_rules(stack, webhook["webhook_id"], None, default={"queue": "work", "coalesce": True})
    url = f"/webhooks/w/{token_of(webhook['ingest_url'])}"
    one = await stack.http.post(url, json={"ticket": {"id": 501}, "status": "new"})
    two = await stack.http.post(url, json={"ticket": {"id": 501}, "status": "assigned"})
    other = await stack.http.post(url, json={"ticket": {"id": 502}})
    keyless = await stack.http.post(url, json={"no": "ticket"})
    assert one.json()["created"] == 1 and two.json()["created"] == 0
    assert two.json()["todos"][0]["id"] == one.json()["todos"][0]["id"]
    assert other.json()["created"] == 1 and keyless.json()["created"] == 1
    [(trace,)] = stack.sql("SELECT routing_trace FROM events WHERE id = %s", two.json()["event_id"])
    assert trace["subject_key"] == f"generic:{webhook['webhook_id']}:501"
    assert trace["coalesced"] == {"todo_id": one.json()["todos"][0]["id"]}


async def test_without_the_flag_every_delivery_mints(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    a = await post_github(stack.http, webhook, issue_payload(number=7), delivery="n-1")
    b = await post_github(stack.http, webhook, issue_payload(number=7, action="edited"), delivery="n-2")
    assert a.json()["created"] == 1 and b.json()["created"] == 1


@pytest.mark.parametrize(
    ("action", "ok"),
    [
        ({"queue": "work", "coalesce": True}, True),
        ({"queue": "work", "coalesce": False, "once": True}, True),
        ({"queue": "work", "coalesce": "yes"}, False),
        ({"drop": True, "coalesce": True}, False),
    ],
)
def test_coalesce_is_validated_like_the_other_queue_flags(action: dict[str, Any], ok: bool) -> None:
    if ok:
        assert parse_action(action) == action
    else:
        with pytest.raises(ValueError):
            parse_action(action)

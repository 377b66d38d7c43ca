"""Route verbs (SPEC-0006 "Webhook Route Fan-Out Under Ownership and Friendship"), through HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Agent, Stack
from tests.helpers import issue_payload, post_github


async def _webhook(agent: Agent) -> dict[str, Any]:
    return await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})


def _routes(stack: Stack, webhook_id: str) -> list[str]:
    return [r[0] for r in stack.sql("SELECT target_endpoint_id FROM webhook_routes WHERE webhook_id = %s", webhook_id)]


async def _deliver(stack: Stack, webhook: dict[str, Any], delivery: str) -> list[dict[str, Any]]:
    resp = await post_github(stack.http, webhook, issue_payload(), delivery=delivery)
    assert resp.status_code == 202, resp.text
    todos: list[dict[str, Any]] = resp.json()["todos"]
    return todos


async def test_route_to_own_second_endpoint_fans_out_one_todo_per_target(stack: Stack) -> None:
    human = await stack.human()
    first = await stack.agent(human)
    second = await stack.agent(human, queues=["elsewhere"])
    webhook = await _webhook(first)

    added = await first.ok(
        "add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": second.endpoint_id}
    )
    assert added == {
        "webhook_id": webhook["webhook_id"],
        "target_endpoint_id": second.endpoint_id,
        "implicit": False,
        "changed": True,
    }
    listed = await first.ok("list_webhook_routes", {"webhook_id": webhook["webhook_id"]})
    assert [(r["endpoint_id"], r["implicit"], r["live"]) for r in listed["routes"]] == [
        (first.endpoint_id, True, True),
        (second.endpoint_id, False, True),
    ]
    assert listed["routes"][0]["granted_at"] is None and listed["routes"][1]["granted_at"]

    todos = await _deliver(stack, webhook, "d-1")
    assert [(t["endpoint_id"], t["queue"]) for t in todos] == [
        (first.endpoint_id, "work"),
        (second.endpoint_id, "work"),
    ]
    rows = stack.sql("SELECT endpoint_id FROM todos ORDER BY endpoint_id")
    assert sorted(r[0] for r in rows) == sorted([first.endpoint_id, second.endpoint_id])
    # Each todo is pinned to its own endpoint: neither sees the other's.
    [(mine,)] = stack.sql("SELECT id FROM todos WHERE endpoint_id = %s", first.endpoint_id)
    resp = await second.call("get_todo", {"todo_id": mine})
    assert resp.status_code == 404


async def test_a_sibling_endpoint_of_the_same_human_may_manage_routes(stack: Stack) -> None:
    """Ownership is by human: any endpoint of the webhook owner's human may route it."""
    human = await stack.human()
    owner, sibling = await stack.agent(human), await stack.agent(human)
    webhook = await _webhook(owner)
    await sibling.ok(
        "add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": sibling.endpoint_id}
    )
    assert _routes(stack, webhook["webhook_id"]) == [sibling.endpoint_id]


@pytest.mark.parametrize("edge", [None, "pending", "denied", "revoked", "reverse"])
async def test_other_human_without_approved_edge_is_forbidden_identically(stack: Stack, edge: str | None) -> None:
    mine = await stack.agent()
    theirs = await stack.agent()
    webhook = await _webhook(mine)
    if edge == "reverse":
        # B approved handing work to A; that says nothing about A's deliveries into B.
        await stack.admin(
            "set_friend_edge", {"from_human_id": theirs.human_id, "to_human_id": mine.human_id, "state": "approved"}
        )
    elif edge is not None:
        await stack.admin(
            "set_friend_edge", {"from_human_id": mine.human_id, "to_human_id": theirs.human_id, "state": edge}
        )
    refused = await mine.call(
        "add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": theirs.endpoint_id}
    )
    unknown = await mine.call(
        "add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": "ep_000000000000000000000000"}
    )
    malformed = await mine.call(
        "add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": "'; drop table x; --"}
    )
    assert refused.status_code == unknown.status_code == malformed.status_code == 403
    assert refused.json() == unknown.json() == malformed.json()
    assert refused.json()["error"]["code"] == "forbidden"
    assert _routes(stack, webhook["webhook_id"]) == []


async def test_approved_edge_authorizes_and_revoked_target_endpoint_is_forbidden_identically(stack: Stack) -> None:
    mine = await stack.agent()
    theirs = await stack.agent()
    gone = await stack.agent(mine.human_id)
    await stack.admin("revoke_endpoint", {"endpoint_id": gone.endpoint_id})
    await stack.admin(
        "set_friend_edge", {"from_human_id": mine.human_id, "to_human_id": theirs.human_id, "state": "approved"}
    )
    webhook = await _webhook(mine)
    await mine.ok("add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": theirs.endpoint_id})
    revoked = await mine.call(
        "add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": gone.endpoint_id}
    )
    unknown = await mine.call(
        "add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": "ep_nope"}
    )
    assert revoked.status_code == 403 and revoked.json() == unknown.json()
    assert _routes(stack, webhook["webhook_id"]) == [theirs.endpoint_id]
    todos = await _deliver(stack, webhook, "d-1")
    assert [t["endpoint_id"] for t in todos] == [mine.endpoint_id, theirs.endpoint_id]


@pytest.mark.parametrize("verb", ["add_webhook_route", "list_webhook_routes", "remove_webhook_route"])
async def test_foreign_unknown_and_malformed_webhooks_are_one_not_found(stack: Stack, verb: str) -> None:
    mine = await stack.agent()
    theirs = await stack.agent()
    foreign = await _webhook(theirs)
    # Even a friend edge both ways grants no say over the other human's webhook.
    for a, b in ((mine, theirs), (theirs, mine)):
        await stack.admin(
            "set_friend_edge", {"from_human_id": a.human_id, "to_human_id": b.human_id, "state": "approved"}
        )

    def body(webhook_id: str) -> dict[str, Any]:
        out = {"webhook_id": webhook_id}
        if verb != "list_webhook_routes":
            out["target_endpoint_id"] = mine.endpoint_id
        return out

    responses = [
        await mine.call(verb, body(foreign["webhook_id"])),
        await mine.call(verb, body("wh_000000000000000000000000")),
        await mine.call(verb, body("not a webhook id")),
    ]
    assert {r.status_code for r in responses} == {404}
    assert responses[0].json() == responses[1].json() == responses[2].json()
    assert responses[0].json()["error"]["code"] == "not_found"
    assert _routes(stack, foreign["webhook_id"]) == []


async def test_deleted_webhook_is_not_found_for_routing(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent)
    await agent.ok("delete_webhook", {"webhook_id": webhook["webhook_id"]})
    resp = await agent.call("list_webhook_routes", {"webhook_id": webhook["webhook_id"]})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


async def test_add_and_remove_are_idempotent_and_the_owner_is_implicit(stack: Stack) -> None:
    human = await stack.human()
    first, second = await stack.agent(human), await stack.agent(human)
    webhook = await _webhook(first)
    route = {"webhook_id": webhook["webhook_id"], "target_endpoint_id": second.endpoint_id}

    assert (await first.ok("add_webhook_route", route))["changed"] is True
    assert (await first.ok("add_webhook_route", route))["changed"] is False
    assert _routes(stack, webhook["webhook_id"]) == [second.endpoint_id]
    todos = await _deliver(stack, webhook, "d-1")
    assert [t["endpoint_id"] for t in todos] == [first.endpoint_id, second.endpoint_id]

    # The owner is always a target: adding it records nothing, removing it changes nothing.
    owner = {"webhook_id": webhook["webhook_id"], "target_endpoint_id": first.endpoint_id}
    assert await first.ok("add_webhook_route", owner) == {**owner, "implicit": True, "changed": False}
    assert await first.ok("remove_webhook_route", owner) == {**owner, "implicit": True, "changed": False}
    assert _routes(stack, webhook["webhook_id"]) == [second.endpoint_id]

    assert (await first.ok("remove_webhook_route", route))["changed"] is True
    assert (await first.ok("remove_webhook_route", route))["changed"] is False
    # Removing a route that never existed (or names nothing at all) is the same end condition.
    assert (await first.ok("remove_webhook_route", {**route, "target_endpoint_id": "ep_nope"}))["changed"] is False
    assert _routes(stack, webhook["webhook_id"]) == []
    listed = await first.ok("list_webhook_routes", {"webhook_id": webhook["webhook_id"]})
    assert [r["endpoint_id"] for r in listed["routes"]] == [first.endpoint_id]
    todos = await _deliver(stack, webhook, "d-2")
    assert [t["endpoint_id"] for t in todos] == [first.endpoint_id]


async def test_revoked_friendship_leaves_the_delivery_set_but_the_route_stays_listed_and_removable(
    stack: Stack,
) -> None:
    mine = await stack.agent()
    theirs = await stack.agent()
    edge = {"from_human_id": mine.human_id, "to_human_id": theirs.human_id}
    await stack.admin("set_friend_edge", {**edge, "state": "approved"})
    webhook = await _webhook(mine)
    route = {"webhook_id": webhook["webhook_id"], "target_endpoint_id": theirs.endpoint_id}
    await mine.ok("add_webhook_route", route)
    assert [t["endpoint_id"] for t in await _deliver(stack, webhook, "d-1")] == [mine.endpoint_id, theirs.endpoint_id]

    await stack.admin("set_friend_edge", {**edge, "state": "revoked"})
    assert [t["endpoint_id"] for t in await _deliver(stack, webhook, "d-2")] == [mine.endpoint_id]
    listed = await mine.ok("list_webhook_routes", {"webhook_id": webhook["webhook_id"]})
    assert [(r["endpoint_id"], r["live"]) for r in listed["routes"]] == [
        (mine.endpoint_id, True),
        (theirs.endpoint_id, False),
    ]
    # Re-adding now needs the friendship again, but the existing route stays removable by the owner.
    resp = await mine.call("add_webhook_route", route)
    assert resp.status_code == 403
    assert (await mine.ok("remove_webhook_route", route))["changed"] is True
    assert _routes(stack, webhook["webhook_id"]) == []


async def test_revoked_target_endpoint_leaves_the_delivery_set_but_stays_listed(stack: Stack) -> None:
    human = await stack.human()
    first, second, third = await stack.agent(human), await stack.agent(human), await stack.agent(human)
    webhook = await _webhook(first)
    for target in (second, third):
        await first.ok(
            "add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": target.endpoint_id}
        )
    assert [t["endpoint_id"] for t in await _deliver(stack, webhook, "d-1")] == [
        first.endpoint_id,
        second.endpoint_id,
        third.endpoint_id,
    ]
    await stack.admin("revoke_endpoint", {"endpoint_id": second.endpoint_id})
    assert [t["endpoint_id"] for t in await _deliver(stack, webhook, "d-2")] == [first.endpoint_id, third.endpoint_id]
    listed = await first.ok("list_webhook_routes", {"webhook_id": webhook["webhook_id"]})
    assert [(r["endpoint_id"], r["live"]) for r in listed["routes"]] == [
        (first.endpoint_id, True),
        (second.endpoint_id, False),
        (third.endpoint_id, True),
    ]
    await first.ok(
        "remove_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": second.endpoint_id}
    )
    assert _routes(stack, webhook["webhook_id"]) == [third.endpoint_id]


async def test_route_verbs_are_in_the_webhooks_family_and_gated_by_the_allowlist(stack: Stack) -> None:
    from api.verbs import REGISTRY

    for name in ("add_webhook_route", "list_webhook_routes", "remove_webhook_route"):
        assert REGISTRY[name].family == "webhooks"
    owner = await stack.agent()
    webhook = await _webhook(owner)
    narrow = await stack.agent(owner.human_id, verbs=["list_webhook_routes"])
    resp = await narrow.call(
        "add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": narrow.endpoint_id}
    )
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden"
    assert _routes(stack, webhook["webhook_id"]) == []
    await narrow.ok("list_webhook_routes", {"webhook_id": webhook["webhook_id"]})

"""Drain verbs against the real queue: claims, leases, retries, scope and authentication."""

from __future__ import annotations

import asyncio
import base64
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from activities.models import UpkeepInput
from tests.conftest import Agent, Stack
from workflows.upkeep import ReapTodos


def seed_todos(stack: Stack, endpoint_id: str, n: int, queue: str = "work") -> list[str]:
    ids = [f"td_seed{i:05d}{uuid.uuid4().hex[:6]}" for i in range(n)]
    for todo_id in ids:
        stack.sql(
            "INSERT INTO todos (id, endpoint_id, queue, source, title, idempotency_key) VALUES (%s, %s, %s, 'generic', 't', %s)",
            todo_id,
            endpoint_id,
            queue,
            todo_id,
        )
    return ids


async def reap(stack: Stack) -> dict[str, int]:
    result = await stack.temporal.execute_workflow(
        ReapTodos.run, UpkeepInput(), id=f"reap-{uuid.uuid4().hex}", task_queue=stack.settings.task_queue
    )
    return result.model_dump()


async def test_two_agents_drain_200_todos_each_claimed_exactly_once(stack: Stack) -> None:
    agent = await stack.agent()
    twin = Agent(
        stack.http,
        {"endpoint_id": agent.endpoint_id, "agent_id": agent.agent_id, "credential": agent.credential},
        agent.human_id,
    )
    ids = seed_todos(stack, agent.endpoint_id, 200)

    async def drain(a: Agent) -> list[str]:
        got: list[str] = []
        while True:
            out = await a.ok("claim_next", {})
            if out["empty"]:
                return got
            got.append(out["todo"]["id"])

    first, second = await asyncio.gather(drain(agent), drain(twin))
    assert sorted(first + second) == sorted(ids)
    assert len(set(first) & set(second)) == 0
    assert stack.sql("SELECT count(*) FROM todos WHERE state = 'claimed' AND attempt = 1")[0][0] == 200


async def test_claim_race_has_one_winner(stack: Stack) -> None:
    agent = await stack.agent()
    [todo_id] = seed_todos(stack, agent.endpoint_id, 1)
    results = await asyncio.gather(*(agent.call("claim", {"todo_id": todo_id}) for _ in range(8)))
    codes = sorted(r.status_code for r in results)
    assert codes == [200] + [409] * 7
    assert all(r.json()["error"]["code"] == "conflict" for r in results if r.status_code == 409)


async def test_expired_lease_is_requeued_by_the_reaper_then_dead_lettered_at_the_cap(stack: Stack) -> None:
    agent = await stack.agent()
    [todo_id] = seed_todos(stack, agent.endpoint_id, 1)
    claimed = await agent.ok("claim", {"todo_id": todo_id, "lease_seconds": 999_999})
    lease = datetime.fromisoformat(claimed["todo"]["lease_expires_at"])
    assert lease - datetime.now(UTC) <= timedelta(seconds=86400)  # clamped to the maximum
    stack.sql("UPDATE todos SET lease_expires_at = now() - interval '1 second' WHERE id = %s", todo_id)
    assert (await reap(stack))["requeued"] == 1
    assert (await agent.ok("get_todo", {"todo_id": todo_id}))["todo"]["state"] == "pending"

    stack.sql("UPDATE todos SET attempt = 4 WHERE id = %s", todo_id)
    await agent.ok("claim", {"todo_id": todo_id})  # attempt 5 of 5
    stack.sql("UPDATE todos SET lease_expires_at = now() - interval '1 second' WHERE id = %s", todo_id)
    assert (await reap(stack))["dead_lettered"] == 1
    todo = (await agent.ok("get_todo", {"todo_id": todo_id}))["todo"]
    assert todo["state"] == "failed" and todo["next_retry_at"] is None


async def test_fail_backs_off_doubling_then_dead_letters(stack: Stack) -> None:
    agent = await stack.agent()
    [todo_id] = seed_todos(stack, agent.endpoint_id, 1)
    expected = [30, 60, 120, 240]
    for attempt, backoff in enumerate(expected, start=1):
        await agent.ok("claim", {"todo_id": todo_id})
        failed = (await agent.ok("fail", {"todo_id": todo_id, "error": "boom"}))["todo"]
        assert failed["state"] == "failed" and failed["attempt"] == attempt
        wait = datetime.fromisoformat(failed["next_retry_at"]) - datetime.fromisoformat(failed["updated_at"])
        assert abs(wait.total_seconds() - backoff) < 2
        # Not due yet: the reaper leaves it parked.
        assert (await reap(stack))["retried"] == 0
        stack.sql("UPDATE todos SET next_retry_at = now() - interval '1 second' WHERE id = %s", todo_id)
        assert (await reap(stack))["retried"] == 1
    await agent.ok("claim", {"todo_id": todo_id})
    dead = (await agent.ok("fail", {"todo_id": todo_id, "error": "boom"}))["todo"]
    assert dead["state"] == "failed" and dead["attempt"] == 5 and dead["next_retry_at"] is None
    assert (await agent.call("claim", {"todo_id": todo_id})).status_code == 409


async def test_backoff_is_capped_at_fifteen_minutes(stack: Stack) -> None:
    agent = await stack.agent()
    [todo_id] = seed_todos(stack, agent.endpoint_id, 1)
    stack.sql("UPDATE todos SET attempt = 7, max_attempts = 10 WHERE id = %s", todo_id)
    await agent.ok("claim", {"todo_id": todo_id})
    failed = (await agent.ok("fail", {"todo_id": todo_id}))["todo"]
    wait = datetime.fromisoformat(failed["next_retry_at"]) - datetime.fromisoformat(failed["updated_at"])
    assert abs(wait.total_seconds() - 900) < 2


async def test_heartbeat_release_and_holder_rules(stack: Stack) -> None:
    agent = await stack.agent()
    [todo_id] = seed_todos(stack, agent.endpoint_id, 1)
    assert (await agent.call("heartbeat", {"todo_id": todo_id})).status_code == 409
    assert (await agent.call("complete", {"todo_id": todo_id})).status_code == 409
    await agent.ok("claim", {"todo_id": todo_id, "lease_seconds": 10})
    beat = (await agent.ok("heartbeat", {"todo_id": todo_id}))["todo"]
    left = datetime.fromisoformat(beat["lease_expires_at"]) - datetime.now(UTC)
    assert 250 < left.total_seconds() <= 300  # no TTL resets to the default
    released = (await agent.ok("release", {"todo_id": todo_id}))["todo"]
    assert released["state"] == "pending" and released["owner"] is None
    # Another endpoint never sees this endpoint's todo.
    other = await stack.agent()
    for verb in ("get_todo", "claim", "heartbeat", "complete", "fail", "release"):
        resp = await other.call(verb, {"todo_id": todo_id})
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", verb
    assert (await agent.call("claim", {"todo_id": "td_nope"})).status_code == 404


async def test_scope_is_enforced_before_any_change(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"], verbs=["list_todos", "claim", "claim_next", "get_todo"])
    [todo_id] = seed_todos(stack, agent.endpoint_id, 1)
    [outside] = seed_todos(stack, agent.endpoint_id, 1, queue="secret")
    await agent.ok("claim", {"todo_id": todo_id})
    resp = await agent.call("complete", {"todo_id": todo_id})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden"
    assert stack.sql("SELECT state FROM todos WHERE id = %s", todo_id)[0][0] == "claimed"
    resp = await agent.call("claim", {"todo_id": outside})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden"
    assert stack.sql("SELECT state FROM todos WHERE id = %s", outside)[0][0] == "pending"
    assert (await agent.call("list_todos", {"queue": "secret"})).status_code == 403
    assert (await agent.call("claim_next", {"queue": "secret"})).status_code == 403
    listed = await agent.ok("list_todos", {})
    assert [t["id"] for t in listed["todos"]] == [todo_id]
    assert (await agent.ok("claim_next", {})) == {"empty": True, "todo": None}


async def test_missing_and_revoked_credentials_are_unauthenticated(stack: Stack) -> None:
    agent = await stack.agent()
    [todo_id] = seed_todos(stack, agent.endpoint_id, 1)
    resp = await stack.http.post("/v1/claim", json={"todo_id": todo_id})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthenticated"
    resp = await stack.http.post("/v1/claim", content=b"{not json", headers={"Authorization": "Bearer sbk_" + "0" * 64})
    assert resp.status_code == 401
    assert (await agent.ok("whoami"))["endpoint_id"] == agent.endpoint_id
    await stack.admin("revoke_endpoint", {"endpoint_id": agent.endpoint_id})
    resp = await agent.call("claim", {"todo_id": todo_id})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthenticated"
    assert stack.sql("SELECT state FROM todos WHERE id = %s", todo_id)[0][0] == "pending"


async def test_bad_input_gets_invalid_argument(stack: Stack) -> None:
    agent = await stack.agent()
    resp = await agent.call("claim", {"todo_id": 5, "surprise": True})
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument"
    resp = await stack.http.post(
        "/v1/claim",
        content=b"{oops",
        headers={"Authorization": f"Bearer {agent.credential}", "Content-Type": "application/json"},
    )
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument"
    resp = await agent.call("list_todos", {"limit": 0})
    assert resp.status_code == 422
    resp = await stack.http.post(
        "/v1/claim",
        content=b"x" * (1024 * 1024 + 10),
        headers={"Authorization": f"Bearer {agent.credential}"},
    )
    assert resp.status_code == 413


async def test_a_refused_transition_names_the_todo_state(stack: Stack) -> None:
    agent = await stack.agent()
    [todo_id] = seed_todos(stack, agent.endpoint_id, 1)
    resp = await agent.call("complete", {"todo_id": todo_id})
    assert resp.status_code == 409 and resp.json()["error"] == {
        "code": "conflict",
        "message": "todo is pending, not claimed",
    }
    await agent.ok("claim", {"todo_id": todo_id})
    await agent.ok("complete", {"todo_id": todo_id})
    for verb in ("complete", "fail", "heartbeat", "release"):
        resp = await agent.call(verb, {"todo_id": todo_id})
        assert resp.status_code == 409, verb
        assert resp.json()["error"] == {"code": "conflict", "message": "todo is done, not claimed"}, verb
    resp = await agent.call("claim", {"todo_id": todo_id})
    assert resp.status_code == 409 and resp.json()["error"]["message"] == "todo is done, not pending"
    assert stack.sql("SELECT state FROM todos WHERE id = %s", todo_id)[0][0] == "done"


def _state(stack: Stack, todo_id: str) -> tuple[Any, ...]:
    return stack.sql("SELECT state, attempt, next_retry_at IS NULL, owner FROM todos WHERE id = %s", todo_id)[0]


async def _dead_letter(stack: Stack, agent: Agent, todo_id: str) -> None:
    stack.sql("UPDATE todos SET attempt = 4 WHERE id = %s", todo_id)
    await agent.ok("claim", {"todo_id": todo_id})
    dead = (await agent.ok("fail", {"todo_id": todo_id, "error": "gave up"}))["todo"]
    assert dead["state"] == "failed" and dead["next_retry_at"] is None and dead["attempt"] == 5


async def test_retry_todo_returns_a_parked_retry_now_keeping_its_attempts(stack: Stack) -> None:
    agent = await stack.agent()
    [todo_id] = seed_todos(stack, agent.endpoint_id, 1)
    await agent.ok("claim", {"todo_id": todo_id})
    await agent.ok("claim", {"todo_id": seed_todos(stack, agent.endpoint_id, 1)[0]})
    parked = (await agent.ok("fail", {"todo_id": todo_id, "error": "flaky"}))["todo"]
    assert parked["next_retry_at"] is not None
    retried = (await agent.ok("retry_todo", {"todo_id": todo_id}))["todo"]
    assert retried["state"] == "pending" and retried["next_retry_at"] is None and retried["owner"] is None
    assert retried["attempt"] == 1  # only the wait is skipped: the budget goes on
    assert retried["last_error"] == "flaky"  # kept until the next fail or complete replaces it
    again = (await agent.ok("claim_next", {"queue": "work"}))["todo"]
    assert again["id"] == todo_id and again["attempt"] == 2


async def test_retry_todo_gives_a_dead_letter_a_fresh_attempt_budget(stack: Stack) -> None:
    agent = await stack.agent()
    [todo_id] = seed_todos(stack, agent.endpoint_id, 1)
    await _dead_letter(stack, agent, todo_id)
    retried = (await agent.ok("retry_todo", {"todo_id": todo_id}))["todo"]
    assert retried["state"] == "pending" and retried["attempt"] == 0 and retried["max_attempts"] == 5
    assert retried["last_error"] == "gave up"
    # A fresh budget: the backoff starts again at 30 s and the cap is five claims away.
    await agent.ok("claim", {"todo_id": todo_id})
    failed = (await agent.ok("fail", {"todo_id": todo_id}))["todo"]
    wait = datetime.fromisoformat(failed["next_retry_at"]) - datetime.fromisoformat(failed["updated_at"])
    assert failed["attempt"] == 1 and abs(wait.total_seconds() - 30) < 2
    # A lease that expired at the cap is a dead letter too, and comes back the same way.
    stack.sql("UPDATE todos SET state = 'pending', next_retry_at = NULL, attempt = 4 WHERE id = %s", todo_id)
    await agent.ok("claim", {"todo_id": todo_id})
    stack.sql("UPDATE todos SET lease_expires_at = now() - interval '1 second' WHERE id = %s", todo_id)
    assert (await reap(stack))["dead_lettered"] == 1
    assert (await agent.ok("retry_todo", {"todo_id": todo_id}))["todo"]["attempt"] == 0


async def test_retry_todo_conflicts_and_scope(stack: Stack) -> None:
    agent = await stack.agent(queues=["work", "other"])
    pending, claimed, done, canceled = seed_todos(stack, agent.endpoint_id, 4)
    await agent.ok("claim", {"todo_id": claimed})
    await agent.ok("claim", {"todo_id": done})
    await agent.ok("complete", {"todo_id": done})
    await agent.ok("cancel_todo", {"todo_id": canceled})
    for todo_id, state in ((pending, "pending"), (claimed, "claimed"), (done, "done"), (canceled, "canceled")):
        resp = await agent.call("retry_todo", {"todo_id": todo_id})
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "conflict", state
        assert state in resp.json()["error"]["message"]
        assert stack.sql("SELECT state FROM todos WHERE id = %s", todo_id)[0][0] == state
    # Another endpoint's failed todo and an unknown id are the same not_found; a queue outside scope is forbidden.
    other = await stack.agent()
    [theirs] = seed_todos(stack, other.endpoint_id, 1)
    stack.sql("UPDATE todos SET state = 'failed' WHERE id = %s", theirs)
    for todo_id in (theirs, "td_nope"):
        resp = await agent.call("retry_todo", {"todo_id": todo_id})
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert stack.sql("SELECT state FROM todos WHERE id = %s", theirs)[0][0] == "failed"
    narrow = await stack.agent(agent.human_id, queues=["work"])
    [outside] = seed_todos(stack, narrow.endpoint_id, 1, queue="secret")
    stack.sql("UPDATE todos SET state = 'failed' WHERE id = %s", outside)
    resp = await narrow.call("retry_todo", {"todo_id": outside})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden"
    assert stack.sql("SELECT state FROM todos WHERE id = %s", outside)[0][0] == "failed"
    limited = await stack.agent(verbs=["claim", "fail"])
    resp = await limited.call("retry_todo", {"todo_id": "td_nope"})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden"


async def test_a_dead_letter_is_not_retried_while_another_live_todo_of_its_delivery_holds_the_slot(
    stack: Stack,
) -> None:
    agent = await stack.agent()
    [first] = seed_todos(stack, agent.endpoint_id, 1)
    await _dead_letter(stack, agent, first)
    # The dead letter gave its slot back; a re-route of the same delivery minted a new live todo into it.
    [second] = seed_todos(stack, agent.endpoint_id, 1)
    stack.sql("UPDATE todos SET idempotency_key = %s WHERE id = %s", first, second)
    resp = await agent.call("retry_todo", {"todo_id": first})
    assert resp.status_code == 409 and second in resp.json()["error"]["message"]
    assert _state(stack, first)[:2] == ("failed", 5)
    # Once the live one is finished the slot is free again.
    await agent.ok("cancel_todo", {"todo_id": second})
    assert (await agent.ok("retry_todo", {"todo_id": first}))["todo"]["state"] == "pending"


async def test_concurrent_retries_of_two_dead_letters_of_one_delivery_revive_one(stack: Stack) -> None:
    agent = await stack.agent()
    first, second = seed_todos(stack, agent.endpoint_id, 2)
    stack.sql(
        "UPDATE todos SET state = 'failed', attempt = 5, next_retry_at = NULL WHERE id = ANY(%s)", [first, second]
    )
    stack.sql("UPDATE todos SET idempotency_key = 'same-delivery' WHERE id = ANY(%s)", [first, second])
    results = await asyncio.gather(
        *(agent.call("retry_todo", {"todo_id": t}) for t in (first, second) for _ in range(3))
    )
    assert sorted(r.status_code for r in results) == [200] + [409] * 5
    assert stack.sql("SELECT count(*) FROM todos WHERE state = 'pending'")[0][0] == 1


async def test_cancel_todo_transitions_and_conflicts(stack: Stack) -> None:
    agent = await stack.agent()
    pending, parked, dead, claimed, done = seed_todos(stack, agent.endpoint_id, 5)
    await agent.ok("claim", {"todo_id": parked})
    await agent.ok("fail", {"todo_id": parked})
    await _dead_letter(stack, agent, dead)
    await agent.ok("claim", {"todo_id": done})
    await agent.ok("complete", {"todo_id": done})
    await agent.ok("claim", {"todo_id": claimed})

    out = (await agent.ok("cancel_todo", {"todo_id": pending, "reason": "duplicate of td_other"}))["todo"]
    assert out["state"] == "canceled" and out["cancel_reason"] == "duplicate of td_other"
    assert out["completed_at"] is not None
    for todo_id in (parked, dead):
        out = (await agent.ok("cancel_todo", {"todo_id": todo_id}))["todo"]
        assert out["state"] == "canceled" and out["next_retry_at"] is None and out["cancel_reason"] is None
    # A parked retry that was canceled is never brought back by the reaper.
    stack.sql("UPDATE todos SET next_retry_at = now() - interval '1 second' WHERE id = %s", parked)
    assert (await reap(stack))["retried"] == 0
    for todo_id, state in ((claimed, "claimed"), (done, "done"), (pending, "canceled")):
        resp = await agent.call("cancel_todo", {"todo_id": todo_id})
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "conflict"
        assert state in resp.json()["error"]["message"]
        assert stack.sql("SELECT state FROM todos WHERE id = %s", todo_id)[0][0] == state
    assert (await agent.ok("claim_next", {})) == {"empty": True, "todo": None}
    other = await stack.agent()
    [theirs] = seed_todos(stack, other.endpoint_id, 1)
    for todo_id in (theirs, "td_nope"):
        resp = await agent.call("cancel_todo", {"todo_id": todo_id})
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert stack.sql("SELECT state FROM todos WHERE id = %s", theirs)[0][0] == "pending"
    resp = await agent.call("cancel_todo", {"todo_id": theirs, "reason": "x" * 4001})
    assert resp.status_code == 422


async def test_list_todos_pages_cover_every_todo_once_newest_first(stack: Stack) -> None:
    agent = await stack.agent()
    ids = seed_todos(stack, agent.endpoint_id, 23)
    # Todos minted by one delivery share created_at; the id breaks the tie.
    stack.sql("UPDATE todos SET created_at = (SELECT min(created_at) FROM todos) WHERE id = ANY(%s)", ids[:4])
    expected = [r[0] for r in stack.sql("SELECT id FROM todos ORDER BY created_at DESC, id DESC")]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        body: dict[str, Any] = {"limit": 5}
        if cursor:
            body["cursor"] = cursor
        page = await agent.ok("list_todos", body)
        pages += 1
        seen.extend(t["id"] for t in page["todos"])
        cursor = page.get("next_cursor")
        if not cursor:
            break
        assert len(page["todos"]) == 5
        if pages == 2:
            seed_todos(stack, agent.endpoint_id, 1)  # newer than the cursor: later pages do not shift
    assert seen == expected and pages == 5
    # Filters hold across pages.
    await agent.ok("claim", {"todo_id": ids[0]})
    await agent.ok("claim", {"todo_id": ids[1]})
    first = await agent.ok("list_todos", {"state": "claimed", "limit": 1})
    second = await agent.ok("list_todos", {"state": "claimed", "limit": 1, "cursor": first["next_cursor"]})
    assert {first["todos"][0]["id"], second["todos"][0]["id"]} == {ids[0], ids[1]}
    assert second.get("next_cursor") is None
    everything = await agent.ok("list_todos", {"limit": 500})
    assert len(everything["todos"]) == 24 and everything.get("next_cursor") is None
    for bad in ("!!!", base64.urlsafe_b64encode(b"garbage").decode()):
        resp = await agent.call("list_todos", {"cursor": bad})
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument"


async def test_list_todos_pages_past_500(stack: Stack) -> None:
    agent = await stack.agent()
    stack.sql(
        "INSERT INTO todos (id, endpoint_id, queue, source, title, idempotency_key)"
        " SELECT 'td_bulk' || lpad(g::text, 5, '0'), %s, 'work', 'generic', 't', 'k' || g FROM generate_series(1, 1203) g",
        agent.endpoint_id,
    )
    seen: set[str] = set()
    cursor = None
    while True:
        page = await agent.ok("list_todos", {"limit": 500, **({"cursor": cursor} if cursor else {})})
        seen.update(t["id"] for t in page["todos"])
        cursor = page.get("next_cursor")
        if not cursor:
            break
    assert len(seen) == 1203


async def test_claim_next_with_max_claims_the_oldest_in_one_call_each_with_its_lease(stack: Stack) -> None:
    agent = await stack.agent(queues=["work", "other"])
    ids = seed_todos(stack, agent.endpoint_id, 5)
    [elsewhere] = seed_todos(stack, agent.endpoint_id, 1, queue="other")
    out = await agent.ok("claim_next", {"max": 3, "queue": "work", "lease_seconds": 120})
    assert out["empty"] is False and out["todo"] is None
    assert [t["id"] for t in out["todos"]] == ids[:3]  # oldest first
    for todo in out["todos"]:
        assert todo["state"] == "claimed" and todo["attempt"] == 1 and todo["owner"] == f"agent:{agent.agent_id}"
        lease = datetime.fromisoformat(todo["lease_expires_at"]) - datetime.fromisoformat(todo["claimed_at"])
        assert timedelta(seconds=110) < lease <= timedelta(seconds=121)
    rows = dict(stack.sql("SELECT id, state FROM todos WHERE endpoint_id = %s", agent.endpoint_id))
    assert [rows[i] for i in ids] == ["claimed"] * 3 + ["pending"] * 2 and rows[elsewhere] == "pending"
    # Fewer left than asked: what there is; then empty, with an empty list (never the single form's todo).
    rest = await agent.ok("claim_next", {"max": 50, "queue": "work"})
    assert [t["id"] for t in rest["todos"]] == ids[3:]
    assert await agent.ok("claim_next", {"max": 2, "queue": "work"}) == {"empty": True, "todo": None, "todos": []}
    # Each batch-claimed todo is held like any other: complete works, heartbeat extends only its own lease.
    assert (await agent.ok("complete", {"todo_id": ids[0]}))["todo"]["state"] == "done"
    assert (await agent.ok("heartbeat", {"todo_id": ids[1], "lease_seconds": 600}))["todo"]["id"] == ids[1]
    # Without max the answer keeps its old shape.
    assert set(await agent.ok("claim_next", {})) == {"empty", "todo"}


async def test_claim_next_max_is_bounded_and_scoped(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    ids = seed_todos(stack, agent.endpoint_id, 2)
    outsider = await stack.agent(queues=["work"])
    seed_todos(stack, outsider.endpoint_id, 2)
    for bad in (0, 51, -1, 2.5):
        resp = await agent.call("claim_next", {"max": bad})
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument", bad
    resp = await agent.call("claim_next", {"max": 5, "queue": "secret"})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden"
    assert stack.sql("SELECT count(*) FROM todos WHERE state = 'claimed'")[0][0] == 0
    # Another endpoint's todos in a queue of the same name are never claimed.
    out = await agent.ok("claim_next", {"max": 10})
    assert sorted(t["id"] for t in out["todos"]) == sorted(ids)
    assert (
        stack.sql("SELECT count(*) FROM todos WHERE endpoint_id = %s AND state = 'pending'", outsider.endpoint_id)[0][0]
        == 2
    )


async def test_batch_claimers_never_overlap_and_a_lapsed_batch_lease_is_reaped(stack: Stack) -> None:
    agent = await stack.agent()
    twin = Agent(
        stack.http,
        {"endpoint_id": agent.endpoint_id, "agent_id": agent.agent_id, "credential": agent.credential},
        agent.human_id,
    )
    ids = seed_todos(stack, agent.endpoint_id, 120)

    async def drain(a: Agent) -> list[str]:
        got: list[str] = []
        while True:
            out = await a.ok("claim_next", {"max": 7})
            if out["empty"]:
                return got
            got.extend(t["id"] for t in out["todos"])

    first, second = await asyncio.gather(drain(agent), drain(twin))
    assert sorted(first + second) == sorted(ids) and not set(first) & set(second)
    # A batch's leases lapse like single ones: the reaper requeues every one of them.
    stack.sql(
        "UPDATE todos SET lease_expires_at = now() - interval '1 second' WHERE endpoint_id = %s", agent.endpoint_id
    )
    assert (await reap(stack))["requeued"] == 120
    again = await agent.ok("claim_next", {"max": 50})
    assert len(again["todos"]) == 50 and all(t["attempt"] == 2 for t in again["todos"])

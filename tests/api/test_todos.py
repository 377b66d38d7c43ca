"""Drain verbs against the real queue: claims, leases, retries, scope and authentication."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

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

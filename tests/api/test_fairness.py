"""Tenants cannot starve each other's rules: evaluation capacity is admitted by Temporal, fairly per endpoint."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY
from temporalio.testing import WorkflowEnvironment

from routing.sandbox import SandboxPool
from store.db import open_pool
from tests.conftest import Agent, Stack, running_stack
from tests.helpers import NoFreeChild, eventually, issue_payload, post_github
from worker import build_worker

# About 30 ms of libjq work on an idle core, under the 50 ms rule timeout; 32 of them spend a whole event
# budget, so every flooding delivery holds a sandbox child as long as a delivery can.
SLOW = "[range(40000)] | length < 0"
SENDERS = 16


def outcomes(stack: Stack, webhook_id: str) -> list[tuple[str, dict[str, Any], list[str]]]:
    """(disposition, trace, todo queues) of every event of the webhook."""
    rows = stack.sql(
        "SELECT e.disposition, e.routing_trace, ARRAY(SELECT t.queue FROM todos t WHERE t.event_id = e.id)"
        " FROM events e WHERE e.webhook_id = %s",
        webhook_id,
    )
    return [(r[0], r[1], list(r[2])) for r in rows]


def causes(trace: dict[str, Any]) -> set[str]:
    return {fault["cause"] for fault in trace.get("faults", [])}


async def tenant(stack: Stack, name: str, lane: str, rules: list[dict[str, Any]]) -> tuple[Agent, dict[str, Any]]:
    """A human of its own, one endpoint, one GitHub webhook whose target queue is the default, with rules."""
    agent = await stack.agent(await stack.human(name), queues=["work", lane])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": rules})
    return agent, webhook


async def send(stack: Stack, webhook: dict[str, Any], count: int, tag: str) -> None:
    """Post count deliveries one after another; each is accepted (answered or pending, never refused)."""
    for n in range(count):
        resp = await post_github(stack.http, webhook, issue_payload(number=n), delivery=f"{tag}-{n}-{uuid.uuid4()}")
        assert resp.status_code == 202, resp.text


async def flood(stack: Stack, webhook: dict[str, Any], per_sender: int) -> None:
    await asyncio.gather(*(send(stack, webhook, per_sender, f"flood-{s}") for s in range(SENDERS)))


B_RULES = [{"id": "b-match", "expr": '.kind == "issues"', "action": {"queue": "b-lane"}}]


def assert_all_followed_b_rule(stack: Stack, webhook_id: str, count: int) -> None:
    got = outcomes(stack, webhook_id)
    assert len(got) == count
    for disposition, trace, queues in got:
        assert disposition == "routed" and trace["stage"] == "rule" and trace["rule_id"] == "b-match", trace
        assert "faults" not in trace and queues == ["b-lane"]


@pytest.fixture
async def roomy_stack(tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment) -> AsyncIterator[Stack]:
    """The stack with rule clocks a loaded machine cannot trip (500 ms per rule and per event): each flooding
    delivery holds its child for the whole budget, and B's one cheap rule can only miss by not being admitted
    (a CPU-starved child timing out a 50 ms rule is the sandbox's concern, tested with the sandbox)."""
    roomy = SandboxPool(max_children=2, rule_timeout=0.5, event_budget=0.5, hard_deadline=5.0)
    try:
        async with running_stack(tmp_path, database_url, temporal_env.client, roomy) as stack:
            yield stack
    finally:
        await roomy.close()


async def test_a_flooding_endpoint_does_not_change_where_another_endpoints_deliveries_go(roomy_stack: Stack) -> None:
    stack = roomy_stack
    slow_rules = [{"id": f"slow-{i}", "expr": SLOW, "action": {"drop": True}} for i in range(32)]
    a_agent, a_hook = await tenant(stack, "alice", "a-lane", slow_rules)
    _, b_hook = await tenant(stack, "bob", "b-lane", B_RULES)

    # Phase 1: A floods from 16 concurrent senders while B delivers 8, one after another. With the default
    # evaluate path (local first), what the two children cannot take at once overflows to the fair queue.
    queued = REGISTRY.get_sample_value("switchboard_evaluations_total", {"path": "queue"}) or 0.0
    a_flood = asyncio.create_task(flood(stack, a_hook, per_sender=1))
    await eventually(lambda: len(outcomes(stack, a_hook["webhook_id"])) >= 2, timeout=90)  # the flood is evaluating
    await send(stack, b_hook, 8, "b1")
    await a_flood
    await eventually(lambda: len(outcomes(stack, b_hook["webhook_id"])) == 8, timeout=90)
    assert_all_followed_b_rule(stack, b_hook["webhook_id"], 8)
    await eventually(lambda: len(outcomes(stack, a_hook["webhook_id"])) == SENDERS, timeout=90)
    assert (REGISTRY.get_sample_value("switchboard_evaluations_total", {"path": "queue"}) or 0.0) > queued
    for _, trace, _ in outcomes(stack, a_hook["webhook_id"]):
        # A spends its own budget (its own faults), but it was never refused a sandbox.
        assert "sandbox_busy" not in causes(trace), trace

    # Phase 2: six concurrent backtests of A's slow rules over its stored events while B delivers 8 more.
    backtests = [
        asyncio.create_task(a_agent.call("backtest_webhook_rules", {"webhook_id": a_hook["webhook_id"], "limit": 2}))
        for _ in range(6)
    ]
    await send(stack, b_hook, 8, "b2")
    for resp in await asyncio.gather(*backtests):
        assert resp.status_code == 200, resp.text
        assert resp.json()["summary"]["events"] == 2
    await eventually(lambda: len(outcomes(stack, b_hook["webhook_id"])) == 16, timeout=90)
    assert_all_followed_b_rule(stack, b_hook["webhook_id"], 16)


async def test_a_flood_queues_in_temporal_and_every_delivery_still_gets_its_rule(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment
) -> None:
    # Rule clocks generous enough that a loaded machine cannot fault these rules: the only way a delivery could
    # miss its rule here is not being admitted to a sandbox child (sandbox_busy, the old 1 s local wait).
    roomy = SandboxPool(max_children=2, rule_timeout=2.0, event_budget=10.0, hard_deadline=20.0)
    try:
        async with running_stack(tmp_path, database_url, temporal_env.client, roomy) as stack:
            # Three slow rules (about 100 ms a delivery) then the match: 48 deliveries, 16 at a time, two children.
            rules = [{"id": f"slow-{i}", "expr": SLOW, "action": {"drop": True}} for i in range(3)]
            rules.append({"id": "a-match", "expr": '.kind == "issues"', "action": {"queue": "a-lane"}})
            _, a_hook = await tenant(stack, "alice", "a-lane", rules)
            await flood(stack, a_hook, per_sender=3)
            await eventually(lambda: len(outcomes(stack, a_hook["webhook_id"])) == 3 * SENDERS, timeout=90)
            for disposition, trace, queues in outcomes(stack, a_hook["webhook_id"]):
                assert disposition == "routed" and trace.get("rule_id") == "a-match", trace
                assert queues == ["a-lane"] and "faults" not in trace, trace
    finally:
        await roomy.close()


async def test_an_evaluation_no_worker_starts_in_time_faults_as_sandbox_busy(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    client = temporal_env.client
    async with running_stack(tmp_path, database_url, client, sandbox, with_worker=False) as stack:
        stack.settings.evaluate_queue_seconds = 1.0
        _, hook = await tenant(stack, "bob", "b-lane", B_RULES)
        pool = await open_pool(database_url, max_size=4)
        try:
            # Only the workflow worker runs, its children all busy: nothing polls the evaluate queue (a stuck or
            # absent evaluate worker).
            busy = cast(Any, NoFreeChild(sandbox))
            workers = build_worker(client, pool, stack.settings, task_queue=stack.settings.task_queue, sandbox=busy)
            async with workers.main:
                await send(stack, hook, 1, "stuck")
                await eventually(lambda: len(outcomes(stack, hook["webhook_id"])) == 1, timeout=90)
        finally:
            await pool.close()
        [(disposition, trace, queues)] = outcomes(stack, hook["webhook_id"])
        [fault] = trace["faults"]
        assert fault["cause"] == "sandbox_busy" and fault["rule_index"] == -1
        # on_fault "continue" (the default): no rule matched, the default (the target queue) decided.
        assert trace["stage"] == "default" and queues == ["work"] and disposition == "routed"


class BrokenSandbox:
    """A sandbox whose every evaluation raises: each attempt of the evaluate activity fails."""

    slots = 2

    async def evaluate(self, *_: Any) -> Any:
        raise RuntimeError("sandbox exploded")


async def test_an_evaluation_that_fails_every_attempt_is_decided_as_sandbox_failure(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment
) -> None:
    async with running_stack(tmp_path, database_url, temporal_env.client, BrokenSandbox()) as stack:
        _, hook = await tenant(stack, "bob", "b-lane", B_RULES)
        await send(stack, hook, 1, "broken")
        await eventually(lambda: len(outcomes(stack, hook["webhook_id"])) == 1, timeout=90)
        [(disposition, trace, queues)] = outcomes(stack, hook["webhook_id"])
        [fault] = trace["faults"]
        assert fault["cause"] == "sandbox_failure" and "sandbox exploded" in fault["detail"]
        assert trace["stage"] == "default" and queues == ["work"] and disposition == "routed"


async def test_a_delivery_run_starts_with_its_endpoint_as_fairness_key(stack: Stack) -> None:
    from routing.delivery import workflow_id_for

    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    resp = await post_github(stack.http, webhook, issue_payload(), delivery="fair-start-1")
    assert resp.status_code == 202
    handle = stack.temporal.get_workflow_handle(
        workflow_id_for(webhook["webhook_id"], f"{webhook['webhook_id']}:fair-start-1")
    )
    # The run's workflow tasks that go through matching are fair across endpoints, as its evaluations are.
    info = (await handle.describe()).raw_description.workflow_execution_info
    assert info.priority.fairness_key == agent.endpoint_id

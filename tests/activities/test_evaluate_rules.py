"""The evaluate_rules activity: the sandbox's verdict passed through, heartbeats while it runs, faults when absent."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.models import QueuedEvaluateInput
from activities.route import RouteActivities
from routing.models import Evaluation
from routing.router import RuleEvaluator
from store.commits import CommitStore
from store.crypto import SecretBox
from store.db import open_pool
from store.webhooks import WebhookStore
from tests.helpers import delivery_input, eventually

DELIVERY = delivery_input(b'{"issue": {"number": 7}}')
RULES = [{"id": "any", "expr": "true", "action": {"queue": "work"}}]


async def _activities(database_url: str, sandbox: RuleEvaluator | None) -> tuple[RouteActivities, Any]:
    pool = await open_pool(database_url, max_size=1)
    return RouteActivities(WebhookStore(pool, SecretBox("0" * 64)), CommitStore(pool), sandbox), pool


class SlowSandbox:
    """Answers only when released, so the activity's wait can be watched."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def evaluate(self, *_: Any) -> Evaluation:
        await self.release.wait()
        return Evaluation(matched_index=0)


async def test_the_sandbox_verdict_comes_back_as_the_activity_result(database_url: str, sandbox: Any) -> None:
    acts, pool = await _activities(database_url, sandbox)
    try:
        rules = [
            {"id": "never", "expr": ".payload.nope == 1", "action": {"drop": True}},
            {"id": "issues", "expr": '.kind == "issues"', "action": {"queue": "work"}},
        ]
        result = await ActivityEnvironment().run(
            acts.evaluate_rules, QueuedEvaluateInput(delivery=DELIVERY, rules=rules)
        )
        assert result == Evaluation(matched_index=1)
    finally:
        await pool.close()


async def test_no_rules_is_no_match_without_the_sandbox(database_url: str) -> None:
    acts, pool = await _activities(database_url, None)
    try:
        result = await ActivityEnvironment().run(acts.evaluate_rules, QueuedEvaluateInput(delivery=DELIVERY, rules=[]))
        assert result == Evaluation()
    finally:
        await pool.close()


async def test_without_a_sandbox_the_evaluation_is_a_sandbox_failure(database_url: str) -> None:
    acts, pool = await _activities(database_url, None)
    try:
        result = await ActivityEnvironment().run(
            acts.evaluate_rules, QueuedEvaluateInput(delivery=DELIVERY, rules=RULES)
        )
        assert result.matched_index is None
        assert [(f.rule_index, f.cause, f.detail) for f in result.faults] == [(-1, "sandbox_failure", "no sandbox")]
    finally:
        await pool.close()


async def test_a_running_evaluation_heartbeats(database_url: str) -> None:
    slow = SlowSandbox()
    acts, pool = await _activities(database_url, slow)
    try:
        beats: list[tuple[Any, ...]] = []
        env = ActivityEnvironment()
        env.on_heartbeat = lambda *details: beats.append(details)
        run = asyncio.ensure_future(env.run(acts.evaluate_rules, QueuedEvaluateInput(delivery=DELIVERY, rules=RULES)))
        # The activity looks every 0.5 s and heartbeats each time: Temporal's 3 s heartbeat timeout notices a
        # dead worker while a slow evaluation is still alive.
        await eventually(lambda: len(beats) >= 2)
        assert not run.done()
        slow.release.set()
        assert await run == Evaluation(matched_index=0)
    finally:
        await pool.close()

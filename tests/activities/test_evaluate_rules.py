"""The evaluate_rules activity: the sandbox's verdict passed through, heartbeats while it runs, faults when absent."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.route import RouteActivities
from routing.models import EvaluateInput, Evaluation
from routing.router import RuleEvaluator
from store.crypto import SecretBox
from store.db import open_pool
from store.deliveries import DeliveryStore
from store.webhooks import WebhookStore
from tests.helpers import eventually

ENVELOPE = {"kind": "issues", "payload": {"issue": {"number": 7}}}
RULES = [{"id": "any", "expr": "true", "action": {"queue": "work"}}]


async def _activities(database_url: str, sandbox: RuleEvaluator | None) -> tuple[RouteActivities, Any]:
    pool = await open_pool(database_url, max_size=1)
    return RouteActivities(WebhookStore(pool, SecretBox("0" * 64)), DeliveryStore(pool), sandbox), pool


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
        result = await ActivityEnvironment().run(acts.evaluate_rules, EvaluateInput(rules=rules, envelope=ENVELOPE))
        assert result == Evaluation(matched_index=1)
    finally:
        await pool.close()


async def test_no_rules_is_no_match_without_the_sandbox(database_url: str) -> None:
    acts, pool = await _activities(database_url, None)
    try:
        result = await ActivityEnvironment().run(acts.evaluate_rules, EvaluateInput(rules=[], envelope=ENVELOPE))
        assert result == Evaluation()
    finally:
        await pool.close()


async def test_without_a_sandbox_the_evaluation_is_a_sandbox_failure(database_url: str) -> None:
    acts, pool = await _activities(database_url, None)
    try:
        result = await ActivityEnvironment().run(acts.evaluate_rules, EvaluateInput(rules=RULES, envelope=ENVELOPE))
        assert result.matched_index is None
        assert [(f.rule_index, f.cause, f.detail) for f in result.faults] == [(-1, "sandbox_failure", "no sandbox")]
    finally:
        await pool.close()


async def test_a_running_evaluation_heartbeats_unless_it_is_a_local_activity(database_url: str) -> None:
    slow = SlowSandbox()
    acts, pool = await _activities(database_url, slow)
    try:
        beats: dict[bool, list[tuple[Any, ...]]] = {False: [], True: []}
        runs = []
        for local in (False, True):
            env = ActivityEnvironment()
            env.info = dataclasses.replace(env.info, is_local=local)
            env.on_heartbeat = lambda *details, seen=beats[local]: seen.append(details)
            runs.append(
                asyncio.ensure_future(env.run(acts.evaluate_rules, EvaluateInput(rules=RULES, envelope=ENVELOPE)))
            )
        # The activity looks every 0.5 s: a regular one heartbeats each time (Temporal's 3 s heartbeat timeout
        # notices a dead worker), a local one has no heartbeat to send. Both have looked twice once two came.
        await eventually(lambda: len(beats[False]) >= 2)
        assert beats[True] == []
        slow.release.set()
        assert await asyncio.gather(*runs) == [Evaluation(matched_index=0)] * 2
    finally:
        await pool.close()

"""Local first, fair overflow: which path a delivery's rules take, and that each path keeps its guarantees.

The fast path (SWITCHBOARD_EVALUATE=auto, the default) evaluates in a local activity on a free sandbox child of
the workflow's own worker; with no child free (or someone already waiting for one) it answers "not admitted"
at once and the run uses the fair evaluate queue as before. A worker killed mid local evaluation is noticed by
the workflow task timeout, and the next worker evaluates again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from activities.models import EvaluateHereInput, EvaluateHereResult
from activities.route import RouteActivities
from routing.delivery import CommitResult
from routing.models import EvaluateInput
from routing.sandbox import SandboxPool
from store.db import open_pool
from switchboard.settings import Settings
from tests.conftest import Stack, running_stack, worker_process_env
from tests.helpers import eventually, issue_payload, post_github
from tests.workflows.replay import handle_for, replayer
from worker import build_worker

RULES = [{"id": "issues", "expr": '.kind == "issues"', "action": {"queue": "work"}}]
ENVELOPE = {"source": "github", "kind": "issues", "payload": {"n": 1}}


def evaluations(path: str) -> float:
    return REGISTRY.get_sample_value("switchboard_evaluations_total", {"path": path}) or 0.0


def scheduled(history: WorkflowHistory) -> list[Any]:
    """The run's regular activities (the fast path schedules none)."""
    return [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def deliver(stack: Stack, delivery: str) -> tuple[dict[str, Any], WorkflowHistory]:
    agent = await stack.agent()
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": RULES})
    resp = await post_github(stack.http, hook, issue_payload(), delivery=delivery)
    assert resp.status_code == 202, resp.text
    handle = handle_for(stack, hook["webhook_id"], delivery)
    result = await handle.result()
    assert result.created == 1 and result.rule_id == "issues"
    history = await handle.fetch_history()
    await replayer().replay_workflow(history)
    return hook, history


async def test_an_idle_worker_evaluates_on_its_own_free_child(stack: Stack) -> None:
    local, queued = evaluations("local"), evaluations("queue")
    _, history = await deliver(stack, "idle-1")
    assert scheduled(history) == []
    assert (evaluations("local"), evaluations("queue")) == (local + 1, queued)
    # The operator sees the path in the UI: the local activity's summary says where it evaluated.
    summaries = [e.user_metadata.summary.data for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert any(b"on this worker, if a sandbox child is free" in s for s in summaries), summaries


async def test_no_free_child_overflows_to_the_fair_queue(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment
) -> None:
    pool = SandboxPool(max_children=1)
    try:
        async with running_stack(tmp_path, database_url, temporal_env.client, pool) as stack:
            agent = await stack.agent()
            hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
            await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": RULES})
            local, queued = evaluations("local"), evaluations("queue")
            await pool._slots.acquire()  # the one child is busy (another delivery's evaluation)
            try:
                stack.settings.ingest_wait_seconds = 0.5
                resp = await post_github(stack.http, hook, issue_payload(), delivery="busy-1")
                assert resp.status_code == 202, resp.text
                handle = handle_for(stack, hook["webhook_id"], "busy-1")

                async def queued_on_evaluate() -> list[Any]:
                    return scheduled(await handle.fetch_history())

                # Not admitted at once: the evaluation waits on the fair queue (with its endpoint's fairness key).
                [attrs] = await eventually(queued_on_evaluate, timeout=60)
                assert attrs.task_queue.name == f"{stack.settings.task_queue}-evaluate"
                assert attrs.priority.fairness_key == agent.endpoint_id
            finally:
                pool._slots.release()
            result: CommitResult = await handle.result()
            assert result.created == 1 and result.rule_id == "issues"
            assert (evaluations("local"), evaluations("queue")) == (local, queued + 1)
            history = await handle.fetch_history()
            summaries = [e.user_metadata.summary.data for e in history.events if e.HasField("user_metadata")]
            assert any(b"on the fair queue (no sandbox child was free)" in s for s in summaries), summaries
            await replayer().replay_workflow(history)
    finally:
        await pool.close()


async def test_forced_queue_mode_never_takes_the_fast_path(stack: Stack) -> None:
    stack.settings.evaluate = "queue"
    local, queued = evaluations("local"), evaluations("queue")
    _, history = await deliver(stack, "forced-queue-1")
    [attrs] = scheduled(history)
    assert attrs.heartbeat_timeout.ToSeconds() == 3  # the heartbeating regular activity, as before
    assert not [e for e in history.events if b"evaluate_rules_if_free" in e.SerializeToString()]
    assert (evaluations("local"), evaluations("queue")) == (local, queued + 1)


async def test_forced_local_mode_counts_as_local_forced(stack: Stack) -> None:
    stack.settings.evaluate = "local"
    forced = evaluations("local_forced")
    _, history = await deliver(stack, "forced-local-1")
    assert scheduled(history) == []
    assert evaluations("local_forced") == forced + 1


def test_the_evaluate_setting_and_its_older_name() -> None:
    assert Settings().evaluate_path() == "auto"
    assert Settings(evaluate="queue").evaluate_path() == "queue"
    assert Settings(evaluate_locally=True).evaluate_path() == "local"
    assert Settings(evaluate="local").evaluate_path() == "local"
    # Contradicting names, or a path that does not exist, refuse to start.
    with pytest.raises(ValidationError, match="contradicts"):
        Settings(evaluate_locally=True, evaluate="queue")
    with pytest.raises(ValidationError):
        Settings(evaluate="sometimes")  # type: ignore[arg-type]


class _Held:
    """A sandbox whose fast path holds until released, to see what the activity admits meanwhile."""

    slots = 2

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0

    async def evaluate(self, *_: Any, **__: Any) -> Any:
        raise AssertionError("not the queue path")

    async def evaluate_if_free(self, *_: Any) -> Any:
        from routing.models import Evaluation

        self.running += 1
        await self.release.wait()
        return Evaluation(matched_index=0)


async def test_one_endpoint_holds_at_most_its_cap_of_fast_path_evaluations() -> None:
    held = _Held()
    route = RouteActivities(None, None, held, local_per_endpoint=1)  # type: ignore[arg-type]
    rules = EvaluateInput(rules=RULES, envelope=ENVELOPE)

    async def here(endpoint: str) -> EvaluateHereResult:
        return await route.evaluate_rules_if_free(EvaluateHereInput(rules=rules, endpoint_id=endpoint))

    first = asyncio.create_task(here("ep_a"))
    await eventually(lambda: held.running == 1)
    # Endpoint A is at its cap: its next delivery spills to the fair queue; endpoint B still gets the fast path.
    assert (await here("ep_a")).admitted is False
    other = asyncio.create_task(here("ep_b"))
    await eventually(lambda: held.running == 2)
    held.release.set()
    assert (await first).admitted and (await other).admitted
    again = await here("ep_a")
    assert again.admitted  # the cap counts evaluations running, not evaluations made


async def test_a_worker_killed_mid_local_evaluation_is_replaced_and_nothing_is_lost(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    client = temporal_env.client
    async with running_stack(tmp_path, database_url, client, sandbox, with_worker=False) as stack:
        stack.settings.ingest_wait_seconds = 1.0
        agent = await stack.agent()
        hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
        await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": RULES})
        log = tmp_path / "worker.log"
        # The worker evaluates on the fast path (the default), then pauses before answering: it is killed there.
        env = worker_process_env(stack, tmp_path / "worker-home", SWITCHBOARD_FAULT_EVALUATE_DELAY="120")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "worker"], env=env, stdout=out, stderr=out, start_new_session=True
            )
        try:
            resp = await post_github(stack.http, hook, issue_payload(), delivery="killed-1")
            assert resp.status_code == 202 and resp.json()["pending"] is True
            workflow_id = resp.json()["workflow_id"]
            await eventually(lambda: b"fault injection: holding the local evaluation" in log.read_bytes(), timeout=60)
            assert stack.sql("SELECT count(*) FROM events")[0][0] == 0
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        killed_at = time.monotonic()
        pool = await open_pool(database_url, max_size=4)
        try:
            async with build_worker(
                client, pool, stack.settings, task_queue=stack.settings.task_queue, sandbox=sandbox
            ):
                handle = client.get_workflow_handle(workflow_id, result_type=CommitResult)
                result = await handle.result()
                detected = time.monotonic() - killed_at
                print(f"\nkilled mid local evaluation: the next worker finished the delivery {detected:.1f} s later")
                assert result.created == 1 and result.rule_id == "issues"
                again = await post_github(stack.http, hook, issue_payload(), delivery="killed-1")
                assert again.json()["duplicate"] is True
        finally:
            await pool.close()
        assert stack.sql("SELECT count(*) FROM events")[0][0] == 1
        assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1
        history = await handle.fetch_history()
        # The killed worker's workflow task timed out (the local path's dead-worker detection: the workflow task
        # timeout, 10 s by default) and the next worker evaluated the rules again on its own fast path. The
        # attempt that timed out is not in the history: nothing it did was ever recorded.
        assert scheduled(history) == []
        assert 5 < detected < 60
        await replayer().replay_workflow(history)
